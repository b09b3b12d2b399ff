"""What the bench scripts share besides the servers (bench/_server.py): their command line, the
workload options most of them take, quiet logs, a percentile and an open-loop send schedule."""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Iterator

import structlog


def bench_parser(
    doc: str | None,
    *,
    records: int | None = None,
    partitions: int | None = None,
    runs: int | None = None,
    rounds: int | None = None,
    value_bytes: int | None = None,
) -> argparse.ArgumentParser:
    """The script's parser, its docstring as the --help text (laid out as written), with the
    workload options whose default is given: --records, --partitions, --runs (alternating runs),
    --rounds (the same, where the script's figures have always said rounds) and --value-bytes."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    options = {"records": records, "partitions": partitions, "runs": runs, "rounds": rounds, "value-bytes": value_bytes}
    for name, default in options.items():
        if default is not None:
            parser.add_argument(f"--{name}", type=int, default=default)
    return parser


def quiet_logs() -> None:
    """Warnings and up from structlog in this process (the client side of a bench would otherwise
    print a line per connection and rebalance into its figures)."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) of values by rank, no interpolation."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def paced(rate: float, total: int, step: int = 1) -> Iterator[int]:
    """0, step, 2*step, ... below total, each yielded no earlier than its due time (start + i / rate):
    an open-loop schedule, so a slow answer does not slow the sends that follow it."""
    start = time.perf_counter()
    for sent in range(0, total, step):
        delay = start + sent / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        yield sent
