"""Every error the client library raises: one root, `DMQError`, and a class per failure.

Two class flags tell a caller (and the library's own retry loops) what to do:

- ``retriable``: the same request may succeed if sent again (broker restarting, leader moved,
  timeout). Non-retriable errors need a change by a person or the program.
- ``invalid_metadata``: the cached partition leaders may be stale; refresh metadata first.

gRPC errors are translated at the boundary with `from_rpc_error()`: a reason the server sent in
the trailing metadata (``dmq.proto.error_details``: disk full, storage unavailable, corrupt data)
picks the class first (``REASON_ERRORS``; never a search in the message text); otherwise the
status code picks it through a registry (``STATUS_ERRORS``) with an `UnknownServerError`
fallback, and callers that know the RPC refine it with ``overrides`` (a NOT_FOUND from GetAssignment is an
`UnknownMemberError`, from DescribeTopic a `TopicNotFoundError`). ``grpc.RpcError`` never
reaches a user; the original is chained as ``__cause__``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import grpc

from dmq.proto import dmq_pb2 as pb
from dmq.proto import error_details

__all__ = [
    "DMQError",
    "InvalidArgumentError",
    "NotFoundError",
    "TopicNotFoundError",
    "UnknownPartitionError",
    "GroupNotFoundError",
    "UnknownMemberError",
    "AlreadyExistsError",
    "TopicAlreadyExistsError",
    "FailedPreconditionError",
    "CommitFailedError",
    "LeaseExpiredError",
    "QueueFullError",
    "GroupNotEmptyError",
    "OutOfOrderSequenceError",
    "ProducerFencedError",
    "AppendConditionError",
    "ClaimNotHeldError",
    "OffsetOutOfRangeError",
    "ResourceExhaustedError",
    "RecordTooLargeError",
    "DiskFullError",
    "BrokerBusyError",
    "BrokerUnavailableError",
    "StorageUnavailableError",
    "NotLeaderError",
    "NotEnoughReplicasError",
    "CoordinatorUnavailableError",
    "NoBrokersAvailableError",
    "NoBrokersAvailable",
    "DMQTimeoutError",
    "RequestCancelledError",
    "AbortedError",
    "RebalanceInProgressError",
    "AuthorizationError",
    "UnsupportedError",
    "UnknownServerError",
    "CorruptRecordError",
    "InvalidConfigError",
    "IllegalStateError",
    "ClientClosedError",
    "STATUS_ERRORS",
    "REASON_ERRORS",
    "from_rpc_error",
    "from_partition_error",
    "is_connect_failure",
]


class DMQError(Exception):
    """Root of every DMQ client error.

    ``code`` is the gRPC status name (e.g. ``"UNAVAILABLE"``) when the error came from a server,
    else None; ``details`` the server's own message.
    """

    retriable: bool = False
    invalid_metadata: bool = False

    def __init__(self, message: str = "", *, code: str | None = None, details: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.details = details

    def __str__(self) -> str:
        if self.message:
            return self.message
        # A bare `raise TopicNotFoundError()` still says something useful: its doc's first line.
        doc = type(self).__doc__ or type(self).__name__
        return doc.strip().split("\n", 1)[0]


class InvalidArgumentError(DMQError):
    """The server refused a request as malformed: fix the named field (name, size, offset)."""


class NotFoundError(DMQError):
    """A topic, partition, group or member the request names does not exist."""

    invalid_metadata = True


class TopicNotFoundError(NotFoundError):
    """The topic does not exist: create it (`AdminClient.create_topic`, `dmq topics create`)."""


class UnknownPartitionError(NotFoundError):
    """The partition does not exist in this topic (check `describe_topic().partition_count`)."""


class GroupNotFoundError(NotFoundError):
    """The consumer group does not exist."""


class UnknownMemberError(NotFoundError):
    """The coordinator no longer knows this group member (session timed out): re-join the group."""

    invalid_metadata = False


class AlreadyExistsError(DMQError):
    """The thing being created already exists."""


class TopicAlreadyExistsError(AlreadyExistsError):
    """A topic with this name already exists."""


class FailedPreconditionError(DMQError):
    """The request is valid but the server's state does not allow it now."""


class CommitFailedError(FailedPreconditionError):
    """The commit was refused: this member no longer owns the partition (a rebalance moved it).

    Usually the poll loop took longer than max_poll_interval_ms: raise max_poll_interval_ms or
    lower max_poll_records so each batch is processed in time.
    """


class LeaseExpiredError(FailedPreconditionError):
    """The queue lease expired or was taken over before this ack / nack / renew; nothing changed and
    its records go to the next pop. Renew sooner (lease_ms, or process() renews while it runs)."""


class GroupNotEmptyError(FailedPreconditionError):
    """The group still has members: stop its consumers before deleting it or resetting offsets."""


class OutOfOrderSequenceError(FailedPreconditionError):
    """The broker saw a gap in this producer's sequence numbers for the partition."""


class ProducerFencedError(FailedPreconditionError):
    """A newer epoch of this producer id has written to the partition; this one is fenced."""


class AppendConditionError(FailedPreconditionError):
    """An event-store append was refused: an event after the condition's position matches its
    query (someone decided on newer facts). ``position`` names the first such event; nothing
    was stored. Read again from there and decide anew."""

    def __init__(self, message: str = "", *, code: str | None = None, details: str | None = None,
                 position: int | None = None) -> None:
        super().__init__(message, code=code, details=details)
        self.position = position


class ClaimNotHeldError(FailedPreconditionError):
    """The worker no longer holds the event-group claim (it expired without renewal, was released
    or the group was reset): claim again."""


class OffsetOutOfRangeError(DMQError):
    """The requested offset is outside the partition's log [log start, log end].

    ``log_start_offset`` / ``log_end_offset`` carry the bounds when the server reported them:
    seek to one of them (retention may have deleted the data below log start).
    """

    def __init__(
        self,
        message: str = "",
        *,
        code: str | None = None,
        details: str | None = None,
        log_start_offset: int | None = None,
        log_end_offset: int | None = None,
    ) -> None:
        super().__init__(message, code=code, details=details)
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class ResourceExhaustedError(DMQError):
    """A server limit was hit (message size, queue length)."""


class RecordTooLargeError(ResourceExhaustedError):
    """A record or batch exceeds a size limit: lower batch_size, split the value, or raise the
    topic's max_message_bytes."""


class QueueFullError(ResourceExhaustedError):
    """The topic's queue holds max_queue_size records its queue groups have not acknowledged;
    nothing of the batch was stored. ``depth``, ``limit`` and ``remaining`` (capacity left) are
    per leader: each enforces its pro rata share of max_queue_size over the partitions it leads."""

    def __init__(
        self,
        message: str = "",
        *,
        code: str | None = None,
        details: str | None = None,
        depth: int | None = None,
        limit: int | None = None,
    ) -> None:
        super().__init__(message, code=code, details=details)
        self.depth = depth
        self.limit = limit

    @property
    def remaining(self) -> int | None:
        if self.depth is None or self.limit is None:
            return None
        return max(self.limit - self.depth, 0)

    def _read_trailing(self, trailing_metadata: object) -> None:
        for name, key in (("depth", error_details.QUEUE_DEPTH_KEY), ("limit", error_details.QUEUE_LIMIT_KEY)):
            value = error_details.value_of(trailing_metadata, key)
            if value is not None and value.isdigit():
                setattr(self, name, int(value))


class DiskFullError(ResourceExhaustedError):
    """A server's disk is full (a broker's, or the coordinator's for topic and group changes);
    nothing of the request was stored. The producer retries within delivery_timeout_ms: free space
    on that server (or lower retention) and it goes on."""

    retriable = True


class BrokerBusyError(ResourceExhaustedError):
    """The broker's in-flight byte budget stayed full until the request's deadline; nothing of the
    request was stored. Retried with backoff (within delivery_timeout_ms for the producer)."""

    retriable = True


class BrokerUnavailableError(DMQError):
    """The broker cannot be reached or is starting; metadata is refreshed and the call retried."""

    retriable = True
    invalid_metadata = True


class StorageUnavailableError(BrokerUnavailableError):
    """A transient I/O error on the broker (out of file descriptors, I/O error); nothing of the
    request was stored and the partition stays usable: the call is retried."""

    invalid_metadata = False


class NotLeaderError(BrokerUnavailableError):
    """The broker asked does not lead the partition (it moved or metadata is stale)."""


class NotEnoughReplicasError(BrokerUnavailableError):
    """acks=all: the partition's in-sync replicas are fewer than the topic's min_insync_replicas
    (nothing was stored), or did not all get the batch in time. Retried: the leader is right (no
    metadata refresh); its followers must catch up or come back."""

    invalid_metadata = False


class CoordinatorUnavailableError(BrokerUnavailableError):
    """The coordinator cannot be reached: check the bootstrap address and that it is running."""


class NoBrokersAvailableError(CoordinatorUnavailableError):
    """A client could not connect to its bootstrap address when it started (kafka-python's
    NoBrokersAvailable): a wrong address or a server that is not running. Raised by the
    constructor (``start()`` for the asyncio clients) within request_timeout_ms, rather than by
    every later call after its own timeout."""


NoBrokersAvailable = NoBrokersAvailableError  # kafka-python's name


class DMQTimeoutError(DMQError):
    """An operation did not finish in time; the message names the setting that bounds it."""

    retriable = True


class RequestCancelledError(DMQError):
    """The call was cancelled (the client or the server is shutting down)."""


class AbortedError(DMQError):
    """The server aborted the call because of a concurrent change; it is safe to retry."""

    retriable = True


class RebalanceInProgressError(DMQError):
    """The group is rebalancing; poll again to get the new assignment."""

    retriable = True


class AuthorizationError(DMQError):
    """The server refused the credentials or the operation."""


class UnsupportedError(DMQError):
    """The server does not implement this RPC (a version mismatch between client and server)."""


class UnknownServerError(DMQError):
    """The server failed in an unexpected way; its logs have the details."""


class CorruptRecordError(DMQError):
    """A fetched record batch failed its CRC or layout check (disk or network corruption); the
    message names the partition and offset."""


class InvalidConfigError(DMQError, ValueError):
    """A client configuration value is out of range; the message names the setting to change."""


class IllegalStateError(DMQError):
    """The client object is used in a way its state does not allow."""


class ClientClosedError(IllegalStateError):
    """The client was closed; create a new one."""


# Status code -> class used by from_rpc_error when the caller gives no override for it.
STATUS_ERRORS: dict[grpc.StatusCode, type[DMQError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.OUT_OF_RANGE: OffsetOutOfRangeError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: BrokerUnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DMQTimeoutError,
    grpc.StatusCode.CANCELLED: RequestCancelledError,
    grpc.StatusCode.ABORTED: AbortedError,
    grpc.StatusCode.UNAUTHENTICATED: AuthorizationError,
    grpc.StatusCode.PERMISSION_DENIED: AuthorizationError,
    grpc.StatusCode.UNIMPLEMENTED: UnsupportedError,
    grpc.StatusCode.INTERNAL: UnknownServerError,
    grpc.StatusCode.UNKNOWN: UnknownServerError,
    grpc.StatusCode.DATA_LOSS: CorruptRecordError,
}

# error_details reason -> class; it wins over the status code and the caller's overrides.
REASON_ERRORS: dict[str, type[DMQError]] = {
    error_details.DISK_FULL: DiskFullError,
    error_details.STORAGE_UNAVAILABLE: StorageUnavailableError,
    error_details.CORRUPT_DATA: CorruptRecordError,
    error_details.BUSY: BrokerBusyError,
    error_details.PRODUCER_FENCED: ProducerFencedError,
    error_details.OUT_OF_ORDER_SEQUENCE: OutOfOrderSequenceError,
    error_details.NOT_OWNER: CommitFailedError,
    error_details.LEASE_EXPIRED: LeaseExpiredError,
    error_details.QUEUE_FULL: QueueFullError,
    error_details.APPEND_CONDITION_FAILED: AppendConditionError,
    error_details.CLAIM_NOT_HELD: ClaimNotHeldError,
    error_details.NOT_ENOUGH_REPLICAS: NotEnoughReplicasError,
}

# Hints appended to the server's message when it alone does not say what to do.
_HINTS: dict[grpc.StatusCode, str] = {
    grpc.StatusCode.DEADLINE_EXCEEDED: "raise request_timeout_ms if the server is just slow",
    grpc.StatusCode.UNIMPLEMENTED: "the server's version does not match this client",
}


def rpc_error_reason(error: object) -> str | None:
    """The refusal's dmq.proto.error_details reason, if the call got that far (None for a call
    that failed before any metadata, e.g. a connect failure)."""
    trailing = getattr(error, "trailing_metadata", None)
    try:
        return error_details.reason_of(trailing()) if callable(trailing) else None
    except Exception:  # noqa: BLE001 - no metadata to read
        return None


def from_rpc_error(
    error: grpc.RpcError,
    *,
    context: str | None = None,
    overrides: Mapping[grpc.StatusCode, type[DMQError]] | None = None,
) -> DMQError:
    """Translate a gRPC error into the DMQError for its status.

    ``context`` says what was being done ("Produce to orders[3] at 10.0.0.5:9092") and prefixes
    the message; ``overrides`` picks a more precise class per status for this RPC.
    """
    code_fn = getattr(error, "code", None)
    details_fn = getattr(error, "details", None)
    code = code_fn() if callable(code_fn) else None
    details = details_fn() if callable(details_fn) else None
    if not isinstance(code, grpc.StatusCode):
        code = grpc.StatusCode.UNKNOWN
    trailing_fn = getattr(error, "trailing_metadata", None)
    reason = None
    trailing: object = None
    if callable(trailing_fn):
        try:
            trailing = trailing_fn()
            reason = error_details.reason_of(trailing)
        except Exception:  # noqa: BLE001 - a call without metadata (e.g. failed to connect)
            reason = None
    cls = REASON_ERRORS.get(reason) if reason else None
    if cls is None and overrides:
        cls = overrides.get(code)
    if cls is None:
        cls = STATUS_ERRORS.get(code, UnknownServerError)
    parts = []
    if context:
        parts.append(f"{context}:")
    parts.append(details or code.name.lower().replace("_", " "))
    hint = _HINTS.get(code)
    if hint:
        parts.append(f"({hint})")
    if code is grpc.StatusCode.UNAVAILABLE and not details:
        parts.append("(is the server running and reachable?)")
    err = cls(" ".join(parts), code=code.name, details=details)
    if isinstance(err, QueueFullError):
        err._read_trailing(trailing)
    elif isinstance(err, AppendConditionError):
        with contextlib.suppress(ValueError):  # a missing or malformed position leaves it None
            err.position = int(error_details.value_of(trailing, error_details.CONFLICT_POSITION_KEY) or "")
    err.__cause__ = error if isinstance(error, BaseException) else None
    return err


def from_partition_error(
    code: int,
    message: str,
    topic: str,
    partition: int,
    *,
    log_start_offset: int | None = None,
    log_end_offset: int | None = None,
) -> DMQError:
    """The DMQError for a per-partition ``ErrorCode`` inside a multi-partition response (Fetch,
    ListOffsets), which carry errors as data rather than as a gRPC status."""
    text = message or f"{pb.ErrorCode.Name(code)} for {topic}[{partition}]"
    if code == pb.OFFSET_OUT_OF_RANGE:
        if log_start_offset is not None and str(log_start_offset) not in text:
            text += f" (log start {log_start_offset}, log end {log_end_offset})"
        return OffsetOutOfRangeError(
            text,
            code="OUT_OF_RANGE",
            details=message,
            log_start_offset=log_start_offset,
            log_end_offset=log_end_offset,
        )
    if code == pb.UNKNOWN_TOPIC_OR_PARTITION:
        return UnknownPartitionError(text, code="NOT_FOUND", details=message)
    if code == pb.NOT_LEADER:
        return NotLeaderError(text, code="UNAVAILABLE", details=message)
    if code == pb.INVALID_REQUEST:
        return InvalidArgumentError(text, code="INVALID_ARGUMENT", details=message)
    if code == pb.CORRUPT_DATA:
        return CorruptRecordError(text, code="DATA_LOSS", details=message)
    if code == pb.STORAGE_ERROR:
        return StorageUnavailableError(f"{text} (a transient storage error on the broker; retried)", details=message)
    return UnknownServerError(f"{text} (a storage error on the broker: see its log)", details=message)


class UnknownSettingError(InvalidConfigError, TypeError):
    """A keyword setting no client takes (a TypeError too, as Python's own would be); the
    message lists the close names."""


class SerializationError(DMQError):
    """A key or value (de)serializer raised; the message names the setting and the record."""


# Phrases in gRPC's own details when no connection could be made, as opposed to a server that
# answered UNAVAILABLE itself ("coordinator is starting"). gRPC gives no other sign of the
# difference, and it matters: a server that answered is worth asking again, nothing listening
# at the address is not.
_CONNECT_FAILURES = (
    "failed to connect",
    "connection refused",
    "dns resolution failed",
    "name resolution",
    "connection reset",
    "socket closed",
    "connect failed",
    "unavailable: ipv4",
    "no route to host",
    "network is unreachable",
)


def is_connect_failure(details: str | None) -> bool:
    """Whether gRPC's details (or a DMQError's message) say no connection could be made."""
    low = (details or "").lower()
    return any(p in low for p in _CONNECT_FAILURES)
