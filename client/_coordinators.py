"""A channel to whichever of several coordinators is active (issue 28 item 3).

With ``bootstrap_servers="h1:p,h2:p,h3:p"`` naming several coordinators (one active on a shared
etcd, the others standing by), the `Cluster` hands every stub for any of those addresses this
`CoordinatorRouter` instead of a plain channel. Each call goes to the coordinator the router
believes active, and its outcome is observed:
  1. UNAVAILABLE with the reason not-coordinator naming the active one: move there, unless that
     address refused a connection in the last DOWN_S (a standby may still name a dead
     coordinator until its lease lapses);
  2. not-coordinator naming none, no connection could be made, or no answer within the call's
     deadline (a paused active coordinator, SIGSTOP, keeps its connections and answers nothing;
     a standby takes over once its lease lapses): move to the next address;
  3. anything else: stay.
A blocking call refused in case 1 or 2 is sent again at once to the new address (a standby did
nothing, and a refused connection sent nothing), at most once per address, but not one that
timed out (the caller's time is spent, and the paused coordinator may yet act); when every attempt
failed, a standby's answer (retriable UNAVAILABLE, which the caller's retry policy asks again
after a pause) is raised in preference to a refused connection (which callers take as final).
Futures and streams are only observed: their callers' own retries then reach the new address.
With one address the Cluster uses a plain channel, exactly as before.

The asyncio client (dmq.client.aio._coordinators) routes its awaited calls with the same
`observe` rule and the same `Attempts` walk; only the waiting differs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from dmq.client._log import get_logger
from dmq.client.errors import is_connect_failure
from dmq.proto import error_details

log = get_logger(__name__)

__all__ = ["Attempts", "CoordinatorRouter"]

DOWN_S = 1.0


def _trailing(error: grpc.RpcError) -> Any:
    fn = getattr(error, "trailing_metadata", None)
    try:
        return fn() if callable(fn) else None
    except Exception:  # noqa: BLE001 - a call that never connected has no metadata
        return None


class CoordinatorRouter(grpc.Channel):
    def __init__(self, addresses: list[str], channel_for: Callable[[str], grpc.Channel]) -> None:
        self.addresses = list(addresses)
        self.current = self.addresses[0]
        self._channel_for = channel_for
        self._lock = threading.Lock()
        self._down: dict[str, float] = {}  # address -> time.monotonic() of its last refused connection

    def __repr__(self) -> str:
        return f"<CoordinatorRouter current={self.current!r} of={self.addresses}>"

    def observe(self, address: str, error: grpc.RpcError) -> bool:
        """Move after `error` from `address` (if it is still the current one); True when moved."""
        code = error.code() if callable(getattr(error, "code", None)) else None
        details = error.details() if callable(getattr(error, "details", None)) else None
        trailing = _trailing(error)
        reason = error_details.reason_of(trailing)
        named = error_details.value_of(trailing, error_details.ACTIVE_COORDINATOR_KEY)
        refused = code == grpc.StatusCode.UNAVAILABLE and is_connect_failure(details)
        timed_out = code == grpc.StatusCode.DEADLINE_EXCEEDED
        with self._lock:
            now = time.monotonic()
            if refused:
                self._down[address] = now
            if address != self.current:
                return True  # another call moved already
            if reason == error_details.NOT_COORDINATOR and named and now - self._down.get(named, -DOWN_S) >= DOWN_S:
                target = named
                if named not in self.addresses and len(self.addresses) < 16:  # bounded
                    self.addresses.append(named)
            elif reason == error_details.NOT_COORDINATOR or refused or timed_out:
                target = self.addresses[(self.addresses.index(address) + 1) % len(self.addresses)]
            else:
                return False
            if target == address:
                return False
            self.current = target
        log.info("following the active coordinator", old=address, new=target,
                 reason=reason or ("no answer" if timed_out else "unreachable"))
        return True

    # -- grpc.Channel ---------------------------------------------------------------------------

    # What a method of this channel is: the sync calls here; the asyncio router's awaitables.
    UNARY: type[RoutedMethod]
    STREAM: type[RoutedMethod]

    def unary_unary(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.UNARY(self, lambda ch: ch.unary_unary(method, *args, **kwargs))

    def unary_stream(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.STREAM(self, lambda ch: ch.unary_stream(method, *args, **kwargs))

    def stream_unary(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.STREAM(self, lambda ch: ch.stream_unary(method, *args, **kwargs))

    def stream_stream(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.STREAM(self, lambda ch: ch.stream_stream(method, *args, **kwargs))

    def subscribe(self, callback: Any, try_to_connect: bool = False) -> None:
        self._channel_for(self.current).subscribe(callback, try_to_connect=try_to_connect)

    def unsubscribe(self, callback: Any) -> None:
        for address in self.addresses:
            self._channel_for(address).unsubscribe(callback)

    def close(self) -> None:
        """The Cluster closes the channels underneath."""

    def __enter__(self) -> CoordinatorRouter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Attempts:
    """One blocking call's walk over the coordinators (the module comment's rule): after each
    failure, `again()` says whether to send it again (to router.current) or what to raise."""

    __slots__ = ("_router", "_left", "_answered")

    def __init__(self, router: CoordinatorRouter) -> None:
        self._router = router
        self._left = len(router.addresses) + 1  # each address once, and the one a standby named
        self._answered: grpc.RpcError | None = None  # the last error a coordinator sent (not a refused connection)

    def again(self, address: str, error: grpc.RpcError) -> grpc.RpcError | None:
        """None: send the call again; else the error to raise."""
        if not (callable(getattr(error, "details", None)) and is_connect_failure(error.details())):
            self._answered = error
        timed_out = callable(getattr(error, "code", None)) and error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        if not self._router.observe(address, error) or timed_out:  # moved, not sent again (see the module doc)
            return error
        self._left -= 1
        return (self._answered or error) if self._left <= 0 else None

    def again_or_raise(self, address: str, error: grpc.RpcError) -> None:
        """again(), raising what it says to raise; returns when the call is to be sent again."""
        raised = self.again(address, error)
        if raised is error:
            raise error
        if raised is not None:
            raise raised from None  # a standby's answer rather than a later refused connection


class RoutedMethod:
    """One method's multicallable per coordinator address, made on first use."""

    def __init__(self, router: CoordinatorRouter, make: Callable[[Any], Any]) -> None:
        self._router = router
        self._make = make
        self._by_address: dict[str, Any] = {}

    def _at(self, address: str) -> Any:
        call = self._by_address.get(address)
        if call is None:
            call = self._by_address[address] = self._make(self._router._channel_for(address))
        return call


class _Routed(RoutedMethod):
    """One method's multicallable, at whichever coordinator is current."""

    def _blocking(self, name: str, request: Any, kwargs: dict[str, Any]) -> Any:
        attempts = Attempts(self._router)
        while True:
            address = self._router.current
            try:
                return getattr(self._at(address), name)(request, **kwargs)
            except grpc.RpcError as e:
                attempts.again_or_raise(address, e)

    def __call__(self, request: Any, **kwargs: Any) -> Any:
        return self._blocking("__call__", request, kwargs)

    def with_call(self, request: Any, **kwargs: Any) -> Any:
        return self._blocking("with_call", request, kwargs)

    def future(self, request: Any, **kwargs: Any) -> Any:
        address = self._router.current
        future = self._at(address).future(request, **kwargs)

        def done(f: Any) -> None:
            if not f.cancelled() and f.exception() is not None and isinstance(f.exception(), grpc.RpcError):
                self._router.observe(address, f.exception())

        future.add_done_callback(done)
        return future


CoordinatorRouter.UNARY = CoordinatorRouter.STREAM = _Routed
