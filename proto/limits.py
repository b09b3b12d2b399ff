"""Numeric limits of topics, shared by the coordinator (which records topics), the brokers (which
store them) and the client (which checks before sending): one table, so a topic the coordinator
accepts is always one a broker can store.

  partitions         1..PARTITIONS_PER_TOPIC_MAX per topic
  retention_ms       -1 (keep forever) or 0..MAX_DURATION_MS
  retention_bytes    -1 (no size limit) or 0..2^63-1
  segment_bytes      SEGMENT_BYTES_MIN..2^31-1 (index entries hold 32-bit file positions; the
                     broker's log refuses smaller segments)
  segment_ms         1..MAX_DURATION_MS
  max_message_bytes  MAX_MESSAGE_BYTES_MIN..MAX_MESSAGE_BYTES_MAX (a batch must fit a fetch response)
  dedup_window_ms    0 (off)..DEDUP_WINDOW_MS_MAX; default DEDUP_WINDOW_MS_DEFAULT (transaction ids)
  queue mode (DESIGN.md "Queue mode"):
  delay_ms, window_buffer_ms   0..MAX_DURATION_MS
  max_wait_ms                  1..MAX_DURATION_MS
  lease_ms                     LEASE_MS_MIN..LEASE_MS_MAX (also the bounds of a pop's own lease_ms)
  max_delivery_attempts        1..MAX_DELIVERY_ATTEMPTS_MAX
  max_queue_size               0 (unlimited)..2^63-1
  replication (DESIGN.md "Replication"):
  replication_factor           1..REPLICATION_FACTOR_MAX (and at most the live brokers, checked by
                               the coordinator)
  min_insync_replicas          1..REPLICATION_FACTOR_MAX (and at most replication_factor)
"""

from __future__ import annotations

from collections.abc import Mapping

from dmq.proto.names import FieldError

PARTITIONS_MIN = 1
PARTITIONS_PER_TOPIC_MAX = 10_000

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
# A century: beyond any sensible retention, and small enough that `now_ms + duration` never overflows int64.
MAX_DURATION_MS = 100 * 365 * 24 * 3600 * 1000
# The broker's log (LogConfig) refuses segments under 1 KiB: a topic must never be accepted by the
# coordinator and then refused by every broker.
SEGMENT_BYTES_MIN = 1024
SEGMENT_BYTES_MAX = INT32_MAX
# A batch is at least its 57-byte header plus one record.
MAX_MESSAGE_BYTES_MIN = 64
# dmq.proto.grpc_options.MAX_FETCH_RESPONSE_BYTES: a fetch returns at least one whole batch, so no
# batch may be larger than the largest fetch response.
MAX_MESSAGE_BYTES_MAX = 60 * 1024 * 1024

# Transaction-id de-duplication (broker/log/dedup.py): the leader keeps the ids of this window in
# memory, so it is bounded (a day) besides the per-partition cap on entries.
DEDUP_WINDOW_MS_DEFAULT = 120_000
DEDUP_WINDOW_MS_MAX = 24 * 3600 * 1000

# A group member's timeouts, as the group coordinator accepts them in JoinGroup
# (coordinator.group.GroupConfig); the consumer checks its config against the same numbers.
SESSION_TIMEOUT_MS_MIN = 1_000
SESSION_TIMEOUT_MS_MAX = 300_000
MAX_POLL_INTERVAL_MS_MIN = 1_000
MAX_POLL_INTERVAL_MS_MAX = 3_600_000

# Queue mode: a lease shorter than the expiry timer's resolution would expire before its records
# arrive; an hour is longer than any sensible unit of work without a renewal.
LEASE_MS_MIN = 100
LEASE_MS_MAX = 3_600_000
DEFAULT_LEASE_MS = 30_000
MAX_DELIVERY_ATTEMPTS_MAX = 1_000
DEFAULT_MAX_DELIVERY_ATTEMPTS = 5

# Replicas of one partition: each is a full copy fetched from the leader, so more than a handful
# multiplies the leader's fetch load for no durability that matters.
REPLICATION_FACTOR_MAX = 16

# name -> (low, high, -1 allowed as "no limit")
TOPIC_CONFIG_RANGES: dict[str, tuple[int, int, bool]] = {
    "retention_ms": (0, MAX_DURATION_MS, True),
    "retention_bytes": (0, INT64_MAX, True),
    "segment_bytes": (SEGMENT_BYTES_MIN, SEGMENT_BYTES_MAX, False),
    "segment_ms": (1, MAX_DURATION_MS, False),
    "max_message_bytes": (MAX_MESSAGE_BYTES_MIN, MAX_MESSAGE_BYTES_MAX, False),
    "dedup_window_ms": (0, DEDUP_WINDOW_MS_MAX, False),
    "delay_ms": (0, MAX_DURATION_MS, False),
    "max_wait_ms": (1, MAX_DURATION_MS, False),
    "window_buffer_ms": (0, MAX_DURATION_MS, False),
    "lease_ms": (LEASE_MS_MIN, LEASE_MS_MAX, False),
    "max_delivery_attempts": (1, MAX_DELIVERY_ATTEMPTS_MAX, False),
    "max_queue_size": (0, INT64_MAX, False),
    "replication_factor": (1, REPLICATION_FACTOR_MAX, False),
    "min_insync_replicas": (1, REPLICATION_FACTOR_MAX, False),
}


def check_partition_count(count: object, *, field: str = "partitions") -> None:
    if isinstance(count, bool) or not isinstance(count, int):
        raise FieldError(field, f"must be an integer, got {type(count).__name__}")
    if not PARTITIONS_MIN <= count <= PARTITIONS_PER_TOPIC_MAX:
        raise FieldError(
            field, f"must be between {PARTITIONS_MIN} and {PARTITIONS_PER_TOPIC_MAX}, got {count}"
        )


def check_partition_number(partition: object, *, field: str = "partition") -> None:
    if isinstance(partition, bool) or not isinstance(partition, int):
        raise FieldError(field, f"must be an integer, got {type(partition).__name__}")
    if not 0 <= partition < PARTITIONS_PER_TOPIC_MAX:
        raise FieldError(field, f"must be within 0..{PARTITIONS_PER_TOPIC_MAX - 1}, got {partition}")


def check_topic_config(values: Mapping[str, object], *, field_prefix: str = "config.") -> None:
    """Check the settings that are set (None = unset); unknown names are refused."""
    for name, value in values.items():
        field = field_prefix + name
        if name not in TOPIC_CONFIG_RANGES:
            raise FieldError(field, f"unknown setting; known are {sorted(TOPIC_CONFIG_RANGES)}")
        if value is None:
            continue
        low, high, unlimited = TOPIC_CONFIG_RANGES[name]
        if isinstance(value, bool) or not isinstance(value, int):
            raise FieldError(field, f"must be an integer, got {type(value).__name__}")
        if unlimited and value == -1:
            continue
        if not low <= value <= high:
            extra = " or -1 for no limit" if unlimited else ""
            raise FieldError(field, f"must be between {low} and {high}{extra}, got {value}")
