"""EventAppendStream: event appends as messages on one long-lived bidirectional stream.

Why a stream: a unary call costs grpc.aio ~0.5 ms of server CPU before the handler runs, more
than a conditional append itself; a message on an open stream costs ~0.15-0.19 ms
(bench/grpc_stream_ceiling.py). So a client keeps one stream open per EventStore and sends each
append as a message on it, as Kafka's protocol pipelines requests on one connection.

Each message is one EventAppend, handled exactly as the unary call (`append(request)`, the
servicer's): the same readiness gate, the same field checks, and the same authorization, per
message: the stream's call is authenticated by the security interceptor (its RPC table rule is
Access.HANDLER), and each message's own topic needs WRITE (`current_access`, the interceptor's
decision with the ACLs as they are now), checked before the store is touched; the principal's
quotas are charged per message (requests, and the message's bytes as produce bytes).

Answers come in request order. A refused append is an answer carrying the status the unary call
would have ended with (error_code, error_message, and its trailing metadata as error_metadata:
the reason, the conflicting position of a failed condition) and nothing of it is stored; the
stream goes on. A message that does not decode is answered INVALID_ARGUMENT naming the message
type. The stream itself ends with a status only when it cannot go on:

  - too many streams (per connection, `streams_per_connection_max`; per broker, `streams_max`):
    RESOURCE_EXHAUSTED (reason server-busy) before any message is read;
  - idle (no message read for `idle_timeout_s`) or the broker stopping (`close()`): the stream
    stops reading, answers what it read, and ends OK. So when a stream ends OK, every request it
    did not answer was never handled and nothing of it was stored: a client may send those again
    on a new stream.

Bounds: at most `in_flight_max` messages read and not yet answered per stream (the next is not
read until an answer goes out; gRPC's flow control then holds the client), the stream counts
above, and the idle timeout. Ownership: each stream's reader task belongs to its call's handler,
which cancels and awaits it when the call ends for any reason; `close()` (BrokerNode.stop) ends
every stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import structlog
from google.protobuf.message import DecodeError

from dmq.proto import dmq_pb2 as pb
from dmq.proto import error_details
from dmq.proto.names import cap_message
from dmq.proto.security.acls import Operation, ResourceType
from dmq.proto.server.security.interceptor import CallAccess, current_access
from dmq.proto.server.security.rpc_table import Need
from dmq.proto.server.server_errors import RpcAbort

__all__ = ["AppendStreams", "IN_FLIGHT_MAX", "STREAMS_PER_CONNECTION_MAX", "STREAMS_MAX", "IDLE_TIMEOUT_S"]

log = structlog.get_logger(__name__)

RPC = "EventAppendStream"
# Messages read and not yet answered, per stream: a client pipelining more waits on flow control.
IN_FLIGHT_MAX = 64
# Open append streams per client connection (one peer address and port) and per broker. A client
# needs one per EventStore; the per-broker bound keeps the reader tasks bounded.
STREAMS_PER_CONNECTION_MAX = 64
STREAMS_MAX = 4_096
# A stream with no message read for this long ends (OK, after its answers); its client opens a new one.
IDLE_TIMEOUT_S = 300.0
# How long close() waits for the streams to answer what they read before leaving them to grpc's stop.
CLOSE_WAIT_S = 5.0

_END: Any = object()  # the reader's last item: nothing more will be read
_INVALID = grpc.StatusCode.INVALID_ARGUMENT

Append = Callable[[pb.EventAppendRequest], Awaitable[pb.EventAppendResponse]]
# (exception, request) -> the status it is answered with (the servicer's rpc_handler mapping)
ErrorStatus = Callable[[Exception, Any], RpcAbort]


def refused(status: RpcAbort) -> pb.EventAppendResponse:
    """The answer of a refused append: the unary call's status as data."""
    return pb.EventAppendResponse(
        error_code=status.code.value[0],
        error_message=cap_message(status.message),
        error_metadata=[pb.Attribute(name=k, value=v) for k, v in status.trailing_metadata()],
    )


class _Stream:
    """One open append stream: a reader task that reads, checks and starts each message's append,
    and the call's handler (`answers`) writing their answers in order."""

    def __init__(self, owner: AppendStreams, requests: AsyncIterator[bytes], access: CallAccess, peer: str) -> None:
        self._owner = owner
        self._requests = requests
        self._access = access
        self.peer = peer
        self._answers: asyncio.Queue[asyncio.Future[pb.EventAppendResponse] | Any] = asyncio.Queue()
        self._slots = asyncio.Semaphore(owner.in_flight_max)
        self.in_flight = 0
        self.reader: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"<AppendStream peer={self.peer} in_flight={self.in_flight}>"

    async def answers(self) -> AsyncIterator[pb.EventAppendResponse]:
        self.reader = asyncio.create_task(self._read(), name=f"event-append-stream {self.peer}")
        try:
            while True:
                item = await self._answers.get()
                if item is _END:
                    break
                answer: pb.EventAppendResponse = await item
                self.in_flight -= 1
                self._slots.release()
                yield answer
            await self.reader  # its own failure (a bug) ends the call: re-raised here
        finally:
            reader = self.reader
            if not reader.done():
                reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(reader, return_exceptions=True)
            # appends started and not answered (the call was cancelled): let them finish, unanswered
            while not self._answers.empty():
                item = self._answers.get_nowait()
                if item is not _END:
                    await asyncio.gather(item, return_exceptions=True)

    def stop_reading(self) -> None:
        """End the stream cleanly: nothing more is read, what was read is answered, then OK."""
        if self.reader is not None and not self.reader.done():
            self.reader.cancel()

    async def _read(self) -> None:
        owner = self._owner
        requests = self._requests.__aiter__()
        try:
            while True:
                await self._slots.acquire()  # at most in_flight_max read and not yet answered
                try:
                    # Idle: nothing read for idle_timeout_s. Stop reading for good, even with
                    # answers still owed (they are sent): a read cut short may have taken a
                    # message off the wire that is then never handled, which a client can only
                    # tell by the stream ending OK with it unanswered (see the module docstring).
                    async with asyncio.timeout(owner.idle_timeout_s):
                        data = await requests.__anext__()
                except TimeoutError:
                    log.info("idle event append stream closed", peer=self.peer, in_flight=self.in_flight)
                    return
                except StopAsyncIteration:
                    return  # the client half-closed: answer what was read, then OK
                self.in_flight += 1
                self._answers.put_nowait(asyncio.ensure_future(self._answer(data)))
        except asyncio.CancelledError:
            return  # stop_reading() or the call's end: no more messages
        finally:
            self._answers.put_nowait(_END)

    async def _answer(self, data: bytes) -> pb.EventAppendResponse:
        """One message's answer: never raises (but for cancellation)."""
        request: Any = None
        try:
            try:
                request = pb.EventAppendRequest.FromString(data)
            except DecodeError as e:
                return refused(RpcAbort(_INVALID, f"request: the bytes do not decode as a dmq.v1.EventAppendRequest ({e})"))
            # the unary call's interceptor rule, per message: WRITE on this message's topic
            self._access.require([Need(ResourceType.TOPIC, request.topic, Operation.WRITE)], RPC)
            access = self._access
            delay_s = max(access.quota_delay_s("requests", 1), access.quota_delay_s("produce", len(data)))
            if delay_s > 0:
                await asyncio.sleep(delay_s)
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
        in_flight_max: int = IN_FLIGHT_MAX,
        streams_per_connection_max: int = STREAMS_PER_CONNECTION_MAX,
        streams_max: int = STREAMS_MAX,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
    ) -> None:
        if min(in_flight_max, streams_per_connection_max, streams_max) < 1 or idle_timeout_s <= 0:
            raise ValueError("in_flight_max, streams_per_connection_max and streams_max must be >= 1, "
                             "idle_timeout_s > 0")
        self.append = append
        self.error_status = error_status
        self.in_flight_max = in_flight_max
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
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, pb.EventAppendResponse]
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
        stream = _Stream(self, requests, current_access.get(), peer)
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
            stream.stop_reading()
        deadline = asyncio.get_running_loop().time() + wait_s
        while self._streams and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
