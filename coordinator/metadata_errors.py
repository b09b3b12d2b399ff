"""The metadata service's refusals: MetadataError and the ones several of its parts raise.

Each is a DomainError (dmq.proto.server.domain_errors): rpc_handler maps `code` to its gRPC status
(dmq.proto.server.server_errors) and sends `reason` (dmq.proto.error_details) as trailing metadata. A
refusal that belongs to one job lives with it: BrokerIdTakenError (dmq.coordinator.membership),
PartitionLimitExceededError (dmq.coordinator.topic_admin), PrincipalLimitExceededError
(dmq.coordinator.principal_limits), BrokerRefusedError (dmq.coordinator.broker_calls).
"""

from __future__ import annotations

from collections.abc import Iterable

from dmq.proto import error_details
from dmq.proto.server.domain_errors import DomainError, ErrorCode

NO_LIVE_BROKERS = "no live brokers: start one with `dmq broker`"


class MetadataError(DomainError):
    """A request the metadata service refuses; rpc_handler maps `code` to its gRPC status
    (dmq.proto.server.server_errors), `reason` (dmq.proto.error_details) goes as trailing metadata."""


class InvalidMetadataRequestError(MetadataError):
    code = ErrorCode.INVALID_ARGUMENT


class MetadataPreconditionError(MetadataError):
    code = ErrorCode.FAILED_PRECONDITION


class CoordinatorDiskFullError(MetadataError):
    """The coordinator's SQLite could not write: its disk is full. Nothing changed; retriable."""

    code = ErrorCode.RESOURCE_EXHAUSTED
    reason = error_details.DISK_FULL


class MetadataStoreUnavailableError(MetadataError):
    """The metadata store did not confirm a write: a compare-and-swap lost to another coordinator
    (dmq.coordinator.metastore.base; nothing changed), or etcd unreachable or stalled (nothing
    changed, or, when the call timed out, the outcome is unknown until the store is read again). Retriable."""

    code = ErrorCode.UNAVAILABLE


class PartitionNotFoundError(MetadataError):
    code = ErrorCode.NOT_FOUND


class UnknownTopicError(MetadataError):
    code = ErrorCode.NOT_FOUND

    def __init__(self, names: Iterable[str]) -> None:
        self.names = sorted(names)
        listed = ", ".join(repr(n) for n in self.names)
        noun = "topic" if len(self.names) == 1 else "topics"
        super().__init__(f"{noun} {listed} not found")


class TopicExistsError(MetadataError):
    code = ErrorCode.ALREADY_EXISTS

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"topic {name!r} already exists")


class NoLiveBrokersError(MetadataError):
    # UNAVAILABLE: retriable, since brokers may still be starting (e.g. just after `dmq server`).
    code = ErrorCode.UNAVAILABLE

    def __init__(self) -> None:
        super().__init__(NO_LIVE_BROKERS)


class NotEnoughBrokersError(MetadataError):
    code = ErrorCode.UNAVAILABLE


class CoordinatorStartingError(MetadataError):
    code = ErrorCode.UNAVAILABLE

    def __init__(self) -> None:
        super().__init__("coordinator is starting: retry")

