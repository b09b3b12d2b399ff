"""Queue leases survive a leader failover (issue 15 item 6): three real brokers with RF 3 on
loopback, the test as controller (tests/integration/_replication_cluster.py), QueueConsumer clients
over real gRPC. A worker pops a lease; the leader changes (stopped, or leadership moved); then no
other worker gets the partition while the lease lives, the first worker's calls with its lease id
work at the new leader, and its records are not handed out again."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from dmq.broker.offsets import offsets_log_topic
from dmq.client import QueueConsumer
from dmq.client.errors import LeaseExpiredError
from dmq.proto import dmq_pb2 as pb
from dmq.proto import records
from tests.integration._replication_cluster import ReplicationCluster
from tests.integration._replication_cluster import rc as rc  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(60)


async def _produce(rc: ReplicationCluster, broker: int, values: list[bytes]) -> None:
    await rc.brokers[broker].stub.Produce(
        pb.ProduceRequest(topic="t", partition=0, batch=records.encode(values), acks=pb.ACKS_ALL), timeout=10)


async def _consumer(rc: ReplicationCluster, **kw) -> QueueConsumer:
    # The client is synchronous and the brokers run on this event loop: it works from a thread.
    kw.setdefault("max_records", 10)
    return await asyncio.to_thread(QueueConsumer, rc.controller_address, "t", "g", **kw)


@contextlib.asynccontextmanager
async def _two_workers(
    rc: ReplicationCluster, values: list[bytes], **first_kw: int
) -> AsyncIterator[tuple[QueueConsumer, QueueConsumer]]:
    """Topic t on brokers 1, 2, 3 (broker 1 leading) holding values, and two workers of group g:
    the first made with first_kw. Both closed on leaving."""
    await rc.create("t", [1, 2, 3])
    await _produce(rc, 1, values)
    first, second = await _consumer(rc, **first_kw), await _consumer(rc)
    try:
        yield first, second
    finally:
        await asyncio.to_thread(first.close)
        await asyncio.to_thread(second.close)


async def test_a_lease_outlives_its_leaders_death_and_is_acked_at_the_new_leader(rc: ReplicationCluster) -> None:
    async with _two_workers(rc, [b"a%d" % i for i in range(5)], lease_ms=30_000) as (first, second):
        lease = await asyncio.to_thread(first.pop, 5)
        assert lease is not None and (lease.start_offset, lease.end_offset) == (0, 5)
        # broker 1 dies; the controller elects broker 2 from the in-sync set
        await rc.stop_broker(1)
        await rc.push(rc.state("t", 0, 2, 1, [1, 2, 3], [2, 3], 1), [2, 3])
        # the lease lives at the new leader: nobody else of the group gets the partition
        assert await asyncio.to_thread(second.pop, 1) is None
        described = rc.brokers[2].node.queues.describe("t", "g").groups
        assert [(g.lease_id, g.lease_records) for g in described] == [(lease.lease_id, 5)]
        # the first worker's ack, by its lease id, is taken by the new leader
        assert await asyncio.to_thread(first.ack, lease) == 5
        # acknowledged: the records are not handed out again; the group goes on after them
        assert await asyncio.to_thread(second.pop, 0.5) is None
        await _produce(rc, 2, [b"b0", b"b1"])
        after = await asyncio.to_thread(second.pop, 5)
        assert after is not None and [r.value for r in after.records] == [b"b0", b"b1"]
        assert after.delivery_count == 0


@pytest.mark.slow
async def test_a_moved_lease_is_renewed_at_the_new_leader_and_expires_there_as_counted(rc: ReplicationCluster) -> None:
    async with _two_workers(rc, [b"x", b"y"], lease_ms=1_500) as (first, second):
        lease = await asyncio.to_thread(first.pop, 5)
        assert lease is not None
        # leadership moves to broker 3 while broker 1 stays (now a follower with a stale view)
        await rc.push(rc.state("t", 0, 3, 1, [1, 2, 3], [1, 2, 3], 1), [1, 2, 3])
        renewed_at = time.time()
        expiry_ms = await asyncio.to_thread(first.renew, lease, 2_000)
        assert expiry_ms >= renewed_at * 1000 + 1_900
        assert await asyncio.to_thread(second.pop, 1) is None  # past the grant's 1.5 s: the renewal holds it
        # never acked: the new leader's timer releases it at its expiry and counts the delivery
        again = await asyncio.to_thread(second.pop, 5)
        assert again is not None and time.time() * 1000 >= expiry_ms - 50
        assert [r.value for r in again.records] == [b"x", b"y"] and again.delivery_count == 1
        with pytest.raises(LeaseExpiredError, match="not live"):
            await asyncio.to_thread(first.ack, lease)  # taken over: refused, nothing changed
        assert await asyncio.to_thread(second.ack, again) == 2


async def test_an_ack_riding_on_a_pop_of_its_partition_is_one_write_and_its_next_lease_moves_too(
    rc: ReplicationCluster,
) -> None:
    async with _two_workers(rc, [b"v%d" % i for i in range(6)], max_records=2) as (first, second):
        lease = await asyncio.to_thread(first.pop, 5)
        assert lease is not None and (lease.start_offset, lease.end_offset) == (0, 2)
        offsets_log = rc.brokers[1].node.logs.get(offsets_log_topic("t"), 0)
        before = offsets_log.log_end_offset
        # the ack rides on a pop that takes the same partition again: handed over in one batch
        nxt = await asyncio.to_thread(lambda: first.pop(5, ack=lease))
        assert nxt is not None and [r.value for r in nxt.records] == [b"v2", b"v3"] and nxt.delivery_count == 0
        (batch,) = records.decode_batches(offsets_log.read(before, 1 << 20))
        assert [bytes(r.key or b"") for r in batch] == [b"queue:g", b"lease:g"]
        with pytest.raises(LeaseExpiredError):
            await asyncio.to_thread(first.ack, lease)  # acknowledged by the pop: not live any more
        # the handed-over lease is replicated like any: it holds and is acked at a new leader
        await rc.push(rc.state("t", 0, 2, 1, [1, 2, 3], [1, 2, 3], 1), [1, 2, 3])
        assert await asyncio.to_thread(second.pop, 0.5) is None
        assert await asyncio.to_thread(first.ack, nxt) == 4
        last = await asyncio.to_thread(second.pop, 5)
        assert last is not None and [r.value for r in last.records] == [b"v4", b"v5"]
