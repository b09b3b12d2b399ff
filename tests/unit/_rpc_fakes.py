"""A stand-in for grpc.aio's servicer context and a structlog-like logger, for unit tests of
`rpc_handler` (dmq.proto.server.server_errors) that call a decorated handler without a server."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

Status = tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]


class Aborted(Exception):
    pass


class FakeContext:
    def __init__(self) -> None:
        self.aborted: Status | None = None

    async def abort(self, code: grpc.StatusCode, message: str, trailing_metadata: tuple = ()) -> None:
        self.aborted = (code, message, tuple(trailing_metadata))
        raise Aborted  # as grpc.aio's does: abort never returns


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict]] = []

    def exception(self, event: str, **fields: object) -> None:
        self.lines.append((event, fields))


def call(handler: Callable[[Any, FakeContext], Awaitable[Any]], request: Any) -> tuple[Any, Status | None]:
    """Run the handler once: (its answer, None), or (None, the status it aborted with)."""
    context = FakeContext()
    try:
        return asyncio.run(handler(request, context)), None
    except Aborted:
        assert context.aborted is not None
        return None, context.aborted
