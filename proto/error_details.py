"""Machine-readable error reasons sent with a gRPC status, shared by servers and clients.

A status code alone is ambiguous: RESOURCE_EXHAUSTED means "batch too large" (fix the request,
do not retry) or "disk full" (retry later). Servers add the trailing metadata entry
`REASON_KEY: <reason>` where the code alone does not say what a client should do; clients read
it (never the message text) to pick their error class.
"""

from __future__ import annotations

__all__ = [
    "REASON_KEY",
    "DISK_FULL",
    "STORAGE_UNAVAILABLE",
    "CORRUPT_DATA",
    "BUSY",
    "PRODUCER_FENCED",
    "OUT_OF_ORDER_SEQUENCE",
    "NOT_OWNER",
    "LEASE_EXPIRED",
    "QUEUE_FULL",
    "QUEUE_DEPTH_KEY",
    "QUEUE_LIMIT_KEY",
    "reason_of",
    "value_of",
    "APPEND_CONDITION_FAILED",
    "CONFLICT_POSITION_KEY",
    "CLAIM_NOT_HELD",
    "NOT_ENOUGH_REPLICAS",
    "NOT_COORDINATOR",
    "ACTIVE_COORDINATOR_KEY",
]

REASON_KEY = "dmq-error-reason"

DISK_FULL = "disk-full"  # RESOURCE_EXHAUSTED: the broker's disk is full; retry after a while
STORAGE_UNAVAILABLE = "storage-unavailable"  # UNAVAILABLE: a transient I/O error (EMFILE, EIO); retry
CORRUPT_DATA = "corrupt-data"  # DATA_LOSS: damaged log data; not retriable
BUSY = "server-busy"  # RESOURCE_EXHAUSTED: the broker's in-flight byte budget is taken; retry after a while
# FAILED_PRECONDITION, both from an idempotent produce; a client must tell them apart:
PRODUCER_FENCED = "producer-fenced"  # a newer epoch of the producer id wrote: this producer is done
OUT_OF_ORDER_SEQUENCE = "out-of-order-sequence"  # a gap in the producer's sequence numbers
# FAILED_PRECONDITION from a commit: the member does not own the partition under the generation it
# names (a stale generation, or the partition moved); the consumer re-fetches its assignment.
NOT_OWNER = "not-owner"
# FAILED_PRECONDITION from a queue ack / nack / reject / renew: the lease expired or was taken
# over; nothing changed (the records come back to whoever pops next).
LEASE_EXPIRED = "lease-expired"
# RESOURCE_EXHAUSTED from a produce: the topic's queue holds max_queue_size records not yet
# acknowledged; nothing of the batch was stored. The numbers travel under the two keys below.
QUEUE_FULL = "queue-full"
QUEUE_DEPTH_KEY = "dmq-queue-depth"  # records not acknowledged (over the leader's partitions)
QUEUE_LIMIT_KEY = "dmq-queue-limit"  # the leader's pro rata share of max_queue_size
# FAILED_PRECONDITION from RegisterBroker: another live broker (or another principal) holds the id;
# a restarted broker at a new address retries until the old registration's session expires.
BROKER_ID_TAKEN = "broker-id-taken"
# UNAVAILABLE from an acks=all produce: the partition's in-sync set is smaller than the topic's
# min_insync_replicas (refused before appending: nothing stored), or it did not cover the batch in
# time. Retriable: the leader is right; its followers must catch up or come back.
NOT_ENOUGH_REPLICAS = "not-enough-replicas"
# UNAVAILABLE from a standby coordinator (several share one etcd, one is active): retry at the
# active one, whose advertised "host:port" travels under ACTIVE_COORDINATOR_KEY when it is known.
NOT_COORDINATOR = "not-coordinator"
ACTIVE_COORDINATOR_KEY = "dmq-active-coordinator"


def reason_of(trailing_metadata: object) -> str | None:
    """The reason in a call's trailing metadata (a sequence of (key, value) pairs), if any."""
    return value_of(trailing_metadata, REASON_KEY)


def value_of(trailing_metadata: object, wanted: str) -> str | None:
    """The value of one key of a call's trailing metadata, if present."""
    try:
        for key, value in trailing_metadata or ():  # type: ignore[attr-defined]
            if key == wanted:
                return value if isinstance(value, str) else bytes(value).decode("ascii", "replace")
    except (TypeError, ValueError):
        return None
    return None

# FAILED_PRECONDITION from EventAppend: an event after the condition's position matches its
# query; nothing was stored. CONFLICT_POSITION_KEY names the first such position.
APPEND_CONDITION_FAILED = "append-condition-failed"
CONFLICT_POSITION_KEY = "dmq-conflict-position"
# FAILED_PRECONDITION from an event group's ack / release / renew: the worker does not hold the
# claim (it expired, was released, or the group was reset); the worker claims again.
CLAIM_NOT_HELD = "claim-not-held"


