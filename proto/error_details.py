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
    "reason_of",
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
# FAILED_PRECONDITION from RegisterBroker: another live broker (or another principal) holds the id;
# a restarted broker at a new address retries until the old registration's session expires.
BROKER_ID_TAKEN = "broker-id-taken"


def reason_of(trailing_metadata: object) -> str | None:
    """The reason in a call's trailing metadata (a sequence of (key, value) pairs), if any."""
    try:
        for key, value in trailing_metadata or ():  # type: ignore[attr-defined]
            if key == REASON_KEY:
                return value if isinstance(value, str) else bytes(value).decode("ascii", "replace")
    except (TypeError, ValueError):
        return None
    return None
