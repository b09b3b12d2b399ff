"""One idempotent producer's Produce calls for one partition are appended in sequence order even
when they reach the broker, or its append, in another order (issue 31: a producer keeps up to 5
calls per partition in flight; dmq.broker.sequence_gate).

Seen failing without the gate: the later batch is refused OUT_OF_ORDER_SEQUENCE at once."""

from __future__ import annotations

import time

import grpc
import pytest

from dmq.broker.memory_budget import ByteBudget, Lease
from dmq.broker.sequence_gate import SEQUENCE_WAIT_MAX_S
from dmq.client.cli.runner import ClusterThread
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import records
from dmq.proto.grpc_options import channel_options

MiB = 1024 * 1024
PID = 4242


@pytest.fixture
def broker(cluster: ClusterThread):
    channel = grpc.insecure_channel(cluster.bootstrap, options=channel_options())
    pb_grpc.MetadataStub(channel).CreateTopic(pb.CreateTopicRequest(name="t", partitions=1), timeout=10)
    yield pb_grpc.BrokerStub(channel)
    channel.close()


def _produce(broker, values: list[bytes], seq: int, timeout: float = 10.0):
    batch = records.encode(values, producer_id=PID, producer_epoch=0, base_sequence=seq)
    return broker.Produce.future(pb.ProduceRequest(topic="t", partition=0, batch=batch, acks=pb.ACKS_ALL),
                                 timeout=timeout)


def _values(broker) -> list[bytes]:
    answer = broker.Fetch(pb.FetchRequest(partitions=[pb.FetchPartition(topic="t", partition=0, offset=0)]),
                          timeout=10)
    out: list[bytes] = []
    for p in answer.partitions:
        for batch in records.decode_batches(p.records):
            out.extend(r.value for r in batch)
    return out


def _gate(cluster: ClusterThread):
    return cluster.cluster.brokers[0].service.sequences


def test_the_later_sequence_arriving_first_waits_for_the_earlier(cluster, broker) -> None:
    assert _produce(broker, [b"a0"], 0).result().base_offset == 0  # the broker knows the producer now
    later = _produce(broker, [b"c0", b"c1"], 3)  # sequences 3-4: 1-2 not yet there
    time.sleep(0.1)
    assert not later.done()  # held, not refused
    earlier = _produce(broker, [b"b0", b"b1"], 1)
    assert earlier.result().base_offset == 1
    answered = time.monotonic()
    assert later.result().base_offset == 3
    # woken by the earlier one's append, not by the end of its bounded wait
    assert time.monotonic() - answered < SEQUENCE_WAIT_MAX_S / 2
    assert _values(broker) == [b"a0", b"b0", b"b1", b"c0", b"c1"]
    assert _gate(cluster).waited >= 1
    again = _produce(broker, [b"b0", b"b1"], 1).result()  # a retry: still its original offset
    assert (again.base_offset, again.duplicate) == (1, True)


def test_the_earlier_one_held_on_the_memory_budget_is_still_appended_first(cluster, broker) -> None:
    service = cluster.cluster.brokers[0].service
    service.budget = ByteBudget(8 * MiB, max_request_bytes=4 * MiB, small_request_bytes=64 * 1024)
    assert _produce(broker, [b"a0"], 0).result().base_offset == 0

    async def take() -> list[Lease]:
        # the large share (75%, 6 MiB) is full: two leases (one is clamped to max_request_bytes)
        leases = [service.budget.try_acquire(3 * MiB), service.budget.try_acquire(3 * MiB)]
        assert None not in leases
        return leases  # type: ignore[return-value]

    held: list[Lease] = cluster.call(take())  # type: ignore[assignment]
    big = _produce(broker, [b"B" * MiB], 1)  # large: waits for room in the budget
    time.sleep(0.2)
    small = _produce(broker, [b"s"], 2)  # small: fits at once, but must not overtake
    time.sleep(0.2)
    assert not big.done() and not small.done()

    async def give() -> None:
        for lease in held:
            lease.release()

    cluster.call(give())
    assert big.result().base_offset == 1
    assert small.result().base_offset == 2
    assert _values(broker) == [b"a0", b"B" * MiB, b"s"]


def test_a_predecessor_that_never_comes_is_refused_after_a_bounded_wait(cluster, broker) -> None:
    _produce(broker, [b"a0"], 0).result()
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as info:
        _produce(broker, [b"z"], 5).result()
    waited = time.monotonic() - started
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "expected sequence 1" in (info.value.details() or "")
    assert SEQUENCE_WAIT_MAX_S * 0.8 <= waited < SEQUENCE_WAIT_MAX_S + 2.0
    assert _values(broker) == [b"a0"]
