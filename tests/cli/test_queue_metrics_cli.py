"""The queue gauges of a real `dmq server --metrics-port auto` against `dmq queues describe` (issue 29
item 1: queue depth, live leases and dead letters per queue group): a queue of two partitions, one
group holding a live lease (not acknowledged) after rejecting a record into the dead-letter topic,
a second group that acknowledged what it popped. Their depths differ whichever partitions they get,
so a gauge that mixed groups up cannot pass."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from dmq.client import AdminClient, Producer, QueueConsumer
from tests.cli.conftest import Dmq, ServerProcess

LEASE_MS = 120_000  # far longer than the test: the lease is live when the gauges are read


def _samples(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def _by(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, *keys: str) -> dict[tuple[str, ...], float]:
    return {tuple(labels[k] for k in keys): v for labels, v in samples.get(name, [])}


def test_queue_gauges_equal_dmq_queues_describe(metered_server: ServerProcess) -> None:
    url = metered_server.metrics_url()
    dmq = Dmq(metered_server.bootstrap)
    with AdminClient(metered_server.bootstrap) as admin:  # set up in process: each `dmq` run costs a second or more
        admin.create_topic("jobs", partitions=2, config={"max_queue_size": 100})
    with Producer(metered_server.bootstrap) as p:
        for part, count in ((0, 5), (1, 2)):
            for i in range(count):
                p.send("jobs", b"job-%d" % i, partition=part).get(30)
    # Whichever partitions the groups get, "idle" is left 3 or 0 records, "workers" 4 or 1.
    with QueueConsumer(metered_server.bootstrap, "jobs", "idle", max_records=2, lease_ms=LEASE_MS) as idle:
        first = idle.pop(timeout=10)
        assert first is not None and first.end_offset - first.start_offset == 2
        idle.ack(first)  # both records of its partition acknowledged; no lease left
    with QueueConsumer(metered_server.bootstrap, "jobs", "workers", max_records=2, lease_ms=LEASE_MS) as workers:
        lease = workers.pop(timeout=10)
        assert lease is not None
        workers.reject(lease, lease.start_offset, "bad input")  # to jobs.dlq; the lease stays live
        described = dmq.json("queues", "describe", "jobs")
        samples = _samples(url)
    assert described["dead_letters"] == 1
    depth_cli: dict[str, int] = {}
    leases_cli: dict[str, int] = {}
    for row in described["groups"]:
        depth_cli[row["group"]] = depth_cli.get(row["group"], 0) + row["pending"]
        leases_cli[row["group"]] = leases_cli.get(row["group"], 0) + (1 if row["lease"] else 0)
    assert leases_cli == {"idle": 0, "workers": 1}, described  # the setup did what it says
    assert depth_cli["idle"] != depth_cli["workers"], described
    depth = _by(samples, "dmq_queue_depth_records", "topic", "group")
    live = _by(samples, "dmq_queue_live_leases", "topic", "group")
    assert {g: depth[("jobs", g)] for g in depth_cli} == depth_cli
    assert {g: live[("jobs", g)] for g in leases_cli} == leases_cli
    assert _by(samples, "dmq_queue_dead_letters", "topic")[("jobs",)] == described["dead_letters"]
