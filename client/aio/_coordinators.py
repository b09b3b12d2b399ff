"""The asyncio client's route to whichever of several coordinators is active (issue 28 item 3).

The sync client's CoordinatorRouter (dmq.client._coordinators) decides where to go: its
`observe` rule and the `Attempts` walk over the addresses are used here as they are. Only the
calls differ: a unary call is awaited, so a call refused by a standby (or by a dead coordinator's
closed port) is sent again to the new address inside one awaitable; a stream is opened at the
coordinator current when it opens (its owner reopens it after a failure, by then at the address
the unary calls moved to).
"""

from __future__ import annotations

from typing import Any

import grpc

from dmq.client._coordinators import Attempts, CoordinatorRouter, RoutedMethod

__all__ = ["AioCoordinatorRouter"]


class _AioUnary(RoutedMethod):
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
                attempts.again_or_raise(address, e)


class _AioStream(RoutedMethod):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The aio call itself (cancel(), async iteration), at the current coordinator."""
        return self._at(self._router.current)(*args, **kwargs)


class AioCoordinatorRouter(CoordinatorRouter):
    """A CoordinatorRouter over grpc.aio channels (`channel_for` gives them): the same rule, its
    methods' calls awaited."""

    UNARY = _AioUnary
    STREAM = _AioStream
