"""An EventStore's appends as messages on one open EventAppendStream (broker/events/append_stream.py).

A unary call costs the broker ~0.5 ms of CPU before any work and the client about as much; a
message on an open stream a third of that. So `AppendStream` opens one stream to the store's
leader when the first append needs it and sends every append on it:

  - one append at a time: `append()` holds a lock from sending to reading its answer, so answers
    pair with requests whichever thread appends (threads sharing an EventStore take turns);
  - a deadline per append (request_timeout_ms): a watchdog thread, started with the first stream
    and stopped by close(), cancels the call when the append in flight is past its deadline
    (the sync gRPC API has no timeout for one message); the append raises DMQTimeoutError, its
    outcome unknown, as a unary call's DEADLINE_EXCEEDED;
  - a refused append (the answer carries a status) raises the DMQError the unary call would
    have raised; one saying the metadata is stale (NOT_LEADER, a gone broker) marks it stale and
    drops the stream, so the next append opens one at the leader the fresh metadata names;
  - the stream failing with an append in flight raises its error (the append's outcome is
    unknown: never sent again, as the unary path never retries an append); the next append
    opens a new stream. Sent again, after the retry policy's pause and within the deadline, is
    only what was surely not stored: a stream that ended OK without answering it (the broker
    ends an idle stream, or its own stop, only after answering everything it read), a stream
    already over before it was sent, a connection that could not be made;
  - a broker answering UNIMPLEMENTED (older than the stream) gets this append and every later
    one as the unary EventAppend (`unary`).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from dmq.client._calls import RetryPolicy
from dmq.client._log import get_logger
from dmq.client.errors import DMQError, DMQTimeoutError, TopicNotFoundError, from_rpc_error, is_connect_failure
from dmq.proto import dmq_pb2 as pb

__all__ = ["AppendStream"]

log = get_logger(__name__)

_CODES = {c.value[0]: c for c in grpc.StatusCode}
_STALE_CODES = frozenset({grpc.StatusCode.NOT_FOUND.name, grpc.StatusCode.UNAVAILABLE.name})
_OVERRIDES = {grpc.StatusCode.NOT_FOUND: TopicNotFoundError}
_CLOSE: Any = object()  # the request iterator's end: half-closes the stream
# The watchdog checks the append in flight this often at most (and at least ten times per timeout).
WATCH_INTERVAL_MAX_S = 0.25


class _Refusal:
    """An answer's status in the shape dmq.client.errors.from_rpc_error reads (an RpcError's)."""

    __slots__ = ("_answer",)

    def __init__(self, answer: pb.EventAppendResponse) -> None:
        self._answer = answer

    def code(self) -> grpc.StatusCode:
        return _CODES.get(self._answer.error_code, grpc.StatusCode.UNKNOWN)

    def details(self) -> str:
        return self._answer.error_message

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return tuple((a.name, a.value) for a in self._answer.error_metadata)


class _Unread(Exception):
    """The append was surely not stored (see the module docstring): it may be sent again."""


class _Unimplemented(Exception):
    """The broker has no EventAppendStream."""


class AppendStream:
    def __init__(
        self,
        cluster: Any,
        topic: str,
        unary: Callable[[pb.EventAppendRequest], pb.EventAppendResponse],
    ) -> None:
        self._cluster = cluster  # a dmq.client._cluster.Cluster
        self._topic = topic
        self._unary = unary
        self._policy: RetryPolicy = cluster.retry
        self._lock = threading.Lock()  # one append in flight: its answer is the next one read
        self._call: Any = None  # the open stream (a grpc rendezvous: an iterator of answers)
        self._requests: queue.SimpleQueue[Any] | None = None
        self._address: str | None = None
        self._unsupported: set[str] = set()  # brokers that answered UNIMPLEMENTED
        self._deadline = 0.0  # the append in flight gives up then (time.monotonic()); 0: none
        self._cancelled_for = 0.0  # the deadline the watchdog cancelled the call for
        self._closed = threading.Event()
        self._watchdog: threading.Thread | None = None

    def __repr__(self) -> str:
        return (f"<AppendStream topic={self._topic!r} address={self._address!r} open={self._call is not None} "
                f"unary_brokers={sorted(self._unsupported)}>")

    def close(self) -> None:
        """End the stream (an append in flight fails) and the watchdog."""
        self._closed.set()
        call = self._call
        if call is not None:
            call.cancel()
        with self._lock:
            self._drop()
        if self._watchdog is not None and self._watchdog is not threading.current_thread():
            self._watchdog.join()

    # -- appending --------------------------------------------------------------------------------

    def append(self, request: pb.EventAppendRequest) -> pb.EventAppendResponse:
        deadline = self._policy.deadline()
        retry = 0
        with self._lock:
            while True:
                if self._closed.is_set():
                    raise DMQError(f"EventAppend on {self._topic}: the EventStore is closed")
                address = self._cluster.leader_for(self._topic, 0)
                if address in self._unsupported:
                    return self._unary(request)
                try:
                    return self._send(address, request, deadline)
                except _Unimplemented:
                    log.info("the broker has no EventAppendStream; appending with unary calls", address=address)
                    self._unsupported.add(address)
                    return self._unary(request)
                except _Unread as e:
                    retry += 1
                    pause_s = self._policy.backoff_s(retry)
                    if time.monotonic() + pause_s >= deadline:
                        raise DMQTimeoutError(f"EventAppend on {self._topic} at {address}: not sent within "
                                              f"request_timeout_ms ({e})", code="DEADLINE_EXCEEDED") from None
                    if retry > 1:  # the first resend (a stream that had ended) needs no pause
                        time.sleep(pause_s)

    def _send(self, address: str, request: pb.EventAppendRequest, deadline: float) -> pb.EventAppendResponse:
        call = self._call
        if call is None or self._address != address or call.done():
            self._drop()
            call = self._open(address)
        assert self._requests is not None
        self._deadline = deadline
        self._requests.put(request)
        try:
            answer: pb.EventAppendResponse = next(call)
        except StopIteration:  # ended OK without answering it: it was never read
            self._drop()
            raise _Unread("the stream ended before the broker read the append") from None
        except grpc.RpcError as e:
            self._drop()
            code = e.code() if callable(getattr(e, "code", None)) else None
            if code == grpc.StatusCode.UNIMPLEMENTED:
                raise _Unimplemented() from None
            if code == grpc.StatusCode.CANCELLED and self._cancelled_for == deadline:
                raise DMQTimeoutError(f"EventAppend on {self._topic} at {address}: no answer within request_timeout_ms "
                                      "(the append may or may not be stored)", code="DEADLINE_EXCEEDED") from None
            err = from_rpc_error(e, context=f"EventAppend on {self._topic} at {address}", overrides=_OVERRIDES)
            if err.code == grpc.StatusCode.UNAVAILABLE.name and is_connect_failure(err.details):
                self._cluster.invalidate(self._topic)
                raise _Unread(str(err)) from None  # no connection: nothing was sent
            if err.invalid_metadata or err.code in _STALE_CODES:
                self._cluster.invalidate(self._topic)
            raise err from None
        finally:
            self._deadline = 0.0
        if answer.error_code:
            refusal: Any = _Refusal(answer)  # an RpcError's shape: what from_rpc_error reads
            err = from_rpc_error(refusal, context=f"EventAppend on {self._topic} at {address}", overrides=_OVERRIDES)
            if err.invalid_metadata or err.code in _STALE_CODES:
                self._cluster.invalidate(self._topic)
                self._drop()  # the next append asks where the leader is now
            raise err
        return answer

    # -- the stream -------------------------------------------------------------------------------

    def _open(self, address: str) -> Any:
        requests: queue.SimpleQueue[Any] = queue.SimpleQueue()

        def feed() -> Iterator[pb.EventAppendRequest]:
            while (item := requests.get()) is not _CLOSE:
                yield item

        call = self._cluster.broker_stub(address).EventAppendStream(feed())
        self._call, self._requests, self._address = call, requests, address
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch, name=f"dmq-event-append-{self._topic}", daemon=True)
            self._watchdog.start()
        return call

    def _drop(self) -> None:
        """Forget the stream: its request iterator ends, the call is cancelled (a no-op when over)."""
        call, requests = self._call, self._requests
        self._call = self._requests = self._address = None
        if requests is not None:
            requests.put(_CLOSE)
        if call is not None:
            call.cancel()

    def _watch(self) -> None:
        interval_s = min(WATCH_INTERVAL_MAX_S, self._policy.timeout_s / 10)
        while not self._closed.wait(interval_s):
            deadline, call = self._deadline, self._call
            if deadline and call is not None and time.monotonic() > deadline:
                self._cancelled_for = deadline
                call.cancel()
