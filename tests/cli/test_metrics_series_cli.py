"""`--metrics-max-partition-series` (issue 29 audit: the per-partition series bound had no option):
`dmq server` applies it, also through `--brokers N` to its coordinator and broker processes, and
bad values are refused naming the option and its range."""

from __future__ import annotations

import pathlib
import re
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dmq.client import AdminClient, Producer
from tests.cli.conftest import ServerProcess, wait_for
from tests.groups import commit_as_sole_member

TOPIC = "bounded"


def _samples(url: str) -> list[tuple[str, dict[str, str], float]]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    return [(s.name, dict(s.labels), s.value) for f in text_string_to_metric_families(text) for s in f.samples]


@pytest.mark.parametrize("brokers", [1, 2])
def test_server_bounds_partition_series(tmp_path: pathlib.Path, brokers: int) -> None:
    server = ServerProcess(tmp_path / "data", tmp_path / "server.log",
                           ("--brokers", str(brokers), "--metrics-port", "auto", "--metrics-max-partition-series", "1"))
    try:
        server.wait_ready()
        # one endpoint per process: the embedded server's, or the coordinator's and each broker's
        urls = wait_for(lambda: (found := re.findall(r"metrics at (http://\S+)", server.log_tail()))
                        and len(found) == (1 if brokers == 1 else 1 + brokers) and found, "the metrics URLs")
        with AdminClient(server.bootstrap) as admin:
            wait_for(lambda: sum(b.alive for b in admin.list_brokers()) == brokers, f"{brokers} brokers alive")
            admin.create_topic(TOPIC, 2, {"replication_factor": brokers})
        with Producer(server.bootstrap, linger_ms=0) as producer:
            for p in (0, 1):
                producer.send(TOPIC, b"v", partition=p)
            producer.flush(30)
        commit_as_sole_member(server.bootstrap, "app", TOPIC, {0: 0, 1: 1})
        samples = [s for url in urls for s in _samples(url)]
        # Two partitions per server > 1: each broker sums the topic into one series...
        sizes = [labels for name, labels, _v in samples if name == "dmq_log_size_bytes" and labels["topic"] == TOPIC]
        assert sizes and {labels["partition"] for labels in sizes} == {"*"}
        # ...and the coordinator keeps only the group's lag sum (1 + 0).
        group = f"G_{TOPIC}_app"
        assert not [s for s in samples if s[0] == "dmq_consumer_group_lag_records" and s[1]["group"] == group]
        assert [v for name, labels, v in samples
                if name == "dmq_consumer_group_lag_sum_records" and labels["group"] == group] == [1]
    finally:
        server.stop()


def test_metrics_max_partition_series_refusals(dmq_bare, tmp_path: pathlib.Path) -> None:  # type: ignore[no-untyped-def]
    from dmq.broker.metrics import DEFAULT_MAX_PARTITION_SERIES as BROKER_DEFAULT
    from dmq.client.cli.servers import DEFAULT_MAX_PARTITION_SERIES as CLI_DEFAULT
    from dmq.coordinator.metrics import DEFAULT_MAX_PARTITION_SERIES as COORDINATOR_DEFAULT

    assert CLI_DEFAULT == BROKER_DEFAULT == COORDINATOR_DEFAULT == 1000  # the CLI keeps its own copy
    high = dmq_bare("server", "--data-dir", str(tmp_path / "d"), "--metrics-max-partition-series", "100001")
    assert high.returncode == 2, high
    assert "--metrics-max-partition-series" in high.stderr and "0<=x<=100000" in high.stderr
    negative = dmq_bare("broker", "--coordinator", "127.0.0.1:1", "--broker-id", "0", "--data-dir",
                        str(tmp_path / "b"), "--metrics-port", "auto", "--metrics-max-partition-series", "-1")
    assert negative.returncode == 2, negative
    assert "--metrics-max-partition-series" in negative.stderr and "0<=x<=100000" in negative.stderr
    # Without an endpoint (the coordinator's default) it would be ignored: refused instead.
    unused = dmq_bare("coordinator", "--port", "0", "--data-dir", str(tmp_path / "c"),
                      "--metrics-max-partition-series", "5")
    assert unused.returncode == 2, unused
    assert "--metrics-max-partition-series is only used with a metrics endpoint" in unused.stderr
