"""EventAppendStream: event appends as messages on one long-lived bidirectional stream.

Why a stream: a unary call costs grpc.aio ~0.5 ms of server CPU before the handler runs, more
than a conditional append itself; a message on an open stream costs ~0.15-0.19 ms
(bench/grpc_stream_ceiling.py). So a client keeps one stream open per EventStore and sends each
append as a message on it, as Kafka's protocol pipelines requests on one connection.

Each message is one EventAppend, handled exactly as the unary call (`append(request)`, the
servicer's): the same readiness gate, the same field checks, and the same admission, per message:
the security interceptor authenticates, authorizes (WRITE on the message's own topic) and
throttles each request of the stream as the unary call it stands for
(SecurityInterceptor._wrap_request_stream), and hands a refused one over as a RefusedRequest,
answered here with its status; a message that does not decode ends the stream INVALID_ARGUMENT
naming its type (DecodeGuard).

Answers come in request order. A refused append is an answer carrying the status the unary call
would have ended with (status_code, status_message, and its trailing metadata as status_metadata:
the reason, the conflicting position of a failed condition) and nothing of it is stored; the
stream goes on. The stream itself ends with a status only when it cannot go on:

  - too many streams (per connection, `streams_per_connection_max`; per broker, `streams_max`):
    RESOURCE_EXHAUSTED (reason server-busy) before any message is read;
  - idle (no message read for `idle_timeout_s`) or the broker stopping (`close()`): the stream
    stops reading, answers what it read, and ends OK. So when a stream ends OK, every request it
    did not answer was never handled and nothing of it was stored: a client may send those again
    on a new stream.

One message at a time per stream: read, appended, answered, and only then the next read, so a
stream's appends are stored in the order they were sent (a client sending ahead finds its later
conditions checked against its earlier appends) and at most one is in flight per stream; what a
client sends ahead waits in gRPC's flow-control window. (Appends taken concurrently, a task each,
were reordered by the awaits before the store's append lock; no CPU was saved by them either.)
Bounds: one message in flight per stream, the stream counts above, and the idle timeout.
Ownership: a stream has no task of its own, only its call's handler; `close()` (BrokerNode.stop)
ends every stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import structlog

from dmq.proto import dmq_pb2 as pb
from dmq.proto import error_details
from dmq.proto.names import cap_message
from dmq.proto.server.security.interceptor import RefusedRequest
from dmq.proto.server.server_errors import RpcAbort

__all__ = ["AppendStreams", "STREAMS_PER_CONNECTION_MAX", "STREAMS_MAX", "IDLE_TIMEOUT_S"]

log = structlog.get_logger(__name__)

# Open append streams per client connection (one peer address and port) and per broker. A client
# needs one per EventStore; the per-broker bound keeps the reader tasks bounded.
STREAMS_PER_CONNECTION_MAX = 64
STREAMS_MAX = 4_096
# A stream with no message read for this long ends (OK, after its answers); its client opens a new one.
IDLE_TIMEOUT_S = 300.0
# How long close() waits for the streams to answer what they read before leaving them to grpc's stop.
CLOSE_WAIT_S = 5.0


# what the handler reads: a request, or one the security interceptor refused
Request = pb.EventAppendRequest | RefusedRequest
Append = Callable[[pb.EventAppendRequest], Awaitable[pb.EventAppendResponse]]
# (exception, request) -> the status it is answered with (the servicer's rpc_handler mapping)
ErrorStatus = Callable[[Exception, Any], RpcAbort]


def refused(status: RpcAbort) -> pb.EventAppendResponse:
    """The answer of a refused append: the unary call's status as data."""
    return pb.EventAppendResponse(
        status_code=status.code.value[0],
        status_message=cap_message(status.message),
        status_metadata=[pb.Attribute(name=k, value=v) for k, v in status.trailing_metadata()],
    )


class _Stream:
    """One open append stream, served by its call's handler: read a message, append, answer, then
    read the next (no task of its own)."""

    def __init__(self, owner: AppendStreams, requests: AsyncIterator[Request], peer: str) -> None:
        self._owner = owner
        self._requests = requests
        self.peer = peer
        self.reading: asyncio.Timeout | None = None  # the idle timeout of the read in progress
        self.stopped = False

    def __repr__(self) -> str:
        return f"<AppendStream peer={self.peer} reading={self.reading is not None} stopped={self.stopped}>"

    async def answers(self) -> AsyncIterator[pb.EventAppendResponse]:
        owner = self._owner
        requests = self._requests.__aiter__()
        while not self.stopped:
            try:
                # Idle: nothing read for idle_timeout_s (or stop() cut the read short). A read cut
                # short may have taken a message off the wire that is then never handled, which a
                # client tells by the stream ending OK with it unanswered (module docstring).
                async with asyncio.timeout(owner.idle_timeout_s) as self.reading:
                    request = await requests.__anext__()
            except TimeoutError:
                if not self.stopped:
                    log.info("idle event append stream closed", peer=self.peer)
                return
            except StopAsyncIteration:
                return  # the client half-closed: all answered, OK
            finally:
                self.reading = None
            yield await self._answer(request)

    def stop(self) -> None:
        """End the stream cleanly: the read in progress is cut short (an append in progress is
        answered first), nothing more is read, then OK."""
        self.stopped = True
        if self.reading is not None:
            self.reading.reschedule(asyncio.get_running_loop().time())

    async def _answer(self, request: Request) -> pb.EventAppendResponse:
        """One message's answer: never raises (but for cancellation)."""
        if isinstance(request, RefusedRequest):  # the security interceptor's refusal of this one
            return refused(RpcAbort(request.code, request.message))
        try:
            return await self._owner.append(request)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - answered with its status; the stream goes on
            return refused(self._owner.error_status(e, request))


class AppendStreams:
    """The broker's open append streams: their bounds, and close() ending them all."""

    def __init__(
        self,
        append: Append,
        error_status: ErrorStatus,
        *,
        streams_per_connection_max: int = STREAMS_PER_CONNECTION_MAX,
        streams_max: int = STREAMS_MAX,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
    ) -> None:
        if min(streams_per_connection_max, streams_max) < 1 or idle_timeout_s <= 0:
            raise ValueError("streams_per_connection_max and streams_max must be >= 1, idle_timeout_s > 0")
        self.append = append
        self.error_status = error_status
        self.streams_per_connection_max = streams_per_connection_max
        self.streams_max = streams_max
        self.idle_timeout_s = idle_timeout_s
        self._streams: set[_Stream] = set()
        self._per_peer: dict[str, int] = {}
        self._closing = False

    def __repr__(self) -> str:
        return f"<AppendStreams open={len(self._streams)} connections={len(self._per_peer)} closing={self._closing}>"

    @property
    def open_count(self) -> int:
        return len(self._streams)

    async def serve(
        self, requests: AsyncIterator[Request], context: grpc.aio.ServicerContext[Any, pb.EventAppendResponse]
    ) -> AsyncIterator[pb.EventAppendResponse]:
        """The call's handler: answers until the stream ends (see the module docstring)."""
        peer = context.peer() or ""
        if self._closing:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the broker is stopping; append at the new leader")
        if len(self._streams) >= self.streams_max or self._per_peer.get(peer, 0) >= self.streams_per_connection_max:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"too many event append streams: {self._per_peer.get(peer, 0)} on this connection (the limit is "
                f"{self.streams_per_connection_max}), {len(self._streams)} on this broker (the limit is "
                f"{self.streams_max}); close EventStores you do not use, or share one",
                trailing_metadata=((error_details.REASON_KEY, error_details.BUSY),),
            )
        stream = _Stream(self, requests, peer)
        self._streams.add(stream)
        self._per_peer[peer] = self._per_peer.get(peer, 0) + 1
        try:
            async for answer in stream.answers():
                yield answer
        finally:
            self._streams.discard(stream)
            left = self._per_peer.pop(peer, 1) - 1
            if left:
                self._per_peer[peer] = left

    async def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Stop every stream reading (they answer what they read and end OK); new ones are refused.
        Waits up to `wait_s` for them to end (a client not reading its answers is left to grpc's stop)."""
        self._closing = True
        for stream in list(self._streams):
            stream.stop()
        deadline = asyncio.get_running_loop().time() + wait_s
        while self._streams and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
