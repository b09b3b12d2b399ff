"""EventStore.append over one long-lived EventAppendStream (issue 30): each append is a message
on an open stream and its answer, instead of a unary call, so gRPC's per-call cost (call set-up,
metadata, a task on the broker) is paid once per stream, not per append.

The stream is one broker's (the topic's leader when it was opened) and lives at most
`lifetime_s`: it is opened with that deadline, and used only by appends that start in its
first half, so an append waits at most `lifetime_s` (twice request_timeout_ms) and at least
half of it before the deadline ends it; later ones open the next stream. One append at a time
uses it (the caller holds `EventStore._stream_lock`); the others take the unary call.

A refused append comes back in the answer's status fields (`status_of`), which the caller
turns into its DMQError exactly as a unary EventAppend's status; the stream goes on. A broken
stream raises grpc.RpcError from `send` and is not used again.
"""

from __future__ import annotations

import queue
import time
from typing import Any

import grpc

from dmq.proto import dmq_pb2 as pb

__all__ = ["AppendStream", "AnswerStatus"]

_END = object()  # ends the request iterator (close)


class AnswerStatus(grpc.RpcError):
    """A refused append's status on the stream, shaped as the grpc.RpcError a unary EventAppend
    raises (code, details, trailing metadata): what dmq.client.errors.from_rpc_error reads."""

    def __init__(self, answer: pb.EventAppendResponse) -> None:
        super().__init__(answer.status_message)
        codes = {c.value[0]: c for c in grpc.StatusCode}
        self._code = codes.get(answer.status_code, grpc.StatusCode.UNKNOWN)
        self._details = answer.status_message
        self._trailing = tuple((m.name, m.value) for m in answer.status_metadata)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> Any:  # (key, value) pairs, as grpc's (typed by grpc-stubs as its _Metadatum)
        return self._trailing


class StreamEnded(grpc.RpcError):
    """The broker ended the stream without an answer (it is stopping): UNAVAILABLE."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "the broker ended the append stream (stopping?); append again"

    def trailing_metadata(self) -> Any:
        return ()


class AppendStream:
    def __init__(self, stub: Any, address: str, lifetime_s: float) -> None:
        self.address = address
        self.renew_at = time.monotonic() + lifetime_s / 2
        self._requests: queue.SimpleQueue[object] = queue.SimpleQueue()
        # grpc's sync stream call reads the requests from this iterator in a thread of its own
        self._call = stub.EventAppendStream(iter(self._requests.get, _END), timeout=lifetime_s)

    def __repr__(self) -> str:
        return f"<AppendStream {self.address} renew_in_s={self.renew_at - time.monotonic():.1f}>"

    def usable(self, address: str) -> bool:
        # done(): the broker ended it (idle, or stopping) while no append was on it
        return address == self.address and time.monotonic() < self.renew_at and not self._call.done()

    def send(self, request: pb.EventAppendRequest) -> pb.EventAppendResponse:
        """One append and its answer (grpc.RpcError when the stream broke)."""
        self._requests.put(request)
        try:
            answer: pb.EventAppendResponse = next(self._call)
        except StopIteration:
            raise StreamEnded() from None
        return answer

    def close(self) -> None:
        self._requests.put(_END)
        self._call.cancel()
