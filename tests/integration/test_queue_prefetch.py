"""QueueConsumer with prefetch (issue 16, batches of 1) over real gRPC: one broker lease of N
records handed out a slice at a time, acks recorded locally and riding on the next broker call.

What is checked: every record is handed out once and in order; acks that were only local are made
durable by close() (nothing comes back) and commit(); a worker that dies with local acks gets the
records after its last durable ack redelivered, with one failed delivery counted on the first of
them only; a nack in the middle of the prefetched records; nobody else of the group gets the
partition meanwhile; a lease too close to its expiry is not handed out locally (its acks ride on
a pop that releases the rest uncounted); the new request fields are validated by the broker.
"""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from dmq.client import AdminClient, QueueConsumer
from dmq.client.cli.runner import ClusterThread
from dmq.client.errors import InvalidArgumentError
from dmq.client.queue import QueueLease
from dmq.client.queue_admin import QueueGroupState
from dmq.client.records import ConsumerRecord
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc
from tests.integration._queue_helpers import WAIT_S, create_topic, produce
from tests.threads import run_in_threads


def _setup(bootstrap: str, topic: str, n: int) -> None:
    create_topic(bootstrap, topic)
    produce(bootstrap, topic, [b"v%d" % i for i in range(n)])


def _state(bootstrap: str, topic: str, group: str = "g") -> QueueGroupState:
    with AdminClient(bootstrap) as admin:
        [state] = [s for s in admin.describe_queue(topic).groups if s.group == group]
    return state


def _assert_settled(bootstrap: str, topic: str, acked_offset: int) -> None:
    """Group g of topic has acked up to acked_offset, counted no failed delivery and holds no lease."""
    state = _state(bootstrap, topic)
    assert (state.acked_offset, state.delivery_count, state.lease) == (acked_offset, 0, None)


def _pop_acking(q: QueueConsumer, n: int) -> QueueLease | None:
    """Pop, then n more pops each acking the lease before it: the lease the last one returned."""
    lease = q.pop(timeout=WAIT_S)
    for _ in range(n):
        assert lease is not None
        lease = q.pop(timeout=WAIT_S, ack=lease)
    return lease


def test_batches_of_1_hand_out_every_record_once_in_order_from_few_broker_leases(cluster: ClusterThread) -> None:
    _setup(cluster.bootstrap, "pre-order", 50)
    offsets: list[int] = []
    lease_ids: set[str] = set()
    with QueueConsumer(cluster.bootstrap, "pre-order", "g", max_records=1, prefetch_records=20) as q:
        lease = q.pop(timeout=WAIT_S)
        while lease is not None:
            assert len(lease.records) == 1 and (lease.start_offset, lease.end_offset) == (
                lease.records[0].offset,
                lease.records[0].offset + 1,
            )
            assert lease.records[0].value == b"v%d" % lease.start_offset
            offsets.append(lease.start_offset)
            lease_ids.add(lease.lease_id)
            lease = q.pop(timeout=0.3, ack=lease)
    assert offsets == list(range(50))
    assert len(lease_ids) == 3  # 20 + 20 + 10: one broker pop per 20 records
    _assert_settled(cluster.bootstrap, "pre-order", 50)


def test_local_acks_are_made_durable_by_close_and_the_rest_released_uncounted(cluster: ClusterThread) -> None:
    _setup(cluster.bootstrap, "pre-close", 20)
    with QueueConsumer(cluster.bootstrap, "pre-close", "g", max_records=1, prefetch_records=20) as q:
        lease = _pop_acking(q, 4)
        assert lease is not None and lease.start_offset == 4  # offsets 0-3 acked locally only
        before = _state(cluster.bootstrap, "pre-close")
        assert before.acked_offset == 0 and before.lease is not None and before.lease.records == 20
        q.pop(timeout=WAIT_S, ack=lease)  # offset 4 acked locally too; 5 handed out, not acked
    after = _state(cluster.bootstrap, "pre-close")
    # offsets 0-4 durable; 5 (handed out, not acked) and 6-19 (never handed out) given back
    assert (after.acked_offset, after.delivery_count, after.lease) == (5, 0, None)
    with QueueConsumer(cluster.bootstrap, "pre-close", "g", max_records=100) as q:
        again = q.pop(timeout=WAIT_S)
        assert again is not None and (again.start_offset, again.end_offset, again.delivery_count) == (5, 20, 0)
        q.ack(again)


def test_commit_and_explicit_ack_are_durable_and_keep_the_prefetched_records(cluster: ClusterThread) -> None:
    _setup(cluster.bootstrap, "pre-commit", 10)
    with QueueConsumer(cluster.bootstrap, "pre-commit", "g", max_records=2, prefetch_records=10) as q:
        first = q.pop(timeout=WAIT_S)
        assert first is not None and (first.start_offset, first.end_offset) == (0, 2)
        assert q.ack(first) == 2  # durable now; the lease goes on for offsets 2-9
        state = _state(cluster.bootstrap, "pre-commit")
        assert state.acked_offset == 2 and state.lease is not None and state.lease.lease_id == first.lease_id
        second = q.pop(timeout=WAIT_S)
        assert second is not None and second.lease_id == first.lease_id and second.start_offset == 2
        third = q.pop(timeout=WAIT_S, ack=second)
        assert third is not None and third.start_offset == 4
        assert _state(cluster.bootstrap, "pre-commit").acked_offset == 2  # offsets 2-3 acked locally
        q.commit()
        state = _state(cluster.bootstrap, "pre-commit")
        assert state.acked_offset == 4 and state.lease is not None and state.lease.lease_id == first.lease_id
        with pytest.raises(InvalidArgumentError, match="already acked"):
            q.ack(second)
        q.ack(third)
    assert _state(cluster.bootstrap, "pre-commit").acked_offset == 6


def test_a_crashed_prefetching_worker_redelivers_after_its_last_durable_ack(cluster: ClusterThread) -> None:
    _setup(cluster.bootstrap, "pre-crash", 10)
    crashed = QueueConsumer(cluster.bootstrap, "pre-crash", "g", max_records=1, prefetch_records=10, lease_ms=1000)
    try:
        lease = crashed.pop(timeout=WAIT_S)
        for _ in range(2):
            assert lease is not None
            lease = crashed.pop(timeout=WAIT_S, ack=lease)
        crashed.commit()  # offsets 0-1 durable
        for _ in range(3):
            assert lease is not None
            lease = crashed.pop(timeout=WAIT_S, ack=lease)
        assert lease is not None and lease.start_offset == 5  # offsets 2-4 acked only locally
        with QueueConsumer(cluster.bootstrap, "pre-crash", "g", max_records=1) as other:
            # held by the prefetching worker: nothing for anyone else of the group until it expires
            assert other.pop(timeout=0) is None
            # the worker dies here (no close, no more calls): the lease expires on the broker
            got = other.pop(timeout=WAIT_S)
            seen: list[tuple[int, int]] = []
            while got is not None:
                seen.append((got.start_offset, got.delivery_count))
                got = other.pop(timeout=0.3, ack=got)
        # the first record not durably acked counts the failed delivery; the others none
        assert seen == [(2, 1)] + [(i, 0) for i in range(3, 10)]
    finally:
        crashed.close()  # its acks are refused now (the lease expired): logged, nothing changes
    _assert_settled(cluster.bootstrap, "pre-crash", 10)


def test_nack_in_the_middle_of_the_prefetched_records(cluster: ClusterThread) -> None:
    _setup(cluster.bootstrap, "pre-nack", 10)
    with QueueConsumer(cluster.bootstrap, "pre-nack", "g", max_records=1, prefetch_records=10) as q:
        lease = _pop_acking(q, 3)
        assert lease is not None and lease.start_offset == 3
        result = q.nack(lease, "boom")  # offsets 0-2 (acked locally) are acknowledged with it
        assert (result.acked_offset, result.delivery_count, result.dead_lettered) == (3, 1, False)
        seen: list[tuple[int, int]] = []
        got = q.pop(timeout=WAIT_S)
        while got is not None:
            seen.append((got.start_offset, got.delivery_count))
            got = q.pop(timeout=0.3, ack=got)
    assert seen == [(3, 1)] + [(i, 0) for i in range(4, 10)]
    state = _state(cluster.bootstrap, "pre-nack")
    assert (state.acked_offset, state.delivery_count) == (10, 0)


def test_a_lease_near_its_expiry_is_not_handed_out_locally(cluster: ClusterThread) -> None:
    _setup(cluster.bootstrap, "pre-expiry", 10)
    with QueueConsumer(cluster.bootstrap, "pre-expiry", "g", max_records=1, prefetch_records=10, lease_ms=3000) as q:
        first = q.pop(timeout=WAIT_S)
        assert first is not None
        time.sleep(2.2)  # less than a third of the 3 s lease is left; the broker has not expired it
        nxt = q.pop(timeout=WAIT_S, ack=first)
        # went to the broker: the ack of offset 0 rode on it, offsets 1-9 were released uncounted
        assert nxt is not None and nxt.lease_id != first.lease_id
        assert (nxt.start_offset, nxt.delivery_count) == (1, 0)
        state = _state(cluster.bootstrap, "pre-expiry")
        assert (state.acked_offset, state.delivery_count) == (1, 0)
        q.ack(nxt)


def test_process_with_prefetch_acks_each_record_once_and_retries_a_failure(cluster: ClusterThread) -> None:
    _setup(cluster.bootstrap, "pre-process", 30)
    handled: list[int] = []
    failing = {7}

    def handler(record: ConsumerRecord) -> None:
        if record.offset in failing:
            failing.discard(record.offset)
            raise RuntimeError("once")
        handled.append(record.offset)

    with QueueConsumer(cluster.bootstrap, "pre-process", "g", max_records=1, prefetch_records=8) as q:
        assert q.process(handler, idle_timeout=0.5, poll_timeout=0.2) == 30
    assert handled == list(range(30))
    _assert_settled(cluster.bootstrap, "pre-process", 30)


def test_process_with_prefetch_renews_the_broker_lease_while_a_slow_handler_runs(cluster: ClusterThread) -> None:
    _setup(cluster.bootstrap, "pre-slow", 2)
    seen: list[int] = []

    def slow(record: ConsumerRecord) -> None:
        time.sleep(0.9)  # longer than the 600 ms lease: only renewals keep it
        seen.append(record.offset)

    with QueueConsumer(cluster.bootstrap, "pre-slow", "g", max_records=1, prefetch_records=10, lease_ms=600) as q:
        assert q.process(slow, idle_timeout=0.5, poll_timeout=0.2) == 2
    assert seen == [0, 1]  # each handled once: the lease never expired
    _assert_settled(cluster.bootstrap, "pre-slow", 2)


def test_threads_sharing_a_prefetching_consumer_never_hold_one_partition_twice(cluster: ClusterThread) -> None:
    _setup(cluster.bootstrap, "pre-threads", 200)
    got: list[int] = []
    lock = threading.Lock()
    holding = [0]
    overlap = threading.Event()
    with QueueConsumer(cluster.bootstrap, "pre-threads", "g", max_records=1, prefetch_records=16) as q:

        def worker() -> None:
            # short pops, again and again: a thread finds the consumer's buffer whenever it looks
            lease = None
            give_up = time.monotonic() + 60
            while True:
                lease = q.pop(timeout=0.05, ack=lease)
                if lease is None:
                    with lock:
                        if len(got) >= 200 or time.monotonic() > give_up:
                            return
                    continue
                with lock:
                    holding[0] += 1
                    if holding[0] > 1:
                        overlap.set()  # two records of the one partition out at once
                    got.append(lease.start_offset)
                time.sleep(0.001)  # "work": another thread handed the next record now would show
                with lock:
                    holding[0] -= 1

        run_in_threads(worker, 4, 60)
    assert not overlap.is_set()
    assert got == list(range(200))
    assert _state(cluster.bootstrap, "pre-threads").acked_offset == 200


def test_the_broker_checks_the_new_fields(cluster: ClusterThread) -> None:
    _setup(cluster.bootstrap, "pre-fields", 5)
    channel = grpc.insecure_channel(cluster.bootstrap)
    try:
        stub = dmq_pb2_grpc.BrokerStub(channel)
        md = stub.QueuePop(pb.QueuePopRequest(topic="pre-fields", group="g", max_records=3, timeout_ms=0))
        assert md.lease_id and md.lease_ms == 30_000
        with pytest.raises(grpc.RpcError) as e:
            stub.QueuePop(pb.QueuePopRequest(topic="pre-fields", group="g", max_records=1, ack_up_to_offset=1))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "needs ack_lease_id" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            stub.QueuePop(
                pb.QueuePopRequest(topic="pre-fields", group="g", max_records=1, ack_lease_id=md.lease_id, ack_up_to_offset=3)
            )
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "ack_up_to_offset must be within -1..2" in e.value.details()
        # the refused ack changed nothing: keep_lease acknowledges through 0 and the lease goes on
        acked = stub.QueueAck(pb.QueueAckRequest(lease_id=md.lease_id, up_to_offset=0, keep_lease=True))
        assert acked.acked_offset == 1
        # a partial riding ack: through 1; offset 2 released uncounted and handed over at once
        again = stub.QueuePop(
            pb.QueuePopRequest(topic="pre-fields", group="g", max_records=5, ack_lease_id=md.lease_id, ack_up_to_offset=1)
        )
        assert (again.acked_offset, again.start_offset, again.end_offset, again.delivery_count) == (2, 2, 5, 0)
        # a riding ack of nothing (through start - 1) gives the lease back uncounted: offset 2 keeps
        # the failed delivery its nack counted
        stub.QueueNack(pb.QueueNackRequest(lease_id=again.lease_id, error="boom"))
        third = stub.QueuePop(pb.QueuePopRequest(topic="pre-fields", group="g", max_records=5, timeout_ms=0))
        assert (third.start_offset, third.delivery_count) == (2, 1)
        fourth = stub.QueuePop(
            pb.QueuePopRequest(
                topic="pre-fields", group="g", max_records=5, timeout_ms=1000, ack_lease_id=third.lease_id, ack_up_to_offset=1
            )
        )
        assert (fourth.acked_offset, fourth.start_offset, fourth.delivery_count) == (2, 2, 1)
        assert stub.QueueNack(pb.QueueNackRequest(lease_id=fourth.lease_id, error="again")).delivery_count == 2
    finally:
        channel.close()
