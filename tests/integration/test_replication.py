"""Replication, the broker side (issue 15): three real brokers on loopback, the test as controller
(tests/integration/_replication_cluster.py). Followers copy the leader byte for byte, the high
watermark bounds what consumers see, the in-sync set shrinks through the controller, acks=all
refuses below min_insync_replicas, and a deposed leader truncates its divergent tail (KIP-101)."""

from __future__ import annotations

import asyncio
import pathlib

import grpc
import pytest

from dmq.broker.replication.checkpoint import EPOCHS_FILE, load_epochs
from dmq.proto import dmq_pb2 as pb
from dmq.proto import error_details, records
from tests.integration._replication_cluster import ReplicationCluster, until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def rc(tmp_path, request):
    lag_ms = getattr(request, "param", 10_000)
    c = ReplicationCluster(tmp_path, lag_ms=lag_ms)
    await c.start()
    yield c
    await c.close()


def _batch(values: list[bytes], **kw) -> bytes:
    return records.encode(values, **kw)


async def _produce(c: ReplicationCluster, broker: int, topic: str, values: list[bytes], acks=pb.ACKS_ALL, **kw):
    return await c.brokers[broker].stub.Produce(
        pb.ProduceRequest(topic=topic, partition=0, batch=_batch(values, **kw), acks=acks), timeout=10)


async def _consume(c: ReplicationCluster, broker: int, topic: str, offset: int = 0) -> tuple[list[bytes], int]:
    resp = await c.brokers[broker].stub.Fetch(
        pb.FetchRequest(partitions=[pb.FetchPartition(topic=topic, partition=0, offset=offset)]), timeout=10)
    (result,) = resp.partitions
    assert result.error == pb.NONE, result.error_message
    return [r.value for b in records.decode_batches(result.records) for r in b], result.high_watermark


async def test_followers_become_byte_identical_and_consumers_see_the_high_watermark(rc: ReplicationCluster):
    await rc.create("t", [1, 2, 3])
    offsets = []
    for i in range(5):
        answer = await _produce(rc, 1, "t", [f"v{i}".encode(), b"x" * 100], producer_id=7, producer_epoch=0,
                                base_sequence=2 * i)
        offsets.append(answer.base_offset)
    assert offsets == [0, 2, 4, 6, 8]
    # acks=all answered: the high watermark covers every batch, so each follower has them
    leader_bytes = rc.log_bytes(1, "t")
    await until(lambda: rc.log_bytes(2, "t") == leader_bytes and rc.log_bytes(3, "t") == leader_bytes,
                what="followers byte-identical")
    values, hw = await _consume(rc, 1, "t")
    assert hw == 10 and values == [v for i in range(5) for v in (f"v{i}".encode(), b"x" * 100)]
    latest = await rc.brokers[1].stub.ListOffsets(
        pb.ListOffsetsRequest(queries=[pb.OffsetQuery(topic="t", partition=0, timestamp_ms=-1)]), timeout=10)
    assert latest.answers[0].offset == 10
    # a follower refuses produce and consumer fetches, naming the leader
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await _produce(rc, 2, "t", [b"no"])
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE and rc.brokers[1].address in e.value.details()
    resp = await rc.brokers[3].stub.Fetch(
        pb.FetchRequest(partitions=[pb.FetchPartition(topic="t", partition=0, offset=0)]), timeout=10)
    assert resp.partitions[0].error == pb.NOT_LEADER and rc.brokers[1].address in resp.partitions[0].error_message
    # the producer's state travelled with the batches: a retry of batch 4 to a promoted follower is a duplicate
    followers_cache = rc.brokers[2].node.replication.get("t", 0).cache.entries
    assert followers_cache == rc.brokers[1].node.replication.get("t", 0).cache.entries
    await rc.push(rc.state("t", 0, 2, 1, [1, 2, 3], [1, 2, 3], 1), [1, 2, 3])
    dup = await _produce(rc, 2, "t", [b"v4", b"x" * 100], producer_id=7, producer_epoch=0, base_sequence=8)
    assert dup.duplicate and dup.base_offset == 8
    assert rc.log_end(2, "t") == 10


@pytest.mark.parametrize("rc", [400], indirect=True)
async def test_a_stopped_follower_leaves_the_isr_and_produce_goes_on(rc: ReplicationCluster):
    await rc.create("t", [1, 2, 3])
    await _produce(rc, 1, "t", [b"a"])
    await rc.stop_broker(3)
    assert rc.controller.shutting_down == [3]  # a clean stop asks the controller to move leadership first
    # acks=all waits for broker 3 until the leader drops it from the ISR (through the controller)
    answer = await _produce(rc, 1, "t", [b"b"])
    assert answer.base_offset == 1
    assert [1, 2] in rc.controller.isr_proposals()
    assert sorted(rc.brokers[1].node.replication.get("t", 0).leading.isr) == [1, 2]
    assert rc.controller.states[("t", 0)].isr == [1, 2]
    assert (await _consume(rc, 1, "t"))[0] == [b"a", b"b"]
    await until(lambda: rc.log_bytes(2, "t") == rc.log_bytes(1, "t"), what="broker 2 caught up")


@pytest.mark.parametrize("rc", [400], indirect=True)
async def test_two_followers_gone_refuses_acks_all_and_hides_unreplicated_records(rc: ReplicationCluster):
    await rc.create("t", [1, 2, 3], pb.TopicConfig(min_insync_replicas=2))
    await _produce(rc, 1, "t", [b"a"])
    await until(lambda: rc.brokers[1].node.replication.high_watermark(rc.brokers[1].node.replication.get("t", 0)) == 1)
    await rc.stop_broker(2)
    await rc.stop_broker(3)
    # acks=1: the leader alone answers, but consumers do not see the record below the high watermark
    answer = await _produce(rc, 1, "t", [b"b"], acks=pb.ACKS_LEADER)
    assert answer.base_offset == 1
    values, hw = await _consume(rc, 1, "t")
    assert (values, hw) == ([b"a"], 1)
    # the followers leave the ISR once past the lag time; then acks=all is refused, nothing stored
    await until(lambda: sorted(rc.controller.states[("t", 0)].isr) == [1], what="ISR shrunk to the leader")
    await until(lambda: rc.brokers[1].node.replication.get("t", 0).leading.isr == {1})
    end = rc.log_end(1, "t")
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await _produce(rc, 1, "t", [b"c"])
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    assert error_details.reason_of(e.value.trailing_metadata()) == error_details.NOT_ENOUGH_REPLICAS
    assert rc.log_end(1, "t") == end
    # the ISR of one: the high watermark is the leader's log end again
    values, hw = await _consume(rc, 1, "t")
    assert (values, hw) == ([b"a", b"b"], 2)


async def test_a_deposed_leader_truncates_its_divergent_tail_and_keeps_its_epochs_across_a_restart(
    rc: ReplicationCluster,
):
    await rc.create("t", [1, 2, 3])
    for i in range(3):
        await _produce(rc, 1, "t", [f"a{i}".encode()])
    committed = rc.log_bytes(1, "t")
    await until(lambda: rc.log_bytes(3, "t") == committed)
    # broker 2 is elected at epoch 1 while broker 1, cut off, does not hear of it
    await rc.push(rc.state("t", 0, 2, 1, [1, 2, 3], [2, 3], 1), [2, 3])
    stale = await _produce(rc, 1, "t", [b"lost", b"lost"], acks=pb.ACKS_LEADER)  # an uncommitted tail
    assert stale.base_offset == 3
    for i in range(2):
        await _produce(rc, 2, "t", [f"b{i}".encode()])
    assert rc.log_end(1, "t") == 5 and rc.log_end(2, "t") == 5 and rc.log_bytes(1, "t") != rc.log_bytes(2, "t")
    # broker 1 learns it is a follower at epoch 1: it truncates to offset 3 and copies epoch 1's batches
    await rc.push(rc.state("t", 0, 2, 1, [1, 2, 3], [2, 3], 2), [1, 2, 3])
    await until(lambda: rc.log_bytes(1, "t") == rc.log_bytes(2, "t"), what="old leader byte-identical")
    leader_epochs = rc.brokers[2].node.replication.get("t", 0).cache.entries
    assert [(e.epoch, e.start_offset) for e in leader_epochs] == [(0, 0), (1, 3)]
    assert rc.brokers[1].node.replication.get("t", 0).cache.entries == leader_epochs
    values, _ = await _consume(rc, 2, "t")
    assert values == [b"a0", b"a1", b"a2", b"b0", b"b1"]
    # caught up, broker 1 is proposed back into the ISR
    await until(lambda: 1 in rc.controller.states[("t", 0)].isr, what="broker 1 back in the ISR")
    # the epoch cache is on disk and comes back with the broker (which re-registers as a follower)
    plog = rc.brokers[1].node.logs.get("t", 0)
    assert (pathlib.Path(plog.directory) / EPOCHS_FILE).exists()
    await rc.stop_broker(1)
    b1 = await rc.start_broker(1)
    replica = b1.node.replication.get("t", 0)
    assert replica is not None and replica.cache.entries == leader_epochs
    assert load_epochs(b1.node.logs.get("t", 0)).entries == leader_epochs
    await _produce(rc, 2, "t", [b"c"])
    await until(lambda: rc.log_bytes(1, "t") == rc.log_bytes(2, "t"), what="restarted follower caught up")


async def test_acks_all_waits_a_bounded_time_for_the_isr_then_fails_retriable(tmp_path):
    c = ReplicationCluster(tmp_path, lag_ms=10_000, ack_timeout_ms=300)
    await c.start()
    try:
        await c.create("t", [1, 2, 3])
        await c.stop_broker(2)
        await c.stop_broker(3)
        # the ISR still names both (not past the lag time): the batch is stored, never replicated
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await _produce(c, 1, "t", [b"a"])
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert error_details.reason_of(e.value.trailing_metadata()) == error_details.NOT_ENOUGH_REPLICAS
        assert "within 300 ms" in e.value.details()
        values, hw = await _consume(c, 1, "t")
        assert (values, hw) == ([], 0)  # not acknowledged, not visible
    finally:
        await c.close()


async def test_an_idempotent_producer_follows_a_leader_change_and_stores_each_record_once(rc: ReplicationCluster):
    from dmq.client import Producer

    await rc.create("t", [1, 2, 3])
    # The client is synchronous and the brokers run on this event loop: it works from a thread.
    producer = await asyncio.to_thread(
        Producer, rc.controller_address, acks="all", enable_idempotence=True, linger_ms=1,
        retry_backoff_ms=20, retry_backoff_max_ms=100)

    def send(prefix: str) -> list[int]:
        futures = [producer.send("t", f"{prefix}{i}".encode(), partition=0) for i in range(20)]
        producer.flush(10)
        return [f.result(0).offset for f in futures]

    try:
        offsets = await asyncio.to_thread(send, "a")
        # broker 2 takes over at epoch 1; broker 1, now a follower, answers "not leader"
        await rc.push(rc.state("t", 0, 2, 1, [1, 2, 3], [1, 2, 3], 1), [1, 2, 3])
        offsets += await asyncio.to_thread(send, "b")
    finally:
        await asyncio.to_thread(producer.close, 10)
    assert offsets == list(range(40))
    values, hw = await _consume(rc, 2, "t")
    assert hw == 40 and values == [f"a{i}".encode() for i in range(20)] + [f"b{i}".encode() for i in range(20)]
    await until(lambda: rc.log_bytes(1, "t") == rc.log_bytes(2, "t") == rc.log_bytes(3, "t"))


async def test_a_replica_behind_its_leaders_retention_restarts_at_the_leaders_log_start(rc: ReplicationCluster):
    await rc.create("t", [1, 2, 3], pb.TopicConfig(segment_bytes=1024, retention_bytes=0, min_insync_replicas=1))
    await _produce(rc, 1, "t", [b"early"])
    await until(lambda: rc.log_end(3, "t") == 1)
    await rc.stop_broker(3)
    for i in range(8):
        await _produce(rc, 1, "t", [f"v{i}".encode() * 100], acks=pb.ACKS_LEADER)
    leader_log = rc.brokers[1].node.logs.get("t", 0)
    assert leader_log.enforce_retention() > 0  # retention_bytes 0: every segment but the active one
    start = leader_log.log_start_offset
    assert start > 1
    await rc.start_broker(3)
    await until(lambda: rc.log_end(3, "t") == rc.log_end(1, "t"), what="broker 3 caught up")
    follower_log = rc.brokers[3].node.logs.get("t", 0)
    assert follower_log.log_start_offset == start
    assert rc.log_bytes(3, "t") == rc.log_bytes(1, "t")


@pytest.mark.parametrize("rc", [1000], indirect=True)
async def test_queue_pops_stop_at_the_high_watermark_and_followers_serve_none(rc: ReplicationCluster):
    # min_insync_replicas 1: the lease's grant (written to the replicated offsets log before the
    # pop is answered) is stored once the lagging followers left the in-sync set (lag 1 s)
    await rc.create("t", [1, 2, 3], pb.TopicConfig(min_insync_replicas=1))
    await _produce(rc, 1, "t", [b"a"])
    await until(lambda: rc.log_end(3, "t") == 1)

    async def pop(broker: int) -> pb.QueuePopResponse:
        return await rc.brokers[broker].stub.QueuePop(
            pb.QueuePopRequest(topic="t", group="q", max_records=10, timeout_ms=100), timeout=10)

    assert not (await pop(2)).lease_id  # a follower's copy is not a queue
    await rc.stop_broker(2)
    await rc.stop_broker(3)
    await _produce(rc, 1, "t", [b"b"], acks=pb.ACKS_LEADER)  # not replicated: above the high watermark
    popped = await pop(1)
    assert (popped.start_offset, popped.end_offset) == (0, 1)
    assert [r.value for b in records.decode_batches(popped.records) for r in b if r.offset < popped.end_offset] == [b"a"]
