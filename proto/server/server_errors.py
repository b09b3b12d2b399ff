"""The one way a DMQ server turns an error into a gRPC status, shared by every service.

A handler (or anything it calls) refuses a request by raising `RpcAbort(code, message, reason)`;
`rpc_handler` turns it into `context.abort` with the message capped (dmq.proto.names.cap_message)
and the reason (dmq.proto.error_details) as trailing metadata, which is what clients read to pick
their error class, never the message text. Domain code raises `DomainError`
(dmq.proto.server.domain_errors), which never names grpc: its code maps to a status here (`status_code`),
as a broken field rule (`FieldError`) maps to INVALID_ARGUMENT here, for every service. A service
maps what is not its domain's (storage failures: OSError, a corrupt log) with a `translate`
function; anything else is a bug, logged and answered as INTERNAL, so no request takes a server
down or leaves a client hanging.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, Protocol

import grpc

from dmq.proto import error_details
from dmq.proto.names import FieldError, cap_message
from dmq.proto.server.domain_errors import DomainError, ErrorCode

__all__ = ["RpcAbort", "fail", "rpc_handler", "rpc_status", "status_code", "domain_status"]

# How much of an unexpected exception's text an INTERNAL status echoes: it may quote request data.
INTERNAL_DETAIL_MAX_CHARS = 300


class RpcAbort(Exception):
    """A request refused with a status; `reason` (dmq.proto.error_details) goes out as trailing
    metadata when the code alone does not tell a client what to do."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        reason: str | None = None,
        extra: tuple[tuple[str, str], ...] = (),
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason
        self.extra = extra  # more trailing metadata a client reads with the reason (e.g. queue depth)

    def __repr__(self) -> str:
        return f"RpcAbort({self.code.name}, {self.message!r}, reason={self.reason!r})"

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return (((error_details.REASON_KEY, self.reason),) if self.reason else ()) + self.extra


def fail(
    code: grpc.StatusCode, message: str, reason: str | None = None, extra: tuple[tuple[str, str], ...] = ()
) -> NoReturn:
    raise RpcAbort(code, message, reason, extra)


def status_code(code: ErrorCode) -> grpc.StatusCode:
    """The gRPC status of a domain error code: the status of the same name."""
    return grpc.StatusCode[code.value]


def domain_status(e: Exception) -> RpcAbort | None:
    """The status every service answers a DomainError or a FieldError with; None for others."""
    if isinstance(e, DomainError):
        return RpcAbort(status_code(e.code), str(e), e.reason, e.extra)
    if isinstance(e, FieldError):  # a shared rule (dmq.proto.names, limits, event_headers) broken
        return RpcAbort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
    return None


class _Logger(Protocol):
    def exception(self, event: str, **fields: Any) -> Any: ...


Handler = Callable[..., Awaitable[Any]]
# (servicer, exception) -> its status, or None for "not one of this service's errors: a bug"
Translate = Callable[[Any, Exception], "RpcAbort | None"]


def rpc_status(e: Exception, *, log: _Logger, servicer: Any, translate: Translate | None, rpc: str,
               request: Any = None) -> RpcAbort:
    """The status a handler's exception is answered with (rpc_handler's rules, for a handler
    that answers a refusal itself, e.g. one message of a stream): an RpcAbort as it is, a
    DomainError or FieldError by its code, a translated error, anything else INTERNAL (logged)."""
    if isinstance(e, RpcAbort):
        return e
    translated = domain_status(e)
    if translated is None and translate is not None:
        translated = translate(servicer, e)
    if translated is not None:
        if translated.code == grpc.StatusCode.INTERNAL:  # a DomainError that says it is a bug
            log.exception("handler failed", rpc=rpc, error=str(e))
        return translated
    log.exception("handler failed", rpc=rpc, group=getattr(request, "group_id", None) or None)
    detail = str(e)
    if len(detail) > INTERNAL_DETAIL_MAX_CHARS:
        detail = detail[:INTERNAL_DETAIL_MAX_CHARS] + "... (cut)"
    return RpcAbort(grpc.StatusCode.INTERNAL, f"internal error in {rpc}: {type(e).__name__}: {detail}")


def rpc_handler(
    *, log: _Logger, translate: Translate | None = None, before: Callable[[Any], None] | None = None
) -> Callable[[Handler], Handler]:
    """Decorate a servicer's unary handlers: RpcAbort, DomainError, FieldError and translated errors
    become their status, anything else INTERNAL (logged with the rpc's name and, when the request has one, its group).
    `before(servicer)` runs first and may raise RpcAbort (e.g. "not serving yet")."""

    def decorate(method: Handler) -> Handler:
        name = method.__name__

        @functools.wraps(method)
        async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            try:
                if before is not None:
                    before(self)
                return await method(self, request, context)
            except (asyncio.CancelledError, grpc.aio.AbortError):
                raise
            except Exception as e:  # noqa: BLE001 - the last line of defence of a server
                status = rpc_status(e, log=log, servicer=self, translate=translate, rpc=name, request=request)
            await context.abort(status.code, cap_message(status.message), trailing_metadata=status.trailing_metadata())
            raise AssertionError("unreachable: context.abort raises")

        return wrapper

    return decorate
