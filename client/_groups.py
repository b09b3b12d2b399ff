"""What AdminClient's group operations answer, and the offset-reset planner.

Frozen dataclasses built from the coordinator's DescribeGroup / ListGroups answers (unknowns as
None, never the wire's -1), and `plan_reset`: where each partition of a group goes for a reset
target, clamped to its log. Pure: no I/O, so the planner is tested on its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from dmq.client.errors import InvalidArgumentError
from dmq.proto import dmq_pb2 as pb

__all__ = [
    "GroupSummary",
    "GroupMember",
    "GroupSubscription",
    "GroupDescription",
    "PartitionLag",
    "OffsetReset",
    "RESET_TARGETS",
    "ResetTarget",
    "plan_reset",
    "check_reset",
    "check_group_id",
]

ResetTarget = Literal["earliest", "latest", "offset", "timestamp", "shift"]
RESET_TARGETS: tuple[str, ...] = ("earliest", "latest", "offset", "timestamp", "shift")


@dataclass(frozen=True, slots=True)
class GroupSummary:
    group_id: str
    topic: str
    state: str  # EMPTY | PREPARING_REBALANCE | REBALANCING | STABLE
    generation: int
    member_count: int

    @classmethod
    def from_response(cls, g: pb.GroupSummary) -> GroupSummary:
        return cls(g.group_id, g.topic, _state(g.state), g.generation, g.member_count)


@dataclass(frozen=True, slots=True)
class GroupMember:
    member_id: str
    client_id: str
    host: str
    partitions: tuple[int, ...]  # owned now
    target_partitions: tuple[int, ...]  # assigned by the current generation (owned once handed off)

    @classmethod
    def from_response(cls, m: pb.MemberDescription) -> GroupMember:
        return cls(m.member_id, m.client_id, m.host, tuple(sorted(m.partitions)), tuple(sorted(m.target_partitions)))


@dataclass(frozen=True, slots=True)
class GroupSubscription:
    mode: str  # "all" | "new" | "timestamp" ("default" when the coordinator recorded none)
    from_ms: int | None  # for "timestamp"
    created_ms: int | None  # when the group first subscribed

    @classmethod
    def from_response(cls, s: pb.Subscription) -> GroupSubscription:
        name = pb.SubscriptionMode.Name(s.mode).removeprefix("SUBSCRIPTION_MODE_").lower()
        return cls("default" if name == "unspecified" else name, s.from_ms or None, s.created_ms or None)


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """``log_end_offset`` and ``lag`` are None when the partition's broker did not answer; lag
    counts from the committed offset, or from where the subscription starts when none is."""

    partition: int
    committed_offset: int | None
    log_end_offset: int | None
    lag: int | None
    owner_member_id: str | None

    @classmethod
    def from_response(cls, p: pb.PartitionLag) -> PartitionLag:
        known = p.log_end_offset >= 0
        return cls(
            p.partition,
            p.committed_offset if p.committed_offset >= 0 else None,
            p.log_end_offset if known else None,
            p.lag if known and p.lag >= 0 else None,
            p.owner_member_id or None,
        )


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    topic: str
    state: str
    generation: int
    subscription: GroupSubscription
    members: tuple[GroupMember, ...]
    partitions: tuple[PartitionLag, ...]
    total_lag: int  # over the partitions whose lag is known

    @classmethod
    def from_response(cls, d: pb.DescribeGroupResponse) -> GroupDescription:
        return cls(
            d.group_id,
            d.topic,
            _state(d.state),
            d.generation,
            GroupSubscription.from_response(d.subscription),
            tuple(sorted((GroupMember.from_response(m) for m in d.members), key=lambda m: m.member_id)),
            tuple(sorted((PartitionLag.from_response(p) for p in d.partitions), key=lambda p: p.partition)),
            d.total_lag,
        )

    def committed(self) -> dict[int, int | None]:
        return {p.partition: p.committed_offset for p in self.partitions}


@dataclass(frozen=True, slots=True)
class OffsetReset:
    """One partition of reset_offsets(): where the group was, where it goes (clamped to the log)."""

    topic: str
    partition: int
    current_offset: int | None
    new_offset: int
    log_start_offset: int
    log_end_offset: int
    clamped: bool  # the target lay outside [log start, log end]

    @property
    def lag_after(self) -> int:
        return self.log_end_offset - self.new_offset


def _state(code: int) -> str:
    return pb.GroupStateCode.Name(code).removeprefix("GROUP_STATE_")


def check_group_id(group_id: str) -> None:
    if not isinstance(group_id, str) or not group_id:
        raise InvalidArgumentError(f"group_id must be a non-empty string (G_<topic>_<app_id>), got {group_id!r}")


def plan_reset(
    topic: str,
    to: str,
    value: int | None,
    partitions: Iterable[int],
    committed: Mapping[int, int | None],
    bounds: Mapping[int, tuple[int, int]],
    by_time: Mapping[int, int] | None = None,
) -> list[OffsetReset]:
    """The new offset of each partition for reset_offsets(), clamped to [log start, log end].

    ``bounds`` holds each partition's (log start, log end); ``by_time`` the offsets ListOffsets
    found for ``to="timestamp"``. A partition with nothing committed shifts from its log start
    (where a group in the default `all` mode would begin). Pure: no I/O.
    """
    plan = []
    for p in partitions:
        start, end = bounds[p]
        current = committed.get(p)
        if to == "earliest":
            wanted = start
        elif to == "latest":
            wanted = end
        elif to == "offset":
            assert value is not None
            wanted = value
        elif to == "shift":
            assert value is not None
            wanted = (current if current is not None else start) + value
        elif to == "timestamp":
            assert by_time is not None
            wanted = by_time[p]
        else:
            raise InvalidArgumentError(f"to must be one of {', '.join(RESET_TARGETS)}, got {to!r}")
        new = min(max(wanted, start), end)
        plan.append(OffsetReset(topic, p, current, new, start, end, clamped=new != wanted))
    return plan


def check_reset(to: str, value: int | None) -> None:
    if to not in RESET_TARGETS:
        raise InvalidArgumentError(f"to must be one of {', '.join(RESET_TARGETS)}, got {to!r}")
    needs_value = to in ("offset", "timestamp", "shift")
    if not needs_value:
        if value is not None:
            raise InvalidArgumentError(f"value is not used with to={to!r}; leave it out")
        return
    if isinstance(value, bool) or not isinstance(value, int):
        what = {"offset": "the offset (>= 0)", "timestamp": "ms since the epoch (>= 0)",
                "shift": "how far to move each committed offset (negative = back)"}[to]
        raise InvalidArgumentError(f"to={to!r} needs value: {what}, got {value!r}")
    if to in ("offset", "timestamp") and value < 0:
        raise InvalidArgumentError(f"value for to={to!r} must be >= 0, got {value}")
