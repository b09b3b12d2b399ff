"""DMQConsumer hands out records built as the application reaches them (issue 31): a batch handed
out in several polls, and an iteration left in the middle of a poll's records, still commit
exactly what was returned, over a real server."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import pytest

from dmq.client import AdminClient, DMQConsumer, Producer, TopicPartition
from dmq.client.cli.runner import ClusterThread
from dmq.client.records import RecordSequence

pytestmark = pytest.mark.timeout(120)

TIMEOUT_S = 15.0
FAST = {"heartbeat_interval_ms": 200, "session_timeout_ms": 3000, "retry_backoff_ms": 50}
COUNTS = {0: 100, 1: 50}  # records per partition, each partition one batch


@pytest.fixture
def server(cluster_factory: Callable[..., ClusterThread]) -> ClusterThread:
    cluster = cluster_factory(rebalance_debounce_ms=100)
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("t", 2)
    with Producer(cluster.bootstrap, linger_ms=60_000) as p:
        for partition, n in COUNTS.items():
            p.send_many("t", [b"%d-%d" % (partition, i) for i in range(n)], partition=partition)
        p.flush(TIMEOUT_S)
    return cluster


def everything() -> set[tuple[int, int]]:
    return {(p, o) for p, n in COUNTS.items() for o in range(n)}


def test_a_batch_handed_out_over_several_polls_commits_what_each_returned(server: ClusterThread) -> None:
    settings = dict(bootstrap_servers=server.bootstrap, group_id="g", max_poll_records=7,
                    enable_auto_commit=False, **FAST)
    got: dict[int, list[int]] = {0: [], 1: []}
    with DMQConsumer("t", **settings) as c:  # type: ignore[arg-type]
        deadline = time.monotonic() + TIMEOUT_S
        while sum(map(len, got.values())) < sum(COUNTS.values()):
            assert time.monotonic() < deadline, got
            records = c.poll(200)
            assert len(records) <= 7
            for tp, rs in records.items():
                assert isinstance(rs, RecordSequence)
                got[tp.partition] += [r.offset for r in rs]
                assert [r.value for r in rs] == [b"%d-%d" % (tp.partition, r.offset) for r in rs]
            c.commit_sync()
            for tp in records.partitions():
                assert c.committed(tp).offset == got[tp.partition][-1] + 1  # not the end of the batch
        assert got == {p: list(range(n)) for p, n in COUNTS.items()}


def test_leaving_an_iteration_mid_poll_commits_only_what_it_gave(server: ClusterThread) -> None:
    """One poll() brings both partitions' records; the loop leaves after 120 of the 150. The
    next consumer of the group gets exactly the other 30."""
    settings = dict(bootstrap_servers=server.bootstrap, group_id="g", consumer_timeout_ms=10_000, **FAST)
    with DMQConsumer("t", **settings) as c:  # type: ignore[arg-type]
        seen = [(msg.partition, msg.offset) for msg in itertools.islice(c, 120)]
        positions = {p: c.position(TopicPartition("t", p)) for p in COUNTS}
    with DMQConsumer("t", **settings) as c:  # type: ignore[arg-type]
        rest = [(msg.partition, msg.offset) for msg in itertools.islice(c, 30)]
    assert len(set(seen + rest)) == 150 and set(seen + rest) == everything()
    for p in COUNTS:
        assert positions[p] == max((o + 1 for q, o in seen if q == p), default=0)
