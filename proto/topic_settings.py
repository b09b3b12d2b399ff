"""Topic names, partition counts and topic settings: the rules, shared by the coordinator and the client.

Pure Python (no gRPC, no protobuf) so the client can check a request before sending it and a user
gets the same message either way. Every error names the field (as spelled in dmq.proto) and the
limit, e.g. `partitions: must be between 1 and 10000, got 0`.

The rules themselves live in dmq.proto (names.py: names and ids, limits.py: numbers), shared
with the brokers, so a topic the coordinator accepts is always one a broker can store; this module
is the coordinator's and the client's view of them (TopicSettings, the error type). It is part of
the contract, not of the coordinator, because the admin client checks with it and the client never
imports server code.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from dmq.proto import event_headers, limits, names
from dmq.proto.limits import (  # noqa: F401 - re-exported: the limits as this module always named them
    INT32_MAX,
    INT64_MAX,
    MAX_DURATION_MS,
    MAX_MESSAGE_BYTES_MAX,
    MAX_MESSAGE_BYTES_MIN,
    PARTITIONS_MIN,
    SEGMENT_BYTES_MAX,
    SEGMENT_BYTES_MIN,
)
from dmq.proto.names import FieldError

TOPIC_NAME_MAX_CHARS = names.TOPIC_NAME_MAX_BYTES  # names are ASCII: characters = bytes
PARTITIONS_MAX = limits.PARTITIONS_PER_TOPIC_MAX

# One error type for every rule, wherever it is checked (dmq.proto.names raises it too).
ValidationError = FieldError


def validate_topic_name(name: str, *, field: str = "name") -> None:
    names.check_topic_name(name, field=field)


def validate_partition_count(count: int, *, field: str = "partitions") -> None:
    limits.check_partition_count(count, field=field)


def validate_partition_increase(current: int, requested: int, *, field: str = "partitions") -> None:
    """AddPartitions takes the new total, which must exceed the current count (partitions never shrink)."""
    validate_partition_count(requested, field=field)
    if requested <= current:
        raise ValidationError(
            field,
            f"the new total must be greater than the current {current} partitions, got {requested} "
            "(partitions can be added, never removed)",
        )


@dataclass(frozen=True, slots=True)
class TopicSettings:
    """Per-topic settings, mirroring dmq.proto TopicConfig. None = not set: the broker's default applies."""

    retention_ms: int | None = None
    retention_bytes: int | None = None
    segment_bytes: int | None = None
    segment_ms: int | None = None
    max_message_bytes: int | None = None
    dedup_window_ms: int | None = None
    # queue mode (dmq.proto.limits, DESIGN.md "Queue mode")
    delay_ms: int | None = None
    max_wait_ms: int | None = None
    window_buffer_ms: int | None = None
    lease_ms: int | None = None
    max_delivery_attempts: int | None = None
    max_queue_size: int | None = None
    # "log" or "event-store" (dmq.proto.event_headers); None = "log"
    kind: str | None = None
    # replication (DESIGN.md "Replication"); None: the coordinator's defaults (replication_defaults)
    replication_factor: int | None = None
    min_insync_replicas: int | None = None
    unclean_leader_election: bool | None = None

    def validate(self, *, field_prefix: str = "config.") -> None:
        numbers = asdict(self)
        kind = numbers.pop("kind")
        unclean = numbers.pop("unclean_leader_election")
        limits.check_topic_config(numbers, field_prefix=field_prefix)
        if kind is not None:
            event_headers.check_topic_kind(kind, field=f"{field_prefix}kind")
        if unclean is not None and not isinstance(unclean, bool):
            raise ValidationError(f"{field_prefix}unclean_leader_election", f"must be true or false, got {unclean!r}")
        rf, min_insync = self.replication_factor, self.min_insync_replicas
        if rf is not None and min_insync is not None and min_insync > rf:
            raise ValidationError(
                f"{field_prefix}min_insync_replicas",
                f"must be at most replication_factor ({rf}), got {min_insync}: acks=all could never be answered",
            )

    def check_replication(self, live_brokers: int, *, field_prefix: str = "config.") -> None:
        """A replication factor needs that many live brokers (each replica on its own broker)."""
        rf = self.replication_factor
        if rf is not None and rf > live_brokers:
            raise ValidationError(
                f"{field_prefix}replication_factor",
                f"{rf} replicas need {rf} live brokers, there are {live_brokers}: lower it or start brokers",
            )

    @property
    def is_event_store(self) -> bool:
        return self.kind == event_headers.KIND_EVENT_STORE

    def check_event_store(self, partitions: int, *, field: str = "partitions") -> None:
        """An event store is one partition (one global order) kept forever (positions have no
        gaps): any other partition count or a retention limit is refused."""
        if not self.is_event_store:
            return
        if partitions != 1:
            raise ValidationError(field, f"an event-store topic has exactly 1 partition (one global order), got {partitions}")
        for name in ("retention_ms", "retention_bytes"):
            value = getattr(self, name)
            if value is not None and value != -1:
                raise ValidationError(f"config.{name}", f"an event-store topic keeps every event: must be -1, got {value}")

    def with_defaults(self, defaults: TopicSettings | None) -> TopicSettings:
        """These settings, with each unset field taken from `defaults`."""
        if defaults is None:
            return self
        merged = {
            f.name: getattr(self, f.name) if getattr(self, f.name) is not None else getattr(defaults, f.name)
            for f in fields(self)
        }
        return TopicSettings(**merged)

    def to_dict(self) -> dict[str, Any]:
        """Only the fields that are set."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TopicSettings:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValidationError("config", f"unknown settings {unknown}; known are {sorted(known)}")
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> TopicSettings:
        return cls.from_dict(json.loads(text) if text else {})


def default_min_insync_replicas(replication_factor: int) -> int:
    """2 when there are 3 or more replicas (one may be down and acks=all still answers, yet an
    acknowledged record is on two brokers), else 1."""
    return 2 if replication_factor >= 3 else 1


def replication_defaults(settings: TopicSettings, live_brokers: int, default_factor: int | None) -> TopicSettings:
    """A new topic's replication settings made explicit: replication_factor defaults to
    `default_factor` (an operator's setting, which may exceed the brokers live now: the caller
    refuses it) or, when None, min(3, live brokers) (event stores too: their index and groups'
    progress replicate with the log); min_insync_replicas to 2 with 3 or more
    replicas, else 1 (never above the factor); unclean_leader_election to false."""
    rf = settings.replication_factor
    if rf is None:
        rf = default_factor if default_factor is not None else min(3, max(1, live_brokers))
    min_insync = settings.min_insync_replicas
    if min_insync is None:
        min_insync = min(default_min_insync_replicas(rf), rf)
    unclean = bool(settings.unclean_leader_election)
    return replace(settings, replication_factor=rf, min_insync_replicas=min_insync, unclean_leader_election=unclean)


# The server-wide defaults (CoordinatorNode(default_topic_config=...)) have the same shape; they fill
# unset fields when a topic is created, and the result is recorded with the topic.
TopicConfigDefaults = TopicSettings

