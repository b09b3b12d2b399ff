"""Queue mode on three brokers over real gRPC: each leader leases its own partitions, the client
pops from every leader of the topic, dead letters cross brokers (the dead-letter partition lives on
one broker), and max_queue_size is enforced pro rata by each leader."""

from __future__ import annotations

import pytest

from dmq.client import AdminClient, Producer, QueueConsumer, SimpleConsumer
from dmq.client.cli.runner import ClusterThread
from dmq.client.errors import QueueFullError
from tests.integration._queue_helpers import WAIT_S, produce


def _produce(bootstrap: str, topic: str, partitions: int, per_partition: int) -> None:
    for part in range(partitions):
        produce(bootstrap, topic, [b"%d-%d" % (part, i) for i in range(per_partition)], part)


def test_the_client_pops_from_every_leader_and_dead_letters_cross_brokers(cluster3: ClusterThread) -> None:
    with AdminClient(cluster3.bootstrap) as admin:
        admin.create_topic("spread", 6)
        leaders = {p.leader_address for p in admin.describe_topic("spread").partitions}
    assert len(leaders) == 3
    _produce(cluster3.bootstrap, "spread", 6, 5)
    seen: dict[int, list[bytes]] = {}
    brokers = set()
    with QueueConsumer(cluster3.bootstrap, "spread", "g", max_records=10) as q:
        while (lease := q.pop(timeout=1)) is not None:
            brokers.add(lease.broker)
            q.reject(lease, lease.start_offset, "first of each partition")  # DLQ leader may be elsewhere
            q.ack(lease)
            seen.setdefault(lease.partition, []).extend(r.value for r in lease.records[1:])
    assert brokers == leaders
    assert sorted(seen) == list(range(6))
    assert all(v == [b"%d-%d" % (p, i) for i in range(1, 5)] for p, v in seen.items())
    with SimpleConsumer(cluster3.bootstrap) as c:
        dead = c.consume("spread.dlq", 0, 0, max_records=100)
    assert sorted(r.value for r in dead) == sorted(b"%d-0" % p for p in range(6))


def test_max_queue_size_is_enforced_by_each_leader_over_its_share(cluster3: ClusterThread) -> None:
    with AdminClient(cluster3.bootstrap) as admin:
        admin.create_topic("shares", 3, config={"max_queue_size": 30})
        assert len({p.leader_address for p in admin.describe_topic("shares").partitions}) == 3
    _produce(cluster3.bootstrap, "shares", 3, 10)  # each leader's share (30 x 1/3) is full now
    with Producer(cluster3.bootstrap, linger_ms=0) as p:
        for part in range(3):
            with pytest.raises(QueueFullError) as info:
                p.send("shares", b"over", partition=part).get(WAIT_S)
            assert (info.value.depth, info.value.limit, info.value.remaining) == (10, 10, 0)
    with AdminClient(cluster3.bootstrap) as admin:
        d = admin.describe_queue("shares")
    assert (d.depth, d.max_queue_size, d.remaining) == (30, 30, 0)
