"""The event store's refusals; service.py maps each class to its gRPC status."""

from __future__ import annotations

__all__ = [
    "EventStoreError",
    "InvalidEventRequest",
    "ConditionFailedError",
    "GroupNotFoundError",
    "ClaimNotHeldError",
    "GroupConflictError",
    "EventStoreFullError",
]


class EventStoreError(Exception):
    """Base class: a request the store refuses, with a message a person can act on."""


class InvalidEventRequest(EventStoreError):
    """INVALID_ARGUMENT: a field breaks a rule (the message names it)."""


class ConditionFailedError(EventStoreError):
    """FAILED_PRECONDITION: an event after the condition's position matches its query."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(message)
        self.position = position


class GroupNotFoundError(EventStoreError):
    """NOT_FOUND: the group was never registered on this store."""


class ClaimNotHeldError(EventStoreError):
    """FAILED_PRECONDITION: the worker does not hold the claim (it expired, was released or reaped)."""


class GroupConflictError(EventStoreError):
    """FAILED_PRECONDITION: the request contradicts the group's settings (e.g. another partition_by)."""


class EventStoreFullError(EventStoreError):
    """RESOURCE_EXHAUSTED: a bound (groups, partitions, subscriptions) is reached."""
