"""Requests and responses of the pure handlers (the gRPC layer converts to and from dmq.v1).

Conventions shared with the proto: integer fields left at 0 mean "use the server's default"
(``session_timeout_ms``, ``max_poll_interval_ms``); a generation of -1 means "none yet".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .effects import Subscription, SubscriptionMode
from .state import GroupState


@dataclass(frozen=True, slots=True)
class FindOrCreateGroupRequest:
    topic: str
    app_id: str
    # The topic's current partition count (from the metadata store). When it is larger than
    # the group's, the group learns it here as well.
    partition_count: int
    subscription_mode: SubscriptionMode | None = None  # None = the coordinator's default
    subscription_from_ms: int | None = None  # required for TIMESTAMP
    # For NEW only: partition -> log end offset, for every partition, read by the service
    # (ListOffsets latest) before creating the group. Ignored when the group already exists.
    snapshot_offsets: Mapping[int, int] | None = None
    created_ms: int = 0  # wall-clock ms, stored for describe


@dataclass(frozen=True, slots=True)
class FindOrCreateGroupResponse:
    group_id: str
    created: bool
    subscription: Subscription  # the recorded one: the first subscriber's wins
    partition_count: int


@dataclass(frozen=True, slots=True)
class JoinGroupRequest:
    client_id: str
    # A consumer instance's own stable id (e.g. a uuid made at start). A join that names the
    # consumer_id of a live member returns that member instead of adding another, so a join
    # retried after a lost answer does not leave a phantom member behind until it expires.
    consumer_id: str = ""
    host: str = ""
    session_timeout_ms: int = 0
    max_poll_interval_ms: int = 0
    # The secret a new member gets (the service draws it; a rejoin keeps the member's own).
    member_secret: str = field(default="", repr=False)


@dataclass(frozen=True, slots=True)
class JoinGroupResponse:
    member_id: str
    generation: int  # the group's current generation; the member's first comes with a rebalance
    session_timeout_ms: int  # effective values after defaults
    max_poll_interval_ms: int
    rejoined: bool  # True when consumer_id matched an existing member
    member_secret: str = field(default="", repr=False)  # prove membership with it from now on


@dataclass(frozen=True, slots=True)
class GetAssignmentRequest:
    member_id: str
    member_secret: str = field(default="", repr=False)


@dataclass(frozen=True, slots=True)
class GetAssignmentResponse:
    topic: str
    generation: int
    partitions: tuple[int, ...]  # owned now, sorted
    # Partitions this generation gives the member that their previous owner still holds: ask
    # again once a heartbeat / watch event says assignment_changed.
    pending_partitions: tuple[int, ...]
    rebalance_in_progress: bool  # state is not STABLE: more may change, ask again
    start_positions: tuple[tuple[int, int], ...]  # (partition, Subscription.start_position)
    released: tuple[int, ...]  # given up by this call (commit them before calling)
    acquired: tuple[int, ...]  # gained by this call


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    member_id: str
    generation: int = -1  # the generation the member last fetched
    # Milliseconds since the application last called poll(), measured by the client. When
    # given, it counts as poll activity for max_poll_interval_ms (a consumer that polls but
    # rarely commits is not expired). Delivery delay makes it optimistic by at most one RPC.
    poll_age_ms: int | None = None
    member_secret: str = field(default="", repr=False)


@dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    generation: int
    assignment_changed: bool  # call GetAssignment (inside poll())
    rebalance_in_progress: bool


@dataclass(frozen=True, slots=True)
class LeaveGroupRequest:
    member_id: str
    member_secret: str = field(default="", repr=False)


@dataclass(frozen=True, slots=True)
class LeaveGroupResponse:
    released: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PollRequest:
    """Explicit poll activity, for a transport that reports it separately from heartbeats."""

    member_id: str


@dataclass(frozen=True, slots=True)
class PollResponse:
    generation: int


@dataclass(frozen=True, slots=True)
class CheckOwnershipRequest:
    """May ``member_id`` commit offsets for ``partitions``, as of ``generation``?

    ``member_id == ""`` with ``generation == -1`` is an operator's offset reset, allowed only
    while the group is EMPTY.
    """

    member_id: str
    generation: int
    partitions: Sequence[int]
    topic: str | None = None  # checked against the group's topic when given
    member_secret: str = field(default="", repr=False)  # the committing member's (not for resets)


@dataclass(frozen=True, slots=True)
class CheckOwnershipResponse:
    generation: int


@dataclass(frozen=True, slots=True)
class DeleteGroupResponse:
    group_id: str


@dataclass(frozen=True, slots=True)
class TickResponse:
    next_deadline_ms: int | None  # when the driver must tick again at the latest (None: idle)


@dataclass(frozen=True, slots=True)
class PartitionCountResponse:
    partition_count: int


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member_id: str
    client_id: str
    consumer_id: str
    host: str
    partitions: tuple[int, ...]  # owned now
    target_partitions: tuple[int, ...]  # assigned by the current generation
    acked_generation: int
    session_timeout_ms: int
    max_poll_interval_ms: int
    last_heartbeat_ms: int
    last_poll_ms: int


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    topic: str
    app_id: str
    state: GroupState
    generation: int
    partition_count: int
    subscription: Subscription
    members: tuple[MemberDescription, ...]
    owners: tuple[tuple[int, str | None], ...]  # (partition, owner member id or None)
