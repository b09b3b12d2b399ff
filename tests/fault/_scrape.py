"""Reading a server's /metrics in the fault tests (processes started with `--metrics-port auto`,
each printing "<who> metrics at <URL>" to its log)."""

from __future__ import annotations

import pathlib
import re
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

SCRAPE_TIMEOUT_S = 5.0

Samples = list[tuple[str, dict[str, str], float]]


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as answer:
        text = answer.read().decode()
    return [(s.name, dict(s.labels), s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def total(samples: Samples, name: str) -> float:
    return sum(v for n, _labels, v in samples if n == name)


def url_in(log: pathlib.Path, who: str) -> str:
    """The metrics URL `who` printed last (a restarted process appends to the same log)."""
    found = re.findall(rf"{who} metrics at (\S+)", log.read_text(errors="replace"))
    assert found, f"{who} printed no metrics URL"
    return str(found[-1])
