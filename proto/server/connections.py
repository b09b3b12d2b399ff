"""Connections per client address: a server interceptor.

gRPC core bounds connections per server (`grpc.max_allowed_incoming_connections`, see
grpc_options.py) but has no per-address setting, and grpc.aio gives Python no hook at accept
time. What Python does see is each call's peer (`context.peer()`, e.g. "ipv4:10.0.0.7:51234":
one address and port per TCP connection). So this interceptor counts, per client address, the
connections that are in use: those with a call in flight or one within the last `recent_s`
seconds. A call on a new connection from an address already at `max_per_address` is refused with
RESOURCE_EXHAUSTED naming the limit, before its handler runs.

What it does not do: refuse the TCP connection itself (a connection that never calls costs one
descriptor until `grpc.max_connection_idle_ms` closes it, and the server-wide limit bounds those).
Connections through a unix socket are not counted (no address to count by).

The table is bounded: entries without calls for `recent_s` are dropped when an address reaches its
limit, and the whole table is swept when it exceeds `max_entries`.

It is the server's first interceptor, and given `timings` (dmq.proto.server.metrics.RpcTimings)
it also times every call, refusals by itself and by every later interceptor included. Timing has
no interceptor of its own because each one costs grpc.aio an `intercept_service` coroutine per
call and its wrapper another coroutine layer (issue 29, bench/metrics_rpc_cost.py).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from time import perf_counter
from typing import Any, NoReturn

import grpc

from dmq.proto import error_details
from dmq.proto.server.handlers import Behavior, WrappingInterceptor, awaitable_behavior, rewrap, stream_behavior
from dmq.proto.server.metrics import MethodTimer, RpcTimings

DEFAULT_MAX_PER_ADDRESS = 1_000
DEFAULT_RECENT_S = 30.0
DEFAULT_MAX_ENTRIES = 100_000


def split_peer(peer: str) -> tuple[str, str] | None:
    """("10.0.0.7", "51234") from "ipv4:10.0.0.7:51234" (or "ipv6:[::1]:51234"); None for others."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6") or not rest:
        return None
    address, sep, port = rest.rpartition(":")
    if not sep:
        return None
    return address, port


@dataclass(slots=True)
class _Connection:
    active_calls: int = 0
    last_call_s: float = 0.0


class PerAddressConnectionLimit(WrappingInterceptor):
    def __init__(
        self,
        max_per_address: int = DEFAULT_MAX_PER_ADDRESS,
        *,
        recent_s: float = DEFAULT_RECENT_S,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
        timings: RpcTimings | None = None,
    ) -> None:
        if max_per_address < 1:
            raise ValueError(f"max_per_address must be >= 1, got {max_per_address}")
        super().__init__()
        self.timings = timings
        self.max_per_address = max_per_address
        self.recent_s = recent_s
        self.max_entries = max_entries
        self._clock = clock
        self._by_address: dict[str, dict[str, _Connection]] = {}
        self._entries = 0

    def connection_count(self) -> int:
        """The connections tracked now (dmq_open_connections)."""
        return self._entries

    def __repr__(self) -> str:
        return (
            f"<PerAddressConnectionLimit max_per_address={self.max_per_address} "
            f"addresses={len(self._by_address)} connections={self._entries} timed={self.timings is not None}>"
        )

    def connections(self, address: str) -> int:
        return len(self._by_address.get(address, ()))

    # -- accounting ------------------------------------------------------------------------------

    def _prune(self, address: str, now: float) -> None:
        conns = self._by_address.get(address)
        if not conns:
            return
        for port in [p for p, c in conns.items() if c.active_calls == 0 and now - c.last_call_s > self.recent_s]:
            del conns[port]
            self._entries -= 1
        if not conns:
            del self._by_address[address]

    def enter(self, peer: str) -> _Connection | str | None:
        """The connection's entry, counted in; or the refusal message; None when not counted."""
        split = split_peer(peer)
        if split is None:
            return None
        address, port = split
        now = self._clock()
        conns = self._by_address.setdefault(address, {})
        conn = conns.get(port)
        if conn is None:
            if len(conns) >= self.max_per_address:
                self._prune(address, now)
                conns = self._by_address.setdefault(address, {})
            if len(conns) >= self.max_per_address:
                return (
                    f"too many connections from {address}: {len(conns)} in use, the limit "
                    f"(max_connections_per_address) is {self.max_per_address}; share channels between clients"
                )
            if self._entries >= self.max_entries:
                for other in list(self._by_address):
                    self._prune(other, now)
                conns = self._by_address.setdefault(address, {})
            conn = conns[port] = _Connection()
            self._entries += 1
        conn.active_calls += 1
        conn.last_call_s = now
        return conn

    def leave(self, conn: _Connection) -> None:
        conn.active_calls -= 1
        conn.last_call_s = self._clock()

    # -- the interceptor -------------------------------------------------------------------------

    def wrap(self, handler: grpc.RpcMethodHandler[Any, Any], method: str) -> grpc.RpcMethodHandler[Any, Any]:
        timer = self.timings.method_timer(method) if self.timings is not None else None
        return rewrap(handler, unary=lambda b: self._wrap_unary(b, timer), stream=lambda b: self._wrap_stream(b, timer))

    async def _refuse(self, context: grpc.aio.ServicerContext[Any, Any], message: str) -> NoReturn:
        # the busy reason: a client waits and retries (never reads it as "batch too large")
        await context.abort(
            grpc.StatusCode.RESOURCE_EXHAUSTED, message,
            trailing_metadata=((error_details.REASON_KEY, error_details.BUSY),),
        )

    # Admission is a plain call; only a refusal awaits (context.abort raises). With metrics off
    # (timer None) a call costs two perf_counter() reads more than it must: tenths of a microsecond.

    def _wrap_unary(self, behavior: Behavior, timer: MethodTimer | None) -> Callable[..., Awaitable[Any]]:
        inner = awaitable_behavior(behavior)

        async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            started = perf_counter()
            conn: _Connection | str | None = None
            try:
                conn = self.enter(context.peer() or "")
                if isinstance(conn, str):
                    await self._refuse(context, conn)
                answer = await inner(request, context)
            except BaseException as e:
                if timer is not None:
                    timer.failed(e, context, perf_counter() - started)
                raise
            finally:
                if isinstance(conn, _Connection):
                    self.leave(conn)
            if timer is not None:
                timer.answered(context, perf_counter() - started)
            return answer

        return wrapped

    def _wrap_stream(self, behavior: Behavior, timer: MethodTimer | None) -> Callable[..., AsyncIterator[Any]]:
        async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            started = perf_counter()
            conn: _Connection | str | None = None
            try:
                conn = self.enter(context.peer() or "")
                if isinstance(conn, str):
                    await self._refuse(context, conn)
                async for item in stream_behavior(behavior, request, context):
                    yield item
            except BaseException as e:
                if timer is not None:
                    timer.failed(e, context, perf_counter() - started)
                raise
            finally:
                if isinstance(conn, _Connection):
                    self.leave(conn)
            if timer is not None:
                timer.answered(context, perf_counter() - started)

        return wrapped
