"""Topic names, partition counts and topic settings: the rules, shared by the coordinator and the client.

Pure Python (no gRPC, no protobuf) so the client can check a request before sending it and a user
gets the same message either way. Every error names the field (as spelled in dmq.proto) and the
limit, e.g. `partitions: must be between 1 and 10000, got 0`.

Rules (Kafka's, where Kafka has one):
  name               1..249 characters of [a-zA-Z0-9._-], not "." or ".." (Kafka's legal topic names;
                     249 keeps `<topic>-<partition>` directory names under common 255-byte limits)
  partitions         1..10,000 per topic; AddPartitions only increases
  retention_ms       -1 (keep forever) or 0..MAX_DURATION_MS
  retention_bytes    -1 (no size limit) or 0..2^63-1
  segment_bytes      SEGMENT_BYTES_MIN..2^31-1 (index entries hold 32-bit file positions)
  segment_ms         1..MAX_DURATION_MS
  max_message_bytes  MAX_MESSAGE_BYTES_MIN..MAX_MESSAGE_BYTES_MAX (a batch must fit a fetch response)
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, fields
from typing import Any

TOPIC_NAME_MAX_CHARS = 249
PARTITIONS_MIN = 1
PARTITIONS_MAX = 10_000

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
# A century: beyond any sensible retention, and small enough that `now_ms + duration` never overflows int64.
MAX_DURATION_MS = 100 * 365 * 24 * 3600 * 1000
# Small segments are legitimate in tests of rolling and retention; below a batch header they are nonsense.
SEGMENT_BYTES_MIN = 64
SEGMENT_BYTES_MAX = INT32_MAX
# A batch is at least its 57-byte header plus one record.
MAX_MESSAGE_BYTES_MIN = 64
# dmq.proto.grpc_options.MAX_FETCH_RESPONSE_BYTES: a fetch returns at least one whole batch, so no
# batch may be larger than the largest fetch response.
MAX_MESSAGE_BYTES_MAX = 60 * 1024 * 1024

_TOPIC_NAME_RE = re.compile(r"[a-zA-Z0-9._-]+")


class ValidationError(ValueError):
    """A request field breaks a rule. `field` is the field's name as spelled in dmq.proto."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def validate_topic_name(name: str, *, field: str = "name") -> None:
    if not isinstance(name, str):
        raise ValidationError(field, f"topic name must be a string, got {type(name).__name__}")
    if not name:
        raise ValidationError(field, "topic name must not be empty")
    if len(name) > TOPIC_NAME_MAX_CHARS:
        raise ValidationError(
            field, f"topic name is {len(name)} characters long, the limit is {TOPIC_NAME_MAX_CHARS}"
        )
    if name in (".", ".."):
        raise ValidationError(field, f"topic name cannot be {name!r}")
    if not _TOPIC_NAME_RE.fullmatch(name):
        bad = next(c for c in name if not _TOPIC_NAME_RE.fullmatch(c))
        raise ValidationError(
            field,
            f"topic name {_shorten(name)!r} contains {bad!r}; "
            "allowed are ASCII letters, digits, '.', '_' and '-'",
        )


def validate_partition_count(count: int, *, field: str = "partitions") -> None:
    if isinstance(count, bool) or not isinstance(count, int):
        raise ValidationError(field, f"must be an integer, got {type(count).__name__}")
    if not PARTITIONS_MIN <= count <= PARTITIONS_MAX:
        raise ValidationError(field, f"must be between {PARTITIONS_MIN} and {PARTITIONS_MAX}, got {count}")


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

    def validate(self, *, field_prefix: str = "config.") -> None:
        def check(name: str, value: int | None, low: int, high: int, *, unlimited: bool = False) -> None:
            if value is None:
                return
            field = field_prefix + name
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValidationError(field, f"must be an integer, got {type(value).__name__}")
            if unlimited and value == -1:
                return
            if not low <= value <= high:
                extra = " or -1 for no limit" if unlimited else ""
                raise ValidationError(field, f"must be between {low} and {high}{extra}, got {value}")

        check("retention_ms", self.retention_ms, 0, MAX_DURATION_MS, unlimited=True)
        check("retention_bytes", self.retention_bytes, 0, INT64_MAX, unlimited=True)
        check("segment_bytes", self.segment_bytes, SEGMENT_BYTES_MIN, SEGMENT_BYTES_MAX)
        check("segment_ms", self.segment_ms, 1, MAX_DURATION_MS)
        check("max_message_bytes", self.max_message_bytes, MAX_MESSAGE_BYTES_MIN, MAX_MESSAGE_BYTES_MAX)

    def with_defaults(self, defaults: TopicSettings | None) -> TopicSettings:
        """These settings, with each unset field taken from `defaults`."""
        if defaults is None:
            return self
        merged = {
            f.name: getattr(self, f.name) if getattr(self, f.name) is not None else getattr(defaults, f.name)
            for f in fields(self)
        }
        return TopicSettings(**merged)

    def to_dict(self) -> dict[str, int]:
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


# The server-wide defaults (CoordinatorNode(default_topic_config=...)) have the same shape; they fill
# unset fields when a topic is created, and the result is recorded with the topic.
TopicConfigDefaults = TopicSettings


def _shorten(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
