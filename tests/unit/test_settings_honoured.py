"""Issue 13, settings accepted but not honoured: each is refused when built, naming the setting,
instead of failing (or silently doing nothing) later."""

from __future__ import annotations

import concurrent.futures
import socket
import threading
import time
from typing import Any

import grpc
import pytest

from dmq.client.consumer import ConsumerConfig
from dmq.client.errors import DMQError, InvalidConfigError, NoBrokersAvailableError
from dmq.client.producer import Producer
from dmq.proto import dmq_pb2 as pb
from dmq.proto import records
from dmq.proto.grpc_options import MAX_FETCH_RESPONSE_BYTES
from tests.unit.test_producer_unit import WAIT_S, FakeBroker, FakeRpcError, make_producer


def test_a_delivery_timeout_shorter_than_linger_plus_request_timeout_is_refused() -> None:
    """Before: linger_ms=2000 with delivery_timeout_ms=1000 was accepted, and every batch expired
    the moment linger sealed it, never sent, on a healthy cluster."""
    with pytest.raises(ValueError, match=r"delivery_timeout_ms \(1000\) must be at least linger_ms \+ request_timeout_ms"):
        Producer("127.0.0.1:1", linger_ms=2_000, request_timeout_ms=500, delivery_timeout_ms=1_000)


def test_a_fetch_max_bytes_above_what_brokers_serve_is_refused() -> None:
    """Before: accepted, then every Fetch was refused by the broker and poll() returned nothing."""
    with pytest.raises(InvalidConfigError, match=f"fetch_max_bytes must be at most {MAX_FETCH_RESPONSE_BYTES}"):
        ConsumerConfig(metadata_service_url="127.0.0.1:1", group_id="g", fetch_max_bytes=100 * 1024 * 1024)
    ConsumerConfig(metadata_service_url="127.0.0.1:1", group_id="g", fetch_max_bytes=MAX_FETCH_RESPONSE_BYTES)


class _SequencedBroker(FakeBroker):
    """FakeBroker that checks idempotent sequences as a real broker does (producer_state.py): a
    batch that does not continue its producer's sequence is refused."""

    def __init__(self) -> None:
        super().__init__()
        self.next_sequence: dict[tuple[str, int, int, int], int] = {}

    def future(self, raw: bytes, timeout: float | None = None) -> Any:
        request = pb.ProduceRequest.FromString(raw)
        h = records.read_header(request.batch)
        with self.lock:
            scripted = bool(self.script)
        if not scripted and h.producer_id >= 0:
            key = (request.topic, request.partition, h.producer_id, h.producer_epoch)
            expected = self.next_sequence.get(key, 0)
            if h.base_sequence != expected:
                with self.lock:
                    self.script.insert(0, FakeRpcError(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"out of order sequence: expected {expected}, got {h.base_sequence}",
                    ))
            else:
                self.next_sequence[key] = expected + h.record_count
        return super().future(raw, timeout)


def test_acks_0_keeps_sending_after_a_lost_batch() -> None:
    """Before: acks=0 kept idempotence on; one batch lost to a transient error left a sequence gap,
    and the broker refused every later batch of the partition (dropped, as acks=0 reads no answer)."""
    broker = _SequencedBroker()
    broker.script = [FakeRpcError(grpc.StatusCode.UNAVAILABLE, "broker restarting")]
    with make_producer(broker, acks=0) as p:
        p.send("t", b"lost").get(WAIT_S)
        for i in range(3):
            p.send("t", b"v%d" % i).get(WAIT_S)
            p.flush(WAIT_S)
    assert broker.values("t", 0) == [b"v0", b"v1", b"v2"]


def test_idempotence_with_acks_0_is_refused() -> None:
    with pytest.raises(ValueError, match="enable_idempotence needs acks 'all' or 1"):
        Producer("127.0.0.1:1", acks=0, enable_idempotence=True)


def test_the_producer_counts_every_failed_record() -> None:
    """`dmq bench produce` reported errors only for the records it sampled for latency, so a run
    whose other batches failed reported 0 errors; the producer now counts every failed record."""
    broker = FakeBroker(script=[FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT, "refused")])
    with make_producer(broker, linger_ms=60_000) as p:
        for i in range(3):
            p.send("t", b"v%d" % i)  # no handle kept, no callback: nobody looks at them
        p.flush(WAIT_S)
        ok = p.send("t", b"ok")
        p.flush(WAIT_S)
        assert ok.get(0).offset == 0
        assert p.metrics()["records_failed"] == 3


class _NeverAnswer(grpc.GenericRpcHandler):
    """Every unary call is accepted and never answered, until `release` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        def hang(_request: bytes, _context: grpc.ServicerContext) -> bytes:
            self.release.wait()
            return b""

        return grpc.unary_unary_rpc_method_handler(hang)


def test_max_block_ms_bounds_send_when_the_coordinator_does_not_answer() -> None:
    """Before: the first metadata look-up waited a whole request_timeout_ms (10 s here) before
    max_block_ms (0.5 s) was looked at. A gRPC server whose calls never answer stands in for a
    hung coordinator. (A socket that never completes a connection fails the constructor with
    NoBrokersAvailableError, bounded by max_block_ms as well: the second half.)"""
    handler = _NeverAnswer()
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with Producer(f"127.0.0.1:{port}", max_block_ms=500, request_timeout_ms=10_000) as p:
            started = time.monotonic()
            with pytest.raises(DMQError):
                p.send("t", b"x")
            elapsed = time.monotonic() - started
    finally:
        handler.release.set()
        server.stop(0)
    assert elapsed < 3.0, f"send() blocked {elapsed:.1f} s with max_block_ms=500"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(16)
        started = time.monotonic()
        with pytest.raises(NoBrokersAvailableError):
            Producer("127.0.0.1:%d" % hole.getsockname()[1], max_block_ms=500, request_timeout_ms=10_000)
        elapsed = time.monotonic() - started
    assert elapsed < 3.0, f"the constructor blocked {elapsed:.1f} s with max_block_ms=500"
