"""The asyncio client's route to whichever of several coordinators is active (issue 28 item 3).

The sync client's CoordinatorRouter (dmq.client._coordinators) decides where to go: its
`observe` rule and the `Attempts` walk over the addresses are used here as they are. Only the
calls differ: a unary call is awaited, so a call refused by a standby (or by a dead coordinator's
closed port) is sent again to the new address inside one awaitable; a stream is opened at the
coordinator current when it opens (its owner reopens it after a failure, by then at the address
the unary calls moved to).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from dmq.client._coordinators import Attempts, CoordinatorRouter

__all__ = ["AioCoordinatorRouter"]


class AioCoordinatorRouter(CoordinatorRouter):
    """A CoordinatorRouter over grpc.aio channels (`channel_for` gives them)."""

    def unary_unary(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return _AioUnary(self, lambda ch: ch.unary_unary(method, *args, **kwargs))

    def unary_stream(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return _AioStream(self, lambda ch: ch.unary_stream(method, *args, **kwargs))

    def stream_unary(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return _AioStream(self, lambda ch: ch.stream_unary(method, *args, **kwargs))

    def stream_stream(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return _AioStream(self, lambda ch: ch.stream_stream(method, *args, **kwargs))


class _AioRouted:
    """One method's aio multicallable per coordinator address, made on first use."""

    def __init__(self, router: CoordinatorRouter, make: Callable[[Any], Any]) -> None:
        self._router = router
        self._make = make
        self._by_address: dict[str, Any] = {}

    def _at(self, address: str) -> Any:
        call = self._by_address.get(address)
        if call is None:
            call = self._by_address[address] = self._make(self._router._channel_for(address))
        return call


class _AioUnary(_AioRouted):
    def __call__(self, request: Any, **kwargs: Any) -> Any:
        """An awaitable of the answer, from the active coordinator (see the module comment)."""
        return self._call(request, kwargs)

    async def _call(self, request: Any, kwargs: dict[str, Any]) -> Any:
        attempts = Attempts(self._router)
        while True:
            address = self._router.current
            try:
                return await self._at(address)(request, **kwargs)
            except grpc.RpcError as e:
                error = attempts.again(address, e)
                if error is e:
                    raise
                if error is not None:
                    raise error from None  # a standby's answer rather than a later refused connection


class _AioStream(_AioRouted):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The aio call itself (cancel(), async iteration), at the current coordinator."""
        return self._at(self._router.current)(*args, **kwargs)
