"""More than one Produce in flight per partition (max_in_flight_requests_per_connection, issue 31).

A fake broker with the real broker's sequence rules (dmq.broker.log.producer_state: a batch is
appended only right after its producer's previous one, a retry of one of the last 5 is a
duplicate answered with its original offset, a gap is OUT_OF_ORDER_SEQUENCE) answers the
producer's calls in whatever order the test chooses, as a real broker may (its handlers
interleave). What must hold: the log holds every batch once, in seal order; futures and callbacks
complete in seal order; an OUT_OF_ORDER_SEQUENCE for a batch whose predecessor is still being
retried is retried after it, without an epoch bump.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import grpc
import pytest

from dmq.client import errors
from dmq.client.producer import Producer
from dmq.proto import dmq_pb2 as pb
from dmq.proto import error_details, records
from tests.unit.test_producer_unit import WAIT_S, FakeBroker, FakeCall, FakeRpcError, make_producer


class SequencedBroker(FakeBroker):
    """FakeBroker (auto=False) whose append checks sequences like the real broker."""

    def __init__(self) -> None:
        super().__init__(auto=False)
        # producer id -> (epoch, [(first_seq, last_seq, base_offset)] of the last 5 batches)
        self.state: dict[int, tuple[int, list[tuple[int, int, int]]]] = {}

    def append(self, request: pb.ProduceRequest) -> pb.ProduceResponse:
        batch = records.decode(request.batch)
        h = batch.header
        with self.lock:
            epoch, cached = self.state.get(h.producer_id, (h.producer_epoch, []))
            last = h.base_sequence + h.record_count - 1
            if h.producer_epoch == epoch:
                for first_seq, last_seq, base in cached:
                    if (first_seq, last_seq) == (h.base_sequence, last):
                        return pb.ProduceResponse(base_offset=base, duplicate=True)
                if cached and h.base_sequence != cached[-1][1] + 1:
                    raise FakeRpcError(grpc.StatusCode.FAILED_PRECONDITION,
                                       f"expected sequence {cached[-1][1] + 1}, got {h.base_sequence}",
                                       error_details.OUT_OF_ORDER_SEQUENCE)
            elif h.producer_epoch < epoch:
                raise FakeRpcError(grpc.StatusCode.FAILED_PRECONDITION, "fenced", error_details.PRODUCER_FENCED)
            elif h.base_sequence != 0:
                raise FakeRpcError(grpc.StatusCode.FAILED_PRECONDITION, "new epoch must start at 0",
                                   error_details.OUT_OF_ORDER_SEQUENCE)
            else:
                cached = []
            log = self.logs[(request.topic, request.partition)]
            base = len(log)
            log.extend(r._replace(offset=base + i) for i, r in enumerate(batch))
            self.state[h.producer_id] = (h.producer_epoch, (cached + [(h.base_sequence, last, base)])[-5:])
        return pb.ProduceResponse(base_offset=base)

    def take(self, call: FakeCall) -> None:
        with self.lock:
            self.pending.remove(call)

    def answer(self, call: FakeCall) -> None:
        """Answer a pending call as the broker would (stored, duplicate, or refused)."""
        self.take(call)
        try:
            response = self.append(call.request)
        except FakeRpcError as e:
            call.finish(error=e)
        else:
            call.finish(response)

    def fail(self, call: FakeCall, error: BaseException, store: bool = False) -> None:
        """Answer a pending call with `error`; with store=True the batch was stored first (the
        answer was lost, e.g. the in-sync replicas were too slow)."""
        self.take(call)
        if store:
            self.append(call.request)
        call.finish(error=error)


UNAVAILABLE = FakeRpcError(grpc.StatusCode.UNAVAILABLE, "the leader is moving")


def _confirmed_producer(broker: SequencedBroker, **kwargs: Any) -> Producer:
    """A producer whose partition "t"[0] has one acknowledged batch ("b0"): until then it sends
    one batch at a time (the broker may not know its sequence yet)."""
    p = make_producer(broker, batch_size=500, buffer_memory=100_000, retry_backoff_ms=1, retry_backoff_max_ms=1,
                      **kwargs)
    first = p.send("t", b"b0")
    broker.answer(broker.wait_pending(1)[0])
    assert first.get(WAIT_S).offset == 0
    return p


def _send_three(p: Producer, broker: SequencedBroker, order: list[int]) -> list[Any]:
    handles = []
    for i in (1, 2, 3):
        h = p.send("t", b"b%d" % i)
        h.add_callback(lambda md, exc, i=i: order.append(i))
        handles.append(h)
        broker.wait_pending(i)  # sealed and sent while the earlier ones are in flight
    calls = broker.wait_pending(3)
    assert [(c.header.producer_epoch, c.header.base_sequence) for c in calls] == [(0, 1), (0, 2), (0, 3)]
    return handles


def _answer_until_done(broker: SequencedBroker, handles: list[Any]) -> None:
    """Answer whatever the producer sends (retries), one call at a time, until all are done."""
    for _ in range(50):
        deadline = time.monotonic() + WAIT_S
        with broker.arrived:
            # handles complete on the sender thread, which does not notify `arrived`: look often
            while not (broker.pending or all(h.done() for h in handles)) and time.monotonic() < deadline:
                broker.arrived.wait(0.005)
            call = broker.pending[0] if broker.pending else None
        if call is None:
            assert all(h.done() for h in handles), "neither a call nor the records' answers came"
            return
        broker.answer(call)
    raise AssertionError("the records were not acknowledged after 50 answers")


@pytest.mark.parametrize("first_failure_last", [False, True])
def test_first_of_three_in_flight_fails_the_later_two_are_refused_then_all_land_in_order(
    first_failure_last: bool,
) -> None:
    broker = SequencedBroker()
    order: list[int] = []
    with _confirmed_producer(broker) as p:
        handles = _send_three(p, broker, order)
        c1, c2, c3 = broker.wait_pending(3)
        if first_failure_last:  # the answers come back in reverse order
            broker.answer(c3)
            broker.answer(c2)
            broker.fail(c1, UNAVAILABLE)
        else:
            broker.fail(c1, UNAVAILABLE)  # not stored: retriable
            broker.answer(c2)  # the broker's gate gave up waiting for batch 1: OUT_OF_ORDER_SEQUENCE
            broker.answer(c3)
        handles.append(p.send("t", b"b4"))  # a fresh batch behind the retries
        _answer_until_done(broker, handles)
        assert [h.get(WAIT_S).offset for h in handles] == [1, 2, 3, 4]
    assert broker.values("t", 0) == [b"b0", b"b1", b"b2", b"b3", b"b4"]  # in order, none twice
    assert order == [1, 2, 3]
    # refused for a predecessor still being retried: no epoch bump (the sequence stays)
    assert {c.header.producer_epoch for c in broker.calls} == {0}


def test_answers_out_of_order_complete_the_futures_in_seal_order() -> None:
    broker = SequencedBroker()
    order: list[int] = []
    with _confirmed_producer(broker) as p:
        handles = _send_three(p, broker, order)
        c1, c2, c3 = broker.wait_pending(3)
        broker.fail(c1, UNAVAILABLE, store=True)  # stored, its answer lost
        broker.answer(c2)
        broker.answer(c3)
        assert broker.values("t", 0) == [b"b0", b"b1", b"b2", b"b3"]
        retry = broker.wait_pending(1)[0]  # batch 1 again, same sequence
        assert (retry.header.producer_epoch, retry.header.base_sequence) == (0, 1)
        assert order == [] and not any(h.done() for h in handles)  # 2 and 3 wait for 1
        broker.answer(retry)  # a duplicate: its original offset
        assert [h.get(WAIT_S).offset for h in handles] == [1, 2, 3]
    assert broker.values("t", 0) == [b"b0", b"b1", b"b2", b"b3"]
    assert order == [1, 2, 3]


def test_pipelining_keeps_up_to_the_setting_in_flight() -> None:
    broker = SequencedBroker()
    with _confirmed_producer(broker, max_in_flight_requests_per_connection=2) as p:
        handles = []
        for i in range(4):
            handles.append(p.send("t", b"x%d" % i))
            broker.wait_pending(min(i + 1, 2))
        threading.Event().wait(0.05)  # the sender had time to send a third: it must not
        assert len(broker.pending) == 2
        _answer_until_done(broker, handles)
    assert broker.values("t", 0) == [b"b0", b"x0", b"x1", b"x2", b"x3"]


def test_a_new_partition_sends_one_batch_until_the_first_is_acknowledged() -> None:
    broker = SequencedBroker()
    with make_producer(broker, batch_size=500, buffer_memory=100_000) as p:
        handles = [p.send("t", b"x%d" % i) for i in range(3)]
        broker.wait_pending(1)
        threading.Event().wait(0.05)
        assert len(broker.pending) == 1  # the broker may not know this producer's sequence yet
        _answer_until_done(broker, handles)
    assert broker.values("t", 0) == [b"x0", b"x1", b"x2"]


@pytest.mark.parametrize("value", [0, 6, -1, 2.0, True, "5"])
def test_max_in_flight_is_checked(value: Any) -> None:
    with pytest.raises(errors.InvalidConfigError, match="max_in_flight_requests_per_connection"):
        make_producer(FakeBroker(), max_in_flight_requests_per_connection=value)


def test_max_in_flight_defaults() -> None:
    from dmq.client._producer_core import check_settings

    common = dict(compression=None, linger_ms=0, batch_size=1000, buffer_memory=10_000, max_block_ms=0, retries=0,
                  retry_backoff_ms=0, retry_backoff_max_ms=0, request_timeout_ms=1000, delivery_timeout_ms=2000,
                  max_record_bytes=None)
    assert check_settings(acks="all", enable_idempotence=None, **common) == (True, 5)
    assert check_settings(acks=0, enable_idempotence=None, **common) == (False, 1)
    assert check_settings(acks=1, enable_idempotence=False, **common) == (False, 1)
    assert check_settings(acks=1, enable_idempotence=False, max_in_flight_requests_per_connection=3, **common) == (
        False, 3)


def test_a_later_batch_failing_for_good_does_not_re_encode_an_earlier_one_awaiting_its_retry() -> None:
    # Seen in the fault test: batch 1's answer was lost (it is stored), batch 2 then failed for
    # good; bumping the epoch there re-encoded batch 1 at sequence 0 and stored it twice.
    broker = SequencedBroker()
    with _confirmed_producer(broker) as p:
        one = p.send("t", b"b1")
        broker.wait_pending(1)
        two = p.send("t", b"b2")
        c1, c2 = broker.wait_pending(2)
        broker.fail(c1, UNAVAILABLE, store=True)
        broker.fail(c2, FakeRpcError(grpc.StatusCode.CANCELLED, "the broker went away"))
        _answer_until_done(broker, [one, two])
        assert one.get(WAIT_S).offset == 1
        with pytest.raises(errors.DMQError):
            two.get(0)
        three = p.send("t", b"b3")  # after the gap batch 2 left: refused, epoch bumped, stored
        _answer_until_done(broker, [three])
        assert three.get(WAIT_S).offset == 2
    assert broker.values("t", 0) == [b"b0", b"b1", b"b3"]
