"""What handlers hand back instead of doing: persistence records and observable events.

Every handler returns ``Result(response, records, events)``:

- ``records`` must be made durable by the caller (SQLite) before it answers the client. They
  carry the only group state that survives a restart: a group's existence and subscription
  (mode, time, snapshot offsets). `GroupRegistry.replay(record)` applies them, both live (the
  handlers call it themselves, so the in-memory state already reflects them) and at start-up.
  If persisting fails, the caller undoes a live ``GroupCreated`` by replaying
  ``GroupDeleted`` with the same group id.
- ``events`` are not persisted. They tell the service what happened so it can log (with
  group= / member= fields) and wake ``WatchGroup`` streams: after any result with events, every
  watcher re-evaluates ``Group.assignment_changed(member_id)``.

Membership, generations and ownership are never recorded: after a coordinator restart every
member gets NOT_FOUND and re-joins (member ids are random, so an old id never matches a new
member).

Record JSON shape (``record_to_dict`` / ``record_from_dict``), one object per record::

    {"type": "group_created", "group_id": str, "topic": str, "app_id": str,
     "partition_count": int, "subscription": {"mode": "all"|"new"|"timestamp",
     "from_ms": int|null, "created_ms": int, "snapshot_offsets": {"<partition>": int}}}
    {"type": "group_deleted", "group_id": str}
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from dmq.proto.offset_markers import START_AT_LOG_START, START_BY_TIMESTAMP  # noqa: F401 - re-exported

from .state import GroupState

# Start positions for a partition with no committed offset (dmq.v1.StartPosition.offset):
# START_AT_LOG_START, START_BY_TIMESTAMP (dmq.proto.offset_markers).


class SubscriptionMode(enum.Enum):
    ALL = "all"  # from the log start
    NEW = "new"  # from the log end snapshotted when the group was created
    TIMESTAMP = "timestamp"  # from the first offset appended at or after from_ms


@dataclass(frozen=True, slots=True)
class Subscription:
    """Recorded once, when the group first appears; later subscribers get it (first wins)."""

    mode: SubscriptionMode
    from_ms: int | None = None  # wall-clock ms; required for TIMESTAMP, None otherwise
    created_ms: int = 0  # wall-clock ms of creation, informational (describe)
    # NEW: partition -> its log end offset when the group was created (read-only after init).
    snapshot_offsets: Mapping[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "snapshot_offsets", MappingProxyType(dict(self.snapshot_offsets)))

    def start_position(self, partition: int) -> int:
        """Where ``partition`` starts when it has no committed offset.

        ALL -> START_AT_LOG_START; TIMESTAMP -> START_BY_TIMESTAMP (ListOffsets with from_ms);
        NEW -> the snapshotted log end, or 0 for a partition created after the group, so
        nothing produced to it is skipped.
        """
        if self.mode is SubscriptionMode.ALL:
            return START_AT_LOG_START
        if self.mode is SubscriptionMode.TIMESTAMP:
            return START_BY_TIMESTAMP
        return self.snapshot_offsets.get(partition, 0)


# ------------------------------------------------------------------------------ records


@dataclass(frozen=True, slots=True)
class GroupCreated:
    group_id: str
    topic: str
    app_id: str
    partition_count: int  # at creation; the live count follows the topic's metadata
    subscription: Subscription


@dataclass(frozen=True, slots=True)
class GroupDeleted:
    group_id: str


Record = GroupCreated | GroupDeleted


def record_to_dict(record: Record) -> dict[str, Any]:
    if isinstance(record, GroupCreated):
        sub = record.subscription
        return {
            "type": "group_created",
            "group_id": record.group_id,
            "topic": record.topic,
            "app_id": record.app_id,
            "partition_count": record.partition_count,
            "subscription": {
                "mode": sub.mode.value,
                "from_ms": sub.from_ms,
                "created_ms": sub.created_ms,
                "snapshot_offsets": {str(p): o for p, o in sorted(sub.snapshot_offsets.items())},
            },
        }
    return {"type": "group_deleted", "group_id": record.group_id}


def record_from_dict(data: Mapping[str, Any]) -> Record:
    kind = data.get("type")
    if kind == "group_created":
        sub = data["subscription"]
        return GroupCreated(
            group_id=str(data["group_id"]),
            topic=str(data["topic"]),
            app_id=str(data["app_id"]),
            partition_count=int(data["partition_count"]),
            subscription=Subscription(
                mode=SubscriptionMode(sub["mode"]),
                from_ms=None if sub.get("from_ms") is None else int(sub["from_ms"]),
                created_ms=int(sub.get("created_ms", 0)),
                snapshot_offsets={
                    int(p): int(o) for p, o in dict(sub.get("snapshot_offsets") or {}).items()
                },
            ),
        )
    if kind == "group_deleted":
        return GroupDeleted(group_id=str(data["group_id"]))
    raise ValueError(f"unknown group record type {kind!r}")


# ------------------------------------------------------------------------------ events


class RemovalReason(enum.Enum):
    LEFT = "left"
    SESSION_TIMEOUT = "session_timeout"  # no heartbeat (or other request) for session_timeout_ms
    MAX_POLL_INTERVAL = "max_poll_interval"  # no poll activity for max_poll_interval_ms


@dataclass(frozen=True, slots=True)
class MemberJoined:
    group_id: str
    member_id: str
    client_id: str


@dataclass(frozen=True, slots=True)
class MemberRemoved:
    group_id: str
    member_id: str
    reason: RemovalReason
    released: tuple[int, ...]  # partitions it owned, now free


@dataclass(frozen=True, slots=True)
class RebalanceScheduled:
    group_id: str
    deadline_ms: int


@dataclass(frozen=True, slots=True)
class GenerationStarted:
    group_id: str
    generation: int
    assignment: Mapping[str, tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class PartitionsReleased:
    """The owner acknowledged a generation that no longer gives it these partitions."""

    group_id: str
    member_id: str
    generation: int
    partitions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PartitionsAcquired:
    group_id: str
    member_id: str
    generation: int
    partitions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StateChanged:
    group_id: str
    old: GroupState
    new: GroupState


@dataclass(frozen=True, slots=True)
class PartitionCountChanged:
    group_id: str
    old: int
    new: int


Event = (
    MemberJoined
    | MemberRemoved
    | RebalanceScheduled
    | GenerationStarted
    | PartitionsReleased
    | PartitionsAcquired
    | StateChanged
    | PartitionCountChanged
)

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Result(Generic[R]):
    response: R
    records: tuple[Record, ...] = ()
    events: tuple[Event, ...] = field(default=())
