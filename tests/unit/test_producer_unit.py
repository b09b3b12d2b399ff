"""Producer logic over a fake transport: batching, linger, ordering, retries, idempotence, memory,
close; plus the error mapping. No server: the fake broker decodes each batch like a real log."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from dmq.client import errors
from dmq.client._accumulator import BufferPool, ProducerBatch, RecordFuture
from dmq.client._cluster import TopicMetadata
from dmq.client._partitioner import crc32_partition
from dmq.client.errors import (
    BrokerUnavailableError,
    ClientClosedError,
    DMQTimeoutError,
    InvalidArgumentError,
    NotLeaderError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    TopicNotFoundError,
    UnknownPartitionError,
    from_partition_error,
    from_rpc_error,
)
from dmq.client.producer import Producer
from dmq.client.records import RecordMetadata
from dmq.proto import dmq_pb2 as pb
from dmq.proto import error_details, records

WAIT_S = 10.0


# -- fakes ----------------------------------------------------------------------------------------


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str = "", reason: str | None = None) -> None:
        super().__init__(details)
        self._code = code
        self._details = details
        self._trailing = ((error_details.REASON_KEY, reason),) if reason else ()

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._trailing

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class FakeCall:
    """A grpc future: the test (or the auto broker) completes it."""

    def __init__(self, request: pb.ProduceRequest) -> None:
        self.request = request
        self.header = records.read_header(request.batch)
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[FakeCall], None]] = []
        self._done = False
        self._response: pb.ProduceResponse | None = None
        self._error: BaseException | None = None

    def add_done_callback(self, fn: Callable[[FakeCall], None]) -> None:
        with self._lock:
            if not self._done:
                self._callbacks.append(fn)
                return
        fn(self)

    def result(self, timeout: float | None = None) -> pb.ProduceResponse:
        if self._error is not None:
            raise self._error
        assert self._response is not None
        return self._response

    def cancel(self) -> bool:
        return False

    def finish(self, response: pb.ProduceResponse | None = None, error: BaseException | None = None) -> None:
        with self._lock:
            self._response, self._error, self._done = response, error, True
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn(self)


class FakeBroker:
    """Stores batches like a partition log, with idempotent de-duplication by (pid, epoch, seq).

    auto=True answers each Produce at once; otherwise calls wait in `pending` for the test.
    `script` holds errors to return for the next calls (None = answer normally).
    """

    def __init__(self, auto: bool = True, script: list[BaseException | None] | None = None) -> None:
        self.auto = auto
        self.lock = threading.Lock()
        self.calls: list[FakeCall] = []
        self.pending: list[FakeCall] = []
        self.logs: dict[tuple[str, int], list[records.Record]] = defaultdict(list)
        self.seen: dict[tuple[str, int, int, int, int], int] = {}
        self.script: list[BaseException | None] = script if script is not None else []
        self.arrived = threading.Condition(self.lock)

    def future(self, raw: bytes, timeout: float | None = None) -> FakeCall:
        request = pb.ProduceRequest.FromString(raw)  # the producer frames requests by hand
        call = FakeCall(request)
        with self.lock:
            self.calls.append(call)
            error = self.script.pop(0) if self.script else None
            if not self.auto and error is None:
                self.pending.append(call)
                self.arrived.notify_all()
                return call
        if error is not None:
            call.finish(error=error)
        else:
            call.finish(self.append(request))
        return call

    def append(self, request: pb.ProduceRequest) -> pb.ProduceResponse:
        batch = records.decode(request.batch)
        h = batch.header
        key = (request.topic, request.partition)
        with self.lock:
            ident = (request.topic, request.partition, h.producer_id, h.producer_epoch, h.base_sequence)
            if h.producer_id >= 0 and ident in self.seen:
                return pb.ProduceResponse(base_offset=self.seen[ident], duplicate=True)
            log = self.logs[key]
            base = len(log)
            log.extend(r._replace(offset=base + i) for i, r in enumerate(batch))
            if h.producer_id >= 0:
                self.seen[ident] = base
        return pb.ProduceResponse(base_offset=base)

    def answer_next(self, timeout_s: float = WAIT_S) -> FakeCall:
        """Complete the oldest pending call normally."""
        call = self.wait_pending(1, timeout_s)[0]
        with self.lock:
            self.pending.remove(call)
        call.finish(self.append(call.request))
        return call

    def wait_pending(self, n: int, timeout_s: float = WAIT_S) -> list[FakeCall]:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.pending) >= n, timeout_s), (
                f"expected {n} pending Produce calls, got {len(self.pending)}"
            )
            return list(self.pending)

    def values(self, topic: str, partition: int) -> list[bytes]:
        return [r.value for r in self.logs[(topic, partition)]]


class FakeCluster:
    bootstrap = "fake:1"
    timeout_s = 5.0

    def __init__(self, broker: FakeBroker, partitions: dict[str, int]) -> None:
        self.broker = broker
        self.partitions = partitions
        self.invalidated: list[str] = []
        self.closed = False
        self.leader = "fake:2"  # what leader_for / peek_leader answer
        self.peeks = 0

    def topic_metadata(self, topic: str) -> TopicMetadata:
        if topic not in self.partitions:
            raise TopicNotFoundError(f"topic {topic!r} not found")
        n = self.partitions[topic]
        return TopicMetadata(topic, (), tuple(range(n)), time.monotonic()).__class__(
            topic, tuple(_pm(i) for i in range(n)), tuple(range(n)), time.monotonic()
        )

    def cached_metadata(self, topic: str) -> TopicMetadata | None:
        return None  # nothing cached: the producer asks topic_metadata(), as these tests expect

    def leader_for(self, topic: str, partition: int, *, timeout_s: float | None = None, allow_stale: bool = False) -> str:
        return self.leader

    def peek_leader(self, topic: str, partition: int, *, max_age_s: float) -> str:
        self.peeks += 1
        return self.leader

    def raw_produce(self, address: str) -> FakeBroker:
        return self.broker

    def start_unary(self, method: Any, request: Any, timeout: float) -> Any:
        return method.future(request, timeout=timeout)  # as Cluster.start_unary: the FakeBroker's FakeCall

    def invalidate(self, topic: str) -> None:
        self.invalidated.append(topic)

    def close(self) -> None:
        self.closed = True


def _pm(i: int) -> Any:
    from dmq.client._cluster import PartitionMetadata

    return PartitionMetadata(i, 0, "fake:2", True)


def make_producer(broker: FakeBroker, partitions: dict[str, int] | None = None, **kwargs: Any) -> Producer:
    kwargs.setdefault("linger_ms", 0)
    return Producer("fake:1", cluster=FakeCluster(broker, partitions or {"t": 1}), **kwargs)  # type: ignore[arg-type]


def wait_until(pred: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.002)  # polling a condition the sender thread will make true


# -- batching, ordering ----------------------------------------------------------------------------


def test_send_resolves_offsets_in_order() -> None:
    broker = FakeBroker()
    with make_producer(broker) as p:
        handles = [p.send("t", b"v%d" % i) for i in range(100)]
        p.flush(WAIT_S)
        metas = [h.get(WAIT_S) for h in handles]
    assert [m.offset for m in metas] == list(range(100))
    assert {(m.topic, m.partition) for m in metas} == {("t", 0)}
    assert broker.values("t", 0) == [b"v%d" % i for i in range(100)]


def test_full_batches_are_sealed_at_batch_size() -> None:
    broker = FakeBroker()
    with make_producer(broker, batch_size=1000, buffer_memory=100_000, linger_ms=60_000) as p:
        for i in range(50):
            p.send("t", bytes([i]) * 100)
        p.flush(WAIT_S)
    sizes = [len(c.request.batch) for c in broker.calls]
    counts = [c.header.record_count for c in broker.calls]
    assert sum(counts) == 50
    assert len(broker.calls) >= 6  # 112 bytes a record: at most 8 fit in 1000
    assert max(counts) <= 1000 // 112
    assert all(s < 1000 + records.HEADER_SIZE + 100 for s in sizes)
    assert broker.values("t", 0) == [bytes([i]) * 100 for i in range(50)]


def test_linger_holds_a_batch_until_flush() -> None:
    broker = FakeBroker()
    with make_producer(broker, linger_ms=60_000) as p:
        h = p.send("t", b"x")
        assert not h.done()
        # nothing ships while the batch is young and not full: the sender is idle
        assert broker.calls == []
        p.flush(WAIT_S)
        assert h.get(0) == RecordMetadata("t", 0, 0, h.get(0).timestamp)
        assert len(broker.calls) == 1


def test_linger_ships_a_young_batch_after_linger_ms() -> None:
    broker = FakeBroker()
    with make_producer(broker, linger_ms=20) as p:
        t0 = time.monotonic()
        h = p.send("t", b"x")
        h.get(WAIT_S)
        assert time.monotonic() - t0 >= 0.019


def test_one_batch_in_flight_per_partition_and_sequences_follow() -> None:
    broker = FakeBroker(auto=False)
    # max_in_flight_requests_per_connection=1: today's one-at-a-time behaviour, kept on request
    # (tests/unit/test_producer_in_flight.py covers more than one in flight)
    with make_producer(broker, batch_size=500, buffer_memory=100_000, max_in_flight_requests_per_connection=1) as p:
        handles = [p.send("t", b"%03d" % i + b"." * 97) for i in range(30)]
        broker.wait_pending(1)
        answered = 0
        for _ in range(3):
            # while one is in flight the next batch waits (order is kept without relying on the network)
            assert len(broker.pending) == 1
            answered += broker.answer_next().header.record_count
            broker.wait_pending(1)
        while answered < 30:
            answered += broker.answer_next().header.record_count
        p.flush(WAIT_S)
    headers = [c.header for c in broker.calls]
    assert all(h.producer_id == p.producer_id and h.producer_epoch == 0 for h in headers)
    expected_seq = 0
    for h in headers:
        assert h.base_sequence == expected_seq
        expected_seq += h.record_count
    assert [h.get(0).offset for h in handles] == list(range(30))


def test_partitions_are_in_flight_concurrently() -> None:
    broker = FakeBroker(auto=False)
    with make_producer(broker, partitions={"t": 3}) as p:
        for i in range(3):
            p.send("t", b"x", partition=i)
        calls = broker.wait_pending(3)
        assert sorted(c.request.partition for c in calls) == [0, 1, 2]
        for _ in range(3):
            broker.answer_next()
        p.flush(WAIT_S)


def test_keyed_records_follow_the_crc32_partitioner() -> None:
    broker = FakeBroker()
    with make_producer(broker, partitions={"t": 10}) as p:
        handles = {k: p.send("t", b"v", key=k) for k in (b"a", b"user-42", b"customer-7")}
        p.flush(WAIT_S)
    for key, h in handles.items():
        assert h.get(0).partition == crc32_partition(key, 10)
    assert [r.key for r in broker.logs[("t", 7)]] == [b"a"]


def test_sticky_partition_moves_on_when_its_batch_is_sealed() -> None:
    broker = FakeBroker()
    with make_producer(broker, partitions={"t": 4}, batch_size=1000, buffer_memory=100_000, linger_ms=60_000) as p:
        handles = [p.send("t", b"." * 100) for _ in range(80)]
        p.flush(WAIT_S)
    parts = [h.get(0).partition for h in handles]
    # runs of one partition (a batch each), cycling over all four
    runs = [parts[0]]
    for x in parts[1:]:
        if x != runs[-1]:
            runs.append(x)
    assert set(parts) == {0, 1, 2, 3}
    assert len(runs) >= 8
    assert all(a != b for a, b in zip(runs, runs[1:]))


def test_headers_timestamps_and_keys_round_trip() -> None:
    broker = FakeBroker()
    with make_producer(broker) as p:
        p.send("t", b"plain")
        h = p.send("t", b"rich", key=b"k", headers=[("h1", b"x"), ("h2", None)], timestamp_ms=1234)
        p.send("t", b"dict-headers", headers={"a": b"1"})
        p.flush(WAIT_S)
        assert h.get(0).timestamp == 1234
    logged = broker.logs[("t", 0)]
    assert [r.value for r in logged] == [b"plain", b"rich", b"dict-headers"]
    assert logged[1].key == b"k" and logged[1].headers == (("h1", b"x"), ("h2", None))
    assert logged[1].timestamp == 1234
    assert logged[0].key is None and logged[0].headers == ()
    assert logged[2].headers == (("a", b"1"),)


def test_callbacks_get_metadata_or_the_error() -> None:
    broker = FakeBroker(script=[FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT, "batch: bad crc")])
    got: list[tuple[Any, Any]] = []
    done = threading.Event()

    def cb(meta: Any, err: Any) -> None:
        got.append((meta, err))
        if len(got) == 2:
            done.set()

    with make_producer(broker) as p:
        p.send("t", b"first", callback=cb)
        p.flush(WAIT_S)
        p.send("t", b"second", callback=cb)
        p.flush(WAIT_S)
        assert done.wait(WAIT_S)
    (m1, e1), (m2, e2) = got
    assert m1 is None and isinstance(e1, InvalidArgumentError) and "bad crc" in str(e1)
    assert e2 is None and m2.offset == 0


def test_a_done_batch_with_callbacks_is_freed_without_the_cyclic_gc() -> None:
    # A batch whose future held closures over the batch was a reference cycle: ~7 objects of
    # cyclic garbage per record, and long full collections in the producer's process.
    got: list[Any] = []
    gc.collect()
    gc.disable()
    try:
        b = ProducerBatch("t", 0, 0)
        b.values += [b"a", b"b"]
        RecordFuture(b, 0).add_callback(lambda m, e: got.append(m.offset))
        RecordFuture(b, 1).add_callback(lambda m, e: got.append(m.offset))
        b.resolve(7)
        RecordFuture(b, 1).add_callback(lambda m, e: got.append(("late", m.offset)))  # runs at once
        ref = weakref.ref(b)
        del b
        assert ref() is None
    finally:
        gc.enable()
    assert got == [7, 8, ("late", 8)]


# -- retries and idempotence -----------------------------------------------------------------------


def test_retry_after_unavailable_reuses_the_batch_and_refreshes_metadata() -> None:
    broker = FakeBroker(script=[FakeRpcError(grpc.StatusCode.UNAVAILABLE, "broker 0 does not lead t[0]; the leader is x")])
    with make_producer(broker, retry_backoff_ms=1) as p:
        h = p.send("t", b"x")
        assert h.get(WAIT_S).offset == 0
        cluster = p.cluster
    first, second = broker.calls
    assert first.request.batch == second.request.batch  # same producer id, epoch and sequence
    assert cluster.invalidated == ["t"]  # type: ignore[attr-defined]


def test_lost_response_is_answered_as_duplicate_with_the_original_offset() -> None:
    broker = FakeBroker(auto=False)
    with make_producer(broker, retry_backoff_ms=1) as p:
        h = p.send("t", b"x")
        call = broker.wait_pending(1)[0]
        with broker.lock:
            broker.pending.remove(call)
        broker.append(call.request)  # the broker stored it ...
        call.finish(error=FakeRpcError(grpc.StatusCode.UNAVAILABLE, "connection reset"))  # ... the answer is lost
        broker.answer_next()
        assert h.get(WAIT_S).offset == 0
    assert broker.values("t", 0) == [b"x"]  # stored once


def test_permanent_failure_bumps_the_epoch_and_restarts_the_sequence() -> None:
    broker = FakeBroker(script=[FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT, "nope")])
    with make_producer(broker) as p:
        bad = p.send("t", b"a")
        p.flush(WAIT_S)
        good = p.send("t", b"b")
        p.flush(WAIT_S)
        with pytest.raises(InvalidArgumentError):
            bad.get(0)
        assert good.get(0).offset == 0
    h1, h2 = (c.header for c in broker.calls)
    assert (h1.producer_epoch, h1.base_sequence) == (0, 0)
    assert (h2.producer_epoch, h2.base_sequence) == (1, 0)


def test_out_of_order_sequence_bumps_the_epoch_and_retries() -> None:
    broker = FakeBroker(script=[
        FakeRpcError(
            grpc.StatusCode.FAILED_PRECONDITION,
            "producer 1 epoch 0: expected sequence 5, got 0",
            error_details.OUT_OF_ORDER_SEQUENCE,
        )
    ])
    with make_producer(broker) as p:
        assert p.send("t", b"a").get(WAIT_S).offset == 0
    h1, h2 = (c.header for c in broker.calls)
    assert (h1.producer_epoch, h2.producer_epoch, h2.base_sequence) == (0, 1, 0)


def test_fenced_producer_fails_the_batch() -> None:
    broker = FakeBroker(script=[
        FakeRpcError(grpc.StatusCode.FAILED_PRECONDITION, "producer 1 epoch 0 is fenced", error_details.PRODUCER_FENCED)
    ])
    with make_producer(broker) as p:
        h = p.send("t", b"a")
        p.flush(WAIT_S)
        with pytest.raises(errors.ProducerFencedError):
            h.get(0)


@pytest.mark.parametrize(
    ("reason", "text"),
    [
        (error_details.OUT_OF_ORDER_SEQUENCE, "producer 1 is fenced off from sequence 5"),  # the word alone
        (error_details.PRODUCER_FENCED, "producer 1 epoch 0: superseded"),  # no "fenced" in the text
    ],
)
def test_fencing_and_sequence_gaps_are_told_apart_by_the_reason_never_the_text(reason: str, text: str) -> None:
    broker = FakeBroker(script=[FakeRpcError(grpc.StatusCode.FAILED_PRECONDITION, text, reason)])
    with make_producer(broker) as p:
        h = p.send("t", b"a")
        if reason == error_details.PRODUCER_FENCED:
            p.flush(WAIT_S)
            with pytest.raises(errors.ProducerFencedError):
                h.get(0)
            assert len(broker.calls) == 1
        else:  # a sequence gap: a new epoch and a retry, which the fake broker accepts
            assert h.get(WAIT_S).offset == 0
            assert [c.header.producer_epoch for c in broker.calls] == [0, 1]


def test_a_reasonless_failed_precondition_is_neither_fenced_nor_a_sequence_gap() -> None:
    broker = FakeBroker(script=[FakeRpcError(grpc.StatusCode.FAILED_PRECONDITION, "producer 1 epoch 0 is fenced")])
    with make_producer(broker) as p:
        h = p.send("t", b"a")
        p.flush(WAIT_S)
        with pytest.raises(errors.FailedPreconditionError) as raised:
            h.get(0)
    assert not isinstance(raised.value, errors.ProducerFencedError | errors.OutOfOrderSequenceError)


def test_retriable_errors_stop_at_delivery_timeout() -> None:
    broker = FakeBroker(script=[FakeRpcError(grpc.StatusCode.UNAVAILABLE, "down")] * 1000)
    with make_producer(broker, retry_backoff_ms=5, retry_backoff_max_ms=5, delivery_timeout_ms=100,
                       request_timeout_ms=50) as p:
        h = p.send("t", b"a")
        with pytest.raises(DMQTimeoutError, match="delivery_timeout_ms"):
            h.get(WAIT_S)
    assert 2 <= len(broker.calls) < 1000


def test_retries_zero_fails_on_the_first_error() -> None:
    broker = FakeBroker(script=[FakeRpcError(grpc.StatusCode.UNAVAILABLE, "down")])
    with make_producer(broker, retries=0) as p:
        with pytest.raises(BrokerUnavailableError, match="down"):
            p.send("t", b"a").get(WAIT_S)


def test_non_idempotent_batches_carry_no_producer_id() -> None:
    broker = FakeBroker()
    with make_producer(broker, enable_idempotence=False) as p:
        p.send("t", b"a").get(WAIT_S)
    h = broker.calls[0].header
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (-1, -1, -1)


@pytest.mark.parametrize(("acks", "wire"), [("all", pb.ACKS_ALL), (1, pb.ACKS_LEADER), (0, pb.ACKS_NONE)])
def test_acks_setting_is_sent(acks: Any, wire: int) -> None:
    broker = FakeBroker()
    with make_producer(broker, acks=acks) as p:
        meta = p.send("t", b"a").get(WAIT_S)
    assert broker.calls[0].request.acks == wire
    assert meta.offset == (-1 if acks == 0 else 0)


def test_acks_zero_does_not_wait_for_the_broker() -> None:
    broker = FakeBroker(auto=False)
    with make_producer(broker, acks=0) as p:
        h = p.send("t", b"a")
        broker.wait_pending(1)
        assert h.get(WAIT_S).offset == -1  # resolved while the call is still pending
        broker.answer_next()


def test_close_with_acks_zero_waits_for_the_calls_in_flight() -> None:
    """acks=0 resolves a record's handle when its call is handed to gRPC; close() must still let
    that call finish, or closing the channel cancels it before the broker has it. Seen in a suite
    run under load (tests/integration/test_producer.py, acks=0: nothing stored)."""
    broker = FakeBroker(auto=False)
    p = make_producer(broker, acks=0)
    p.send("t", b"a").get(WAIT_S)
    broker.wait_pending(1)
    closer = threading.Thread(target=p.close, args=(WAIT_S,))
    closer.start()
    closer.join(0.3)
    assert closer.is_alive(), "close() returned while the acks=0 call was in flight"
    broker.answer_next()
    closer.join(WAIT_S)
    assert not closer.is_alive()
    assert broker.values("t", 0) == [b"a"]


@pytest.mark.parametrize("compression", ["zstd", "lz4", None])
def test_compression_codec_is_applied(compression: str | None) -> None:
    broker = FakeBroker()
    with make_producer(broker, compression=compression) as p:
        p.send("t", b"z" * 1000).get(WAIT_S)
    expected = {None: records.Codec.NONE, "zstd": records.Codec.ZSTD, "lz4": records.Codec.LZ4}[compression]
    assert broker.calls[0].header.codec == expected
    assert broker.values("t", 0) == [b"z" * 1000]


# -- send_many -----------------------------------------------------------------------------------


def test_send_many_sticky_keeps_input_order() -> None:
    broker = FakeBroker()
    values = [b"%05d" % i for i in range(5000)]
    with make_producer(broker, partitions={"t": 3}, batch_size=4096, buffer_memory=1 << 20) as p:
        fut = p.send_many("t", values)
        metas = fut.get(WAIT_S)
    assert len(fut) == len(metas) == 5000
    got = {(m.partition, m.offset): v for m, v in zip(metas, values)}
    for (part, off), v in got.items():
        assert broker.logs[("t", part)][off].value == v
    assert len(broker.calls) > 3  # split into batch-sized pieces


def test_send_many_keyed_groups_by_partition_and_returns_input_order() -> None:
    broker = FakeBroker()
    keys = [b"k%d" % (i % 17) for i in range(1000)]
    values = [b"v%d" % i for i in range(1000)]
    with make_producer(broker, partitions={"t": 5}) as p:
        metas = p.send_many("t", values, keys=keys).get(WAIT_S)
    for k, v, m in zip(keys, values, metas):
        assert m.partition == crc32_partition(k, 5)
        stored = broker.logs[("t", m.partition)][m.offset]
        assert (stored.key, stored.value) == (k, v)


def test_send_many_with_some_null_keys_keeps_each_partitions_input_order() -> None:
    broker = FakeBroker()
    keys: list[bytes | None] = [None if i % 3 == 0 else b"k%d" % (i % 7) for i in range(600)]
    values = [b"v%04d" % i for i in range(600)]
    with make_producer(broker, partitions={"t": 2}) as p:
        metas = p.send_many("t", values, keys=keys).get(WAIT_S)
    for part in (0, 1):
        stored = [r.value for r in broker.logs[("t", part)]]
        assert stored == sorted(stored), f"partition {part} holds records out of input order"
    assert sum(len(broker.logs[("t", part)]) for part in (0, 1)) == 600
    for k, m in zip(keys, metas):
        if k is not None:
            assert m.partition == crc32_partition(k, 2)


def test_send_many_explicit_partition_and_empty() -> None:
    broker = FakeBroker()
    with make_producer(broker, partitions={"t": 2}) as p:
        assert p.send_many("t", []).get(0) == []
        metas = p.send_many("t", [b"a", b"b"], partition=1).get(WAIT_S)
    assert [(m.partition, m.offset) for m in metas] == [(1, 0), (1, 1)]


# -- validation, memory, close -------------------------------------------------------------------


def test_send_validates_its_arguments() -> None:
    broker = FakeBroker()
    with make_producer(broker, max_record_bytes=1000, partitions={"t": 2}) as p:
        with pytest.raises(TypeError, match="serialise"):
            p.send("t", "text")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="key must be bytes"):
            p.send("t", b"v", key="k")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="header"):
            p.send("t", b"v", headers=[("k", "not bytes")])  # type: ignore[list-item]
        with pytest.raises(RecordTooLargeError, match="max_record_bytes"):
            p.send("t", b"x" * 1001)
        with pytest.raises(UnknownPartitionError, match="partitions 0..1"):
            p.send("t", b"v", partition=2)
        with pytest.raises(TopicNotFoundError):
            p.send("missing", b"v")
        assert p.send("t", bytearray(b"ok")).get(WAIT_S).offset == 0


def test_constructor_rejects_bad_settings() -> None:
    broker = FakeBroker()
    for kwargs in ({"acks": 2}, {"compression": "gzip"}, {"batch_size": 0}, {"buffer_memory": 10, "batch_size": 100}):
        with pytest.raises(ValueError):
            make_producer(broker, **kwargs)


def test_full_buffer_memory_blocks_then_times_out() -> None:
    broker = FakeBroker(auto=False)
    with make_producer(broker, batch_size=1024, buffer_memory=2048, max_block_ms=100) as p:
        p.send("t", b"x" * 900)
        broker.wait_pending(1)  # in flight, never answered: its memory stays taken
        p.send("t", b"x" * 900)
        t0 = time.monotonic()
        with pytest.raises(DMQTimeoutError, match="buffer_memory.*max_block_ms"):
            p.send("t", b"x" * 900)
        assert time.monotonic() - t0 >= 0.09
        broker.answer_next()
        broker.answer_next()
        p.flush(WAIT_S)
        assert p.metrics()["buffer_available_bytes"] == 2048


def test_buffer_pool_wakes_a_waiter_on_release() -> None:
    pool = BufferPool(100)
    pool.reserve(80, 0)
    threading.Timer(0.02, pool.release, args=(80,)).start()
    pool.reserve(50, 5_000)
    assert pool.available == 50
    with pytest.raises(RecordTooLargeError, match="buffer_memory"):
        pool.reserve(101, 0)


def test_close_with_zero_timeout_fails_what_is_pending_and_stops_the_thread() -> None:
    broker = FakeBroker(auto=False)
    p = make_producer(broker)
    h = p.send("t", b"x")
    broker.wait_pending(1)
    p.close(timeout=0)
    with pytest.raises(ClientClosedError, match="closed"):
        h.get(0)
    assert not p._sender.thread.is_alive()
    with pytest.raises(ClientClosedError, match="after close"):
        p.send("t", b"y")
    p.close()  # idempotent


def test_close_waits_for_in_flight_batches() -> None:
    broker = FakeBroker(auto=False)
    p = make_producer(broker)
    h = p.send("t", b"x")
    broker.wait_pending(1)
    threading.Timer(0.05, broker.answer_next).start()
    p.close(timeout=WAIT_S)
    assert h.get(0).offset == 0


def test_record_future_get_times_out() -> None:
    broker = FakeBroker(auto=False)
    with make_producer(broker) as p:
        h = p.send("t", b"x")
        with pytest.raises(DMQTimeoutError, match="not acknowledged"):
            h.get(0.01)
        broker.answer_next()
        assert h.get(WAIT_S).offset == 0


def test_a_record_appended_after_its_batch_was_sealed_is_resent() -> None:
    broker = FakeBroker()
    with make_producer(broker, linger_ms=60_000) as p:
        p.send("t", b"a")
        st = next(iter(p._acc.threads.values()))
        b = st.sticky["t"]
        with p._acc.lock:
            p._acc.seal(b)
        # the fast path appended "late" after the seal counted the records: index == count
        sealed_list = b.values
        sealed_list.append(b"late")
        late = p._raced(b, sealed_list, 1, b"late", None)
        # and one that the seal did count stays where it is
        counted = p._raced(b, sealed_list, 0, b"a", None)
        p.flush(WAIT_S)
        assert late.get(0).offset == 1 and counted.get(0).offset == 0
    assert broker.values("t", 0) == [b"a", b"late"]
    assert [c.header.record_count for c in broker.calls] == [1, 1]
    # once done the batch drops its records; an append racing that is never counted as sent
    assert b.values == []
    assert not (id(b.values) == b.values_id)


def test_many_threads_lose_and_duplicate_nothing() -> None:
    broker = FakeBroker()
    n_threads, per_thread = 4, 3000
    results: dict[int, list[Any]] = {}
    with make_producer(broker, partitions={"t": 3}, batch_size=2000, buffer_memory=1 << 20) as p:

        def work(t: int) -> None:
            results[t] = [p.send("t", b"%d-%d" % (t, i)) for i in range(per_thread)]

        threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(WAIT_S * 3)
        p.flush(WAIT_S)
    stored = [r.value for part in range(3) for r in broker.logs[("t", part)]]
    assert sorted(stored) == sorted(b"%d-%d" % (t, i) for t in range(n_threads) for i in range(per_thread))
    for t, handles in results.items():
        metas = [h.get(0) for h in handles]
        for m, i in zip(metas, range(per_thread)):
            assert broker.logs[("t", m.partition)][m.offset].value == b"%d-%d" % (t, i)
        # per thread and partition, offsets increase: each thread's order is kept
        by_part: dict[int, list[int]] = defaultdict(list)
        for m in metas:
            by_part[m.partition].append(m.offset)
        assert all(offs == sorted(offs) for offs in by_part.values())


def test_reprs_show_state() -> None:
    broker = FakeBroker(auto=False)
    with make_producer(broker) as p:
        h = p.send("t", b"x")
        assert "pending" in repr(h)
        assert "open" in repr(p) and "pending_batches=1" in repr(p)
        broker.answer_next()
        h.get(WAIT_S)
        assert "offset=0" in repr(h)
    assert "closed" in repr(p)
    assert repr(ProducerBatch("t", 3, 0)) == "<ProducerBatch t[3] open records=0 size=0>"


# -- error mapping -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "cls", "retriable", "invalid_metadata"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, errors.InvalidArgumentError, False, False),
        (grpc.StatusCode.NOT_FOUND, errors.NotFoundError, False, True),
        (grpc.StatusCode.ALREADY_EXISTS, errors.AlreadyExistsError, False, False),
        (grpc.StatusCode.FAILED_PRECONDITION, errors.FailedPreconditionError, False, False),
        (grpc.StatusCode.OUT_OF_RANGE, errors.OffsetOutOfRangeError, False, False),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, errors.ResourceExhaustedError, False, False),
        (grpc.StatusCode.UNAVAILABLE, errors.BrokerUnavailableError, True, True),
        (grpc.StatusCode.DEADLINE_EXCEEDED, errors.DMQTimeoutError, True, False),
        (grpc.StatusCode.CANCELLED, errors.RequestCancelledError, False, False),
        (grpc.StatusCode.INTERNAL, errors.UnknownServerError, False, False),
        (grpc.StatusCode.UNIMPLEMENTED, errors.UnsupportedError, False, False),
    ],
)
def test_status_codes_map_to_classes(code: grpc.StatusCode, cls: type, retriable: bool, invalid_metadata: bool) -> None:
    rpc = FakeRpcError(code, "server says why")
    err = from_rpc_error(rpc, context="Produce to t[0]")
    assert type(err) is cls
    assert isinstance(err, errors.DMQError)
    assert (err.retriable, err.invalid_metadata) == (retriable, invalid_metadata)
    assert str(err).startswith("Produce to t[0]: server says why")
    assert err.code == code.name and err.details == "server says why"
    assert err.__cause__ is rpc


def test_overrides_and_fallback() -> None:
    err = from_rpc_error(
        FakeRpcError(grpc.StatusCode.NOT_FOUND, "member m1 unknown"),
        overrides={grpc.StatusCode.NOT_FOUND: errors.UnknownMemberError},
    )
    assert isinstance(err, errors.UnknownMemberError) and not err.invalid_metadata

    class Weird(grpc.RpcError):
        def code(self) -> str:
            return "not a status"

        def details(self) -> None:
            return None

    fallback = from_rpc_error(Weird())
    assert type(fallback) is errors.UnknownServerError and str(fallback) == "unknown"
    timeout = from_rpc_error(FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, ""))
    assert "request_timeout_ms" in str(timeout)


def test_every_error_class_has_an_actionable_default_message() -> None:
    for name in errors.__all__:
        cls = getattr(errors, name)
        if isinstance(cls, type) and issubclass(cls, errors.DMQError):
            assert str(cls()), name
    assert "max_poll_interval_ms" in (errors.CommitFailedError.__doc__ or "")
    assert issubclass(NotLeaderError, BrokerUnavailableError) and NotLeaderError.retriable


def test_partition_errors_carry_the_log_bounds() -> None:
    err = from_partition_error(pb.OFFSET_OUT_OF_RANGE, "", "t", 2, log_start_offset=10, log_end_offset=20)
    assert isinstance(err, OffsetOutOfRangeError)
    assert (err.log_start_offset, err.log_end_offset) == (10, 20)
    assert "log start 10" in str(err) and "log end 20" in str(err)
    assert isinstance(from_partition_error(pb.NOT_LEADER, "moved", "t", 0), NotLeaderError)
    assert isinstance(from_partition_error(pb.UNKNOWN_TOPIC_OR_PARTITION, "", "t", 0), UnknownPartitionError)
    # issue 13: a transient storage error is retriable (it was an UnknownServerError)
    storage = from_partition_error(pb.STORAGE_ERROR, "disk", "t", 0)
    assert isinstance(storage, errors.StorageUnavailableError) and storage.retriable


# -- the metadata cache's parsing --------------------------------------------------------------------


def test_bootstrap_addresses_are_checked() -> None:
    from dmq.client._cluster import parse_address

    assert parse_address(" 127.0.0.1:9091 ") == "127.0.0.1:9091"
    assert parse_address("[::1]:9091") == "[::1]:9091"
    for bad in ("localhost", "host:", ":9091", "host:99999", "host:port"):
        with pytest.raises(ValueError, match="host:port"):
            parse_address(bad)


def test_topic_metadata_prefers_partitions_with_a_live_leader() -> None:
    info = pb.TopicInfo(
        name="t",
        partition_count=3,
        partitions=[
            pb.PartitionInfo(partition=0, leader_id=1, leader_address="a:1", leader_alive=True),
            pb.PartitionInfo(partition=2, leader_id=2, leader_address="b:2", leader_alive=False),
        ],
    )
    meta = TopicMetadata.from_proto(info, 0.0)
    assert meta.partition_count == 3
    assert meta.available == (0,)  # sticky batches avoid dead or unplaced partitions
    assert meta.partitions[1].leader_address == ""  # no placement known yet
    dead = TopicMetadata.from_proto(
        pb.TopicInfo(name="t", partition_count=2, partitions=[pb.PartitionInfo(partition=0, leader_address="a:1")]), 0.0
    )
    assert dead.available == (0, 1)  # none alive: use them all rather than nothing


@pytest.mark.parametrize(
    ("topic", "partition", "acks", "batch"),
    [("t", 0, pb.ACKS_ALL, b"x"), ("topic-\u00e9", 300, pb.ACKS_LEADER, b"y" * 200), ("a" * 249, 2**31 - 1, pb.ACKS_NONE, b"z" * 70_000)],
)
def test_hand_framed_produce_request_parses_as_the_message(topic: str, partition: int, acks: int, batch: bytes) -> None:
    from dmq.proto.wire import frame_produce_request

    framed = frame_produce_request(topic, partition, acks, batch)
    assert pb.ProduceRequest.FromString(framed) == pb.ProduceRequest(
        topic=topic, partition=partition, acks=acks, batch=batch
    )
