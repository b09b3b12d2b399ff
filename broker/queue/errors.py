"""The queue's refusals: DomainErrors (dmq.proto.server.domain_errors) whose code the servers' one error
mapping (dmq.proto.server.server_errors) turns into a gRPC status, so the queue's domain code never
imports grpc."""

from __future__ import annotations

from dmq.proto import error_details
from dmq.proto.server.domain_errors import DomainError, ErrorCode

__all__ = ["LeaseNotLiveError", "LeaseBusyError", "QueueError", "QueueOverLimitError", "QueueNotLeaderError"]


class QueueError(DomainError):
    """Base class: a queue request refused, with a message a person can act on."""


class LeaseNotLiveError(QueueError):
    """The lease is not live: it expired or was taken over (or never existed)."""

    code = ErrorCode.FAILED_PRECONDITION
    reason = error_details.LEASE_EXPIRED

    def __init__(self, lease_id: str) -> None:
        super().__init__(
            f"lease {lease_id[:12]}... is not live: it expired or was taken over (or never existed); "
            "nothing was changed, its records go to the next pop"
        )


class LeaseBusyError(QueueError):
    """Another call (an ack, nack or reject) is finishing the lease."""

    code = ErrorCode.FAILED_PRECONDITION

    def __init__(self, lease_id: str) -> None:
        super().__init__(f"lease {lease_id[:12]}... is being finished by another call (an ack, nack or reject in flight)")


class QueueNotLeaderError(QueueError):
    """This broker no longer leads the lease's partition (the client sends the call to the leader)."""

    code = ErrorCode.UNAVAILABLE


class QueueOverLimitError(QueueError):
    """A produce would take the queue past its share of max_queue_size; depth and limit travel as
    trailing metadata beside the reason."""

    code = ErrorCode.RESOURCE_EXHAUSTED
    reason = error_details.QUEUE_FULL

    def __init__(self, message: str, depth: int, limit: int) -> None:
        super().__init__(
            message, extra=((error_details.QUEUE_DEPTH_KEY, str(depth)), (error_details.QUEUE_LIMIT_KEY, str(limit)))
        )
        self.depth = depth
        self.limit = limit
