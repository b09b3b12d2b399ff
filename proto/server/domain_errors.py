"""The one error base of the servers' domain code: a refusal with a code and, where a client must
tell refusals apart, a reason.

Domain code (the group machine, the metadata service, queue leases, the event store, ...) raises a
`DomainError` subclass and never imports grpc; `dmq.proto.server.server_errors.rpc_handler` turns every
DomainError into its gRPC status in one place (`status_code`), the message capped and the reason
(dmq.proto.error_details) sent as trailing metadata. A subclass sets `code` (and `reason`) for all
its instances; `DomainError(message, code=..., reason=...)` refuses one request ad hoc.

`ErrorCode` names the gRPC status codes a refusal may carry, spelled as grpc.StatusCode spells them
(a str enum, so `err.code == "NOT_FOUND"` reads as before).
"""

from __future__ import annotations

import enum

__all__ = ["DomainError", "ErrorCode"]


class ErrorCode(enum.StrEnum):
    """Every gRPC status but OK: domain code mostly refuses with the first eight; the rest are
    there for refusals relayed from another server (a broker's answer to the coordinator)."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    OUT_OF_RANGE = "OUT_OF_RANGE"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    UNAVAILABLE = "UNAVAILABLE"
    ABORTED = "ABORTED"
    DATA_LOSS = "DATA_LOSS"
    CANCELLED = "CANCELLED"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    UNIMPLEMENTED = "UNIMPLEMENTED"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    UNKNOWN = "UNKNOWN"
    INTERNAL = "INTERNAL"  # a bug, never a client's fault


class DomainError(Exception):
    """A request refused by domain code. `extra` is more trailing metadata a client reads with the
    reason (e.g. the conflicting position of a failed append condition)."""

    code: ErrorCode = ErrorCode.INTERNAL
    reason: str | None = None  # a dmq.proto.error_details reason
    extra: tuple[tuple[str, str], ...] = ()

    def __init__(
        self,
        message: str,
        *,
        code: ErrorCode | None = None,
        reason: str | None = None,
        extra: tuple[tuple[str, str], ...] = (),
    ) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        if reason is not None:
            self.reason = reason
        if extra:
            self.extra = extra
