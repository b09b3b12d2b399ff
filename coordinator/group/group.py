"""The in-memory state of one consumer group, and read-only questions about it.

All changes are made by the pure handlers in ``handlers.py``; this module holds the data, the
invariants it keeps, and queries the service needs (``assignment_changed`` for watch streams,
``describe`` for the admin API).

Two assignments exist at once, on purpose:

- ``target``: what the current generation *should* look like (range assignment over the live
  members when the generation started). Changes only when the generation is bumped.
- ``owners``: who *actually* owns each partition now. A partition moves to its target member
  only after its previous owner released it (by acknowledging a generation through
  get_assignment) or left the group; the new owner then acquires it on its own
  get_assignment. ``owners`` is a map, so a partition has at most one owner by construction,
  and every owner is a live member (removing a member frees its partitions at once).

Invariants (checked by the tests after every simulated step):
1. every ``owners`` entry names a live member and a partition < ``partition_count``;
2. a member that acknowledged the current generation owns only partitions of its target;
3. STABLE => every partition is owned by its target member and every member acknowledged;
4. EMPTY <=> no members (and then no owners, no target, no pending rebalance);
5. the rebalance timer is armed iff the state is PREPARING_REBALANCE;
6. ``generation`` never decreases.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from dmq.proto import limits

from .assignor import PartitionAssignor, RangeAssignor
from .effects import Event, StateChanged, Subscription, SubscriptionMode
from .errors import UnknownGroupMemberError
from .messages import GroupDescription, MemberDescription
from .state import GroupState, transition_to
from .timer import Timer

# Timer keys: (kind, member_id). One rebalance timer per group, two liveness timers per member.
TimerKey = tuple[str, str]
REBALANCE_TIMER: TimerKey = ("rebalance", "")
SESSION_TIMER = "session"
POLL_TIMER = "poll"


def random_member_id(client_id: str) -> str:
    """``<client_id>-<uuid4>``: readable in logs, and never reused across coordinator
    restarts, so a member id from before a restart cannot match a new member."""
    return f"{client_id or 'consumer'}-{uuid.uuid4().hex}"


@dataclass(frozen=True, slots=True)
class GroupConfig:
    rebalance_debounce_ms: int = 500
    # Continuous churn re-arms the debounce; this caps how long a rebalance can be put off.
    rebalance_max_delay_ms: int = 5_000
    default_session_timeout_ms: int = 10_000
    min_session_timeout_ms: int = limits.SESSION_TIMEOUT_MS_MIN
    max_session_timeout_ms: int = limits.SESSION_TIMEOUT_MS_MAX
    default_max_poll_interval_ms: int = 300_000
    min_max_poll_interval_ms: int = limits.MAX_POLL_INTERVAL_MS_MIN
    max_max_poll_interval_ms: int = limits.MAX_POLL_INTERVAL_MS_MAX
    max_members: int = 1_000
    max_id_chars: int = 255  # client_id, consumer_id, host
    default_subscription_mode: SubscriptionMode = SubscriptionMode.ALL
    # Injected so simulations are deterministic; the default is random (see random_member_id).
    member_id_factory: Callable[[str], str] = random_member_id
    assignor: PartitionAssignor = field(default_factory=RangeAssignor)

    def __post_init__(self) -> None:
        if self.rebalance_debounce_ms < 0:
            raise ValueError("rebalance_debounce_ms must be >= 0")
        if self.rebalance_max_delay_ms < self.rebalance_debounce_ms:
            raise ValueError("rebalance_max_delay_ms must be >= rebalance_debounce_ms")
        for name in ("session_timeout_ms", "max_poll_interval_ms"):
            low = getattr(self, f"min_{name}")
            default = getattr(self, f"default_{name}")
            high = getattr(self, f"max_{name}")
            if not 0 < low <= default <= high:
                raise ValueError(f"need 0 < min_{name} <= default_{name} <= max_{name}")
        if self.max_members < 1:
            raise ValueError("max_members must be >= 1")


@dataclass(slots=True)
class Member:
    member_id: str
    client_id: str
    consumer_id: str
    host: str
    session_timeout_ms: int
    max_poll_interval_ms: int
    joined_ms: int
    last_heartbeat_ms: int  # last request of any kind (heartbeats, fetches, commits, joins)
    last_poll_ms: int  # last poll activity (get_assignment, commit, reported poll)
    acked_generation: int = -1  # generation of the member's last get_assignment; -1 = none
    # Issued at join (made by the service: the machine draws no randomness) and required by every
    # later request of the member. "" only for members made without one (the machine's own tests).
    secret: str = field(default="", repr=False)


class Ownership(NamedTuple):
    member_id: str
    # The generation the member acknowledged when it acquired the partition. A commit naming
    # an older generation predates this ownership and is refused.
    since_generation: int


class Group:
    __slots__ = (
        "group_id",
        "topic",
        "app_id",
        "partition_count",
        "subscription",
        "config",
        "state",
        "generation",
        "members",
        "target",
        "target_owner",
        "owners",
        "owned_by",
        "timer",
        "prepare_started_ms",
        "_by_consumer",
    )

    def __init__(
        self,
        group_id: str,
        topic: str,
        app_id: str,
        partition_count: int,
        subscription: Subscription,
        config: GroupConfig,
    ) -> None:
        self.group_id = group_id
        self.topic = topic
        self.app_id = app_id
        self.partition_count = partition_count
        self.subscription = subscription
        self.config = config
        self.state = GroupState.EMPTY
        self.generation = 0
        self.members: dict[str, Member] = {}
        self.target: dict[str, frozenset[int]] = {}  # member -> partitions, current generation
        self.target_owner: dict[int, str] = {}  # partition -> member, current generation
        self.owners: dict[int, Ownership] = {}  # partition -> actual owner now
        self.owned_by: dict[str, set[int]] = {}  # member -> partitions owned now (index)
        self.timer: Timer[TimerKey] = Timer()
        self.prepare_started_ms: int | None = None  # first change of the pending rebalance
        self._by_consumer: dict[str, str] = {}  # consumer_id -> member_id

    # ------------------------------------------------------------------ state changes

    def transition_to(self, new_state: GroupState, events: list[Event]) -> None:
        old = self.state
        self.state = transition_to(old, new_state)
        events.append(StateChanged(self.group_id, old, new_state))

    def index_consumer(self, member: Member) -> None:
        if member.consumer_id:
            self._by_consumer[member.consumer_id] = member.member_id

    def unindex_consumer(self, member: Member) -> None:
        if member.consumer_id and self._by_consumer.get(member.consumer_id) == member.member_id:
            del self._by_consumer[member.consumer_id]

    # ------------------------------------------------------------------ queries

    def member(self, member_id: str) -> Member:
        try:
            return self.members[member_id]
        except KeyError:
            raise UnknownGroupMemberError(self.group_id, member_id) from None

    def member_by_consumer(self, consumer_id: str) -> Member | None:
        member_id = self._by_consumer.get(consumer_id) if consumer_id else None
        return None if member_id is None else self.members.get(member_id)

    def owned_partitions(self, member_id: str) -> tuple[int, ...]:
        return tuple(sorted(self.owned_by.get(member_id, ())))

    def target_partitions(self, member_id: str) -> tuple[int, ...]:
        return tuple(sorted(self.target.get(member_id, ())))

    def pending_partitions(self, member_id: str) -> tuple[int, ...]:
        """Target partitions of the member still owned by someone else."""
        return tuple(
            sorted(
                p
                for p in self.target.get(member_id, ())
                if (o := self.owners.get(p)) is not None and o.member_id != member_id
            )
        )

    def assignment_changed(self, member_id: str) -> bool:
        """Would a get_assignment by this member change anything (or tell it anything new)?

        Three cases: 1. it has not acknowledged the current generation; 2. it owns a partition
        outside its target (it must commit and release it); 3. a partition of its target is
        free (its previous owner released it or is gone) and waits to be acquired.
        """
        member = self.members.get(member_id)
        if member is None:
            return False
        if member.acked_generation != self.generation:
            return True
        target = self.target.get(member_id, frozenset())
        if not self.owned_by.get(member_id, set()) <= target:
            return True
        return any(p not in self.owners for p in target)

    def is_converged(self) -> bool:
        """Every member acknowledged the generation and owns exactly its target, and every
        partition of the topic is in the target (no partitions added since)."""
        if not self.members:
            return False
        if any(m.acked_generation != self.generation for m in self.members.values()):
            return False
        if len(self.target_owner) != self.partition_count:
            return False
        return all(
            self.owned_by.get(member_id, set()) == self.target.get(member_id, frozenset())
            for member_id in self.members
        )

    def start_positions(self, partitions: Iterable[int]) -> tuple[tuple[int, int], ...]:
        return tuple((p, self.subscription.start_position(p)) for p in partitions)

    def next_deadline_ms(self) -> int | None:
        return self.timer.next_deadline_ms()

    def describe(self) -> GroupDescription:
        members = tuple(
            MemberDescription(
                member_id=m.member_id,
                client_id=m.client_id,
                consumer_id=m.consumer_id,
                host=m.host,
                partitions=self.owned_partitions(m.member_id),
                target_partitions=self.target_partitions(m.member_id),
                acked_generation=m.acked_generation,
                session_timeout_ms=m.session_timeout_ms,
                max_poll_interval_ms=m.max_poll_interval_ms,
                last_heartbeat_ms=m.last_heartbeat_ms,
                last_poll_ms=m.last_poll_ms,
            )
            for m in sorted(self.members.values(), key=lambda m: m.member_id)
        )
        owners = tuple(
            (p, o.member_id if (o := self.owners.get(p)) is not None else None)
            for p in range(self.partition_count)
        )
        return GroupDescription(
            group_id=self.group_id,
            topic=self.topic,
            app_id=self.app_id,
            state=self.state,
            generation=self.generation,
            partition_count=self.partition_count,
            subscription=self.subscription,
            members=members,
            owners=owners,
        )

    def __repr__(self) -> str:
        return (
            f"Group(group_id={self.group_id!r}, state={self.state.name}, "
            f"generation={self.generation}, members={len(self.members)}, "
            f"partitions={self.partition_count}, owned={len(self.owners)}, "
            f"mode={self.subscription.mode.value})"
        )
