"""The event store's refusals: DomainErrors (dmq.proto.server.domain_errors) whose code the servers' one
error mapping (dmq.proto.server.server_errors) turns into a gRPC status."""

from __future__ import annotations

from dmq.proto import error_details
from dmq.proto.server.domain_errors import DomainError, ErrorCode

__all__ = [
    "EventStoreError",
    "InvalidEventRequestError",
    "ConditionFailedError",
    "EventGroupNotFoundError",
    "EventClaimNotHeldError",
    "GroupConflictError",
    "EventStoreFullError",
]


class EventStoreError(DomainError):
    """Base class: a request the store refuses, with a message a person can act on."""


class InvalidEventRequestError(EventStoreError):
    """A field breaks a rule (the message names it)."""

    code = ErrorCode.INVALID_ARGUMENT


class ConditionFailedError(EventStoreError):
    """An event after the condition's position matches its query; the first conflicting position
    travels as trailing metadata beside the reason."""

    code = ErrorCode.FAILED_PRECONDITION
    reason = error_details.APPEND_CONDITION_FAILED

    def __init__(self, message: str, position: int) -> None:
        super().__init__(message, extra=((error_details.CONFLICT_POSITION_KEY, str(position)),))
        self.position = position


class EventGroupNotFoundError(EventStoreError):
    """The event group was never registered on this store."""

    code = ErrorCode.NOT_FOUND


class EventClaimNotHeldError(EventStoreError):
    """The worker does not hold the claim (it expired, was released or reaped)."""

    code = ErrorCode.FAILED_PRECONDITION
    reason = error_details.CLAIM_NOT_HELD


class GroupConflictError(EventStoreError):
    """The request contradicts the group's settings (e.g. another partition_by)."""

    code = ErrorCode.FAILED_PRECONDITION


class EventStoreFullError(EventStoreError):
    """A bound (groups, partitions, subscriptions) is reached."""

    code = ErrorCode.RESOURCE_EXHAUSTED
