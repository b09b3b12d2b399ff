"""Pure request handlers of the group machine: ``(group, request, now_ms) -> Result``.

No I/O, no clock, no logging: each handler validates, then mutates the in-memory `Group`, and
returns the response plus the events (and, for registry-level operations, the records) the
caller must act on. A handler that raises has changed nothing.

Liveness (both measured on the injected ``now_ms``):
- session: any request from the member (join, heartbeat, get_assignment, poll, accepted
  commit) refreshes it; none for ``session_timeout_ms`` => removed (crash, network loss).
- poll: get_assignment, an accepted commit, an explicit poll and a heartbeat's ``poll_age_ms``
  count; none for ``max_poll_interval_ms`` => removed (the process lives but its application
  loop is stuck, so it would keep its partitions forever).

Commit rule (``check_ownership``): a member may commit partition ``p`` as of generation ``g``
iff it owns ``p`` now and ``since_generation(p) <= g <= current generation``. So:
- a stale generation is fine while the member still owns the partition: that is exactly the
  final commit of a revoked owner before it acknowledges, which the new owner then starts from;
- a commit naming a generation from before the member (re)acquired ``p`` is refused: it is a
  delayed retry from an earlier ownership and would move the offset backwards over commits
  made by the owners in between;
- anything from a non-owner is refused with FAILED_PRECONDITION ("fetch your assignment").
"""

from __future__ import annotations

import hmac

from .effects import (
    Event,
    GenerationStarted,
    MemberJoined,
    MemberRemoved,
    PartitionCountChanged,
    PartitionsAcquired,
    PartitionsReleased,
    RebalanceScheduled,
    RemovalReason,
    Result,
)
from .errors import (
    ConsumerGroupNotEmptyError,
    GroupFullError,
    IllegalStateTransitionError,
    InvalidRequestError,
    MemberSecretError,
    NotOwnerError,
)
from .group import POLL_TIMER, REBALANCE_TIMER, SESSION_TIMER, Group, Member, Ownership
from .messages import (
    CheckOwnershipRequest,
    CheckOwnershipResponse,
    GetAssignmentRequest,
    GetAssignmentResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    PartitionCountResponse,
    PollRequest,
    PollResponse,
    TickResponse,
)
from .state import GroupState

_MEMBER_ID_ATTEMPTS = 8


# ---------------------------------------------------------------------------------- join


def handle_join(group: Group, request: JoinGroupRequest, now_ms: int) -> Result[JoinGroupResponse]:
    config = group.config
    for name in ("client_id", "consumer_id", "host"):
        if len(getattr(request, name)) > config.max_id_chars:
            raise InvalidRequestError(f"{name} is longer than {config.max_id_chars} characters")

    existing = group.member_by_consumer(request.consumer_id)
    if existing is not None:
        # A retried join (its first answer was lost) or a consumer that thinks it was dropped:
        # same member, no rebalance.
        _touch_session(group, existing, now_ms)
        _touch_poll(group, existing, now_ms)
        return Result(_join_response(group, existing, rejoined=True))

    session_timeout_ms = _bounded(
        "session_timeout_ms",
        request.session_timeout_ms or config.default_session_timeout_ms,
        config.min_session_timeout_ms,
        config.max_session_timeout_ms,
    )
    max_poll_interval_ms = _bounded(
        "max_poll_interval_ms",
        request.max_poll_interval_ms or config.default_max_poll_interval_ms,
        config.min_max_poll_interval_ms,
        config.max_max_poll_interval_ms,
    )
    if len(group.members) >= config.max_members:
        raise GroupFullError(group.group_id, config.max_members)
    member_id = _new_member_id(group, request.client_id)

    events: list[Event] = []
    member = Member(
        member_id=member_id,
        client_id=request.client_id,
        consumer_id=request.consumer_id,
        host=request.host,
        session_timeout_ms=session_timeout_ms,
        max_poll_interval_ms=max_poll_interval_ms,
        joined_ms=now_ms,
        last_heartbeat_ms=now_ms,
        last_poll_ms=now_ms,
        secret=request.member_secret,
    )
    group.members[member_id] = member
    group.index_consumer(member)
    _touch_active(group, member, now_ms)
    events.append(MemberJoined(group.group_id, member_id, request.client_id))
    _request_rebalance(group, now_ms, events)
    return Result(_join_response(group, member, rejoined=False), events=tuple(events))


def _join_response(group: Group, member: Member, *, rejoined: bool) -> JoinGroupResponse:
    return JoinGroupResponse(
        member_id=member.member_id,
        generation=group.generation,
        session_timeout_ms=member.session_timeout_ms,
        max_poll_interval_ms=member.max_poll_interval_ms,
        rejoined=rejoined,
        member_secret=member.secret,
    )


def prove_member(group: Group, member_id: str, secret: str) -> Member:
    """The member, if the request carries its secret (compared in constant time); else
    UnknownGroupMemberError / MemberSecretError."""
    member = group.member(member_id)
    if member.secret and not hmac.compare_digest(member.secret.encode(), secret.encode()):
        raise MemberSecretError(group.group_id, member_id)
    return member


def _bounded(name: str, value: int, low: int, high: int) -> int:
    if not low <= value <= high:
        raise InvalidRequestError(f"{name}={value} is outside the coordinator's [{low}, {high}]")
    return value


def _new_member_id(group: Group, client_id: str) -> str:
    for _ in range(_MEMBER_ID_ATTEMPTS):
        member_id = group.config.member_id_factory(client_id)
        if member_id and member_id not in group.members:
            return member_id
    raise IllegalStateTransitionError(
        f"member_id_factory returned {_MEMBER_ID_ATTEMPTS} ids already in use for {group.group_id!r}"
    )


# -------------------------------------------------------------------------- get_assignment


def handle_get_assignment(
    group: Group, request: GetAssignmentRequest, now_ms: int
) -> Result[GetAssignmentResponse]:
    """The member acknowledges the current generation.

    1. It releases every partition it owns outside its target (the client committed them
       before calling). 2. It acquires every partition of its target that nobody owns (the
       previous owner released it, left or expired, or there was none). Partitions of its
       target still owned by another member stay pending. 3. If that completes the hand-off,
       the group becomes STABLE.
    """
    member = prove_member(group, request.member_id, request.member_secret)
    events: list[Event] = []
    _touch_active(group, member, now_ms)
    member.acked_generation = group.generation

    member_id = member.member_id
    target = group.target.get(member_id, frozenset())
    owned = group.owned_by.setdefault(member_id, set())
    released = tuple(sorted(p for p in owned if p not in target))
    for p in released:
        owned.discard(p)
        del group.owners[p]
    acquired = tuple(sorted(p for p in target if p not in group.owners))
    for p in acquired:
        group.owners[p] = Ownership(member_id, group.generation)
        owned.add(p)
    if released:
        events.append(PartitionsReleased(group.group_id, member_id, group.generation, released))
    if acquired:
        events.append(PartitionsAcquired(group.group_id, member_id, group.generation, acquired))

    if group.state is GroupState.REBALANCING and group.is_converged():
        group.transition_to(GroupState.STABLE, events)

    partitions = group.owned_partitions(member_id)
    response = GetAssignmentResponse(
        topic=group.topic,
        generation=group.generation,
        partitions=partitions,
        pending_partitions=group.pending_partitions(member_id),
        rebalance_in_progress=group.state is not GroupState.STABLE,
        start_positions=group.start_positions(partitions),
        released=released,
        acquired=acquired,
    )
    return Result(response, events=tuple(events))


# ------------------------------------------------------------------------------- heartbeat


def handle_heartbeat(
    group: Group, request: HeartbeatRequest, now_ms: int
) -> Result[HeartbeatResponse]:
    member = prove_member(group, request.member_id, request.member_secret)
    if request.poll_age_ms is not None and request.poll_age_ms < 0:
        raise InvalidRequestError(f"poll_age_ms={request.poll_age_ms} must be >= 0")
    _touch_session(group, member, now_ms)
    if request.poll_age_ms is not None:
        _touch_poll(group, member, now_ms - request.poll_age_ms)
    changed = (
        request.generation != group.generation or group.assignment_changed(member.member_id)
    )
    return Result(
        HeartbeatResponse(
            generation=group.generation,
            assignment_changed=changed,
            rebalance_in_progress=group.state is not GroupState.STABLE,
        )
    )


def handle_poll(group: Group, request: PollRequest, now_ms: int) -> Result[PollResponse]:
    member = group.member(request.member_id)
    _touch_active(group, member, now_ms)
    return Result(PollResponse(generation=group.generation))


# ----------------------------------------------------------------------------------- leave


def handle_leave(
    group: Group, request: LeaveGroupRequest, now_ms: int
) -> Result[LeaveGroupResponse]:
    """Raises UnknownGroupMemberError for a member already gone; a client treats that as done."""
    member = prove_member(group, request.member_id, request.member_secret)
    events: list[Event] = []
    released = _remove_member(group, member, RemovalReason.LEFT, now_ms, events)
    return Result(LeaveGroupResponse(released=released), events=tuple(events))


# ------------------------------------------------------------------------ commit ownership


def check_ownership(
    group: Group, request: CheckOwnershipRequest, now_ms: int
) -> Result[CheckOwnershipResponse]:
    """May this commit go ahead? See the commit rule in the module docstring."""
    if request.topic is not None and request.topic != group.topic:
        raise InvalidRequestError(
            f"group {group.group_id!r} consumes topic {group.topic!r}, not {request.topic!r}"
        )
    if request.member_id == "" and request.generation == -1:
        if group.members:
            raise ConsumerGroupNotEmptyError(group.group_id, len(group.members), "reset its offsets")
        return Result(CheckOwnershipResponse(generation=group.generation))

    member = prove_member(group, request.member_id, request.member_secret)
    reasons: dict[int, str] = {}
    for p in request.partitions:
        ownership = group.owners.get(p)
        if request.generation > group.generation:
            reasons[p] = (
                f"generation {request.generation} is newer than the group's {group.generation}"
            )
        elif ownership is None or ownership.member_id != member.member_id:
            reasons[p] = "not owned by this member"
        elif request.generation < ownership.since_generation:
            reasons[p] = (
                f"owned since generation {ownership.since_generation}, commit names "
                f"generation {request.generation}"
            )
    if reasons:
        raise NotOwnerError(group.group_id, member.member_id, reasons)
    _touch_active(group, member, now_ms)
    return Result(CheckOwnershipResponse(generation=group.generation))


# ------------------------------------------------------------------------- partition count


def handle_partition_count_change(
    group: Group, partition_count: int, now_ms: int
) -> Result[PartitionCountResponse]:
    """The topic gained partitions: they start unowned and a rebalance is scheduled to
    assign them (nothing is taken away from current owners until then)."""
    if partition_count < group.partition_count:
        raise InvalidRequestError(
            f"partition count of {group.topic!r} cannot shrink "
            f"({group.partition_count} -> {partition_count})"
        )
    if partition_count == group.partition_count:
        return Result(PartitionCountResponse(partition_count))
    events: list[Event] = [
        PartitionCountChanged(group.group_id, group.partition_count, partition_count)
    ]
    group.partition_count = partition_count
    if group.members:
        _request_rebalance(group, now_ms, events)
    return Result(PartitionCountResponse(partition_count), events=tuple(events))


# ------------------------------------------------------------------------------------ tick


def tick(group: Group, now_ms: int) -> Result[TickResponse]:
    """Fire every timer due at ``now_ms``, in deadline order: members whose session or poll
    interval expired are removed (freeing their partitions), and a due debounced rebalance
    starts the next generation."""
    events: list[Event] = []
    while (key := group.timer.pop_expired(now_ms)) is not None:
        kind, member_id = key
        if key == REBALANCE_TIMER:
            _rebalance(group, events)
        elif kind in (SESSION_TIMER, POLL_TIMER):
            member = group.members.get(member_id)
            if member is not None:
                reason = (
                    RemovalReason.SESSION_TIMEOUT
                    if kind == SESSION_TIMER
                    else RemovalReason.MAX_POLL_INTERVAL
                )
                _remove_member(group, member, reason, now_ms, events)
    return Result(TickResponse(group.next_deadline_ms()), events=tuple(events))


def handle_coordinator_pause(group: Group, paused_ms: int, now_ms: int) -> Result[TickResponse]:
    """The coordinator was not running for ``paused_ms`` up to ``now_ms`` (SIGSTOP, a stalled
    loop): nobody could be heard meanwhile, through no fault of theirs. A member whose session
    was running when it stopped gets a new session from now, and its poll deadline moves later
    by the pause (its poll reports could not arrive either). Called before the timers fire.

    A pause of at most half a member's session leaves it alone: a member heartbeating several
    times per session cannot have expired through it, and a busy event loop's stall (also seen as
    a pause) must not give a dead member a whole new session."""
    stopped_ms = now_ms - paused_ms
    for member in group.members.values():
        if paused_ms <= member.session_timeout_ms // 2:
            continue
        if stopped_ms - member.last_heartbeat_ms > member.session_timeout_ms:
            continue  # already expired before the pause: its timer fires as it would have
        _touch_session(group, member, now_ms)
        member.last_poll_ms = min(now_ms, member.last_poll_ms + paused_ms)
        group.timer.schedule((POLL_TIMER, member.member_id), member.last_poll_ms + member.max_poll_interval_ms)
    return Result(TickResponse(group.next_deadline_ms()))


# ------------------------------------------------------------------------------- internals


def _touch_active(group: Group, member: Member, now_ms: int) -> None:
    """The member spoke and is polling: its session and its poll interval both start again."""
    _touch_session(group, member, now_ms)
    _touch_poll(group, member, now_ms)


def _touch_session(group: Group, member: Member, now_ms: int) -> None:
    member.last_heartbeat_ms = max(member.last_heartbeat_ms, now_ms)
    group.timer.schedule(
        (SESSION_TIMER, member.member_id), member.last_heartbeat_ms + member.session_timeout_ms
    )


def _touch_poll(group: Group, member: Member, polled_at_ms: int) -> None:
    if polled_at_ms > member.last_poll_ms or (POLL_TIMER, member.member_id) not in group.timer:
        member.last_poll_ms = max(member.last_poll_ms, polled_at_ms)
        group.timer.schedule(
            (POLL_TIMER, member.member_id), member.last_poll_ms + member.max_poll_interval_ms
        )


def _remove_member(
    group: Group, member: Member, reason: RemovalReason, now_ms: int, events: list[Event]
) -> tuple[int, ...]:
    member_id = member.member_id
    del group.members[member_id]
    group.unindex_consumer(member)
    group.timer.cancel((SESSION_TIMER, member_id))
    group.timer.cancel((POLL_TIMER, member_id))
    released = tuple(sorted(group.owned_by.pop(member_id, set())))
    for p in released:
        del group.owners[p]
    events.append(MemberRemoved(group.group_id, member_id, reason, released))
    _request_rebalance(group, now_ms, events)
    return released


def _request_rebalance(group: Group, now_ms: int, events: list[Event]) -> None:
    """Schedule (or re-arm) the debounced rebalance, or empty the group if nobody is left."""
    if not group.members:
        group.timer.cancel(REBALANCE_TIMER)
        group.prepare_started_ms = None
        group.target = {}
        group.target_owner = {}
        if group.state is not GroupState.EMPTY:
            group.transition_to(GroupState.EMPTY, events)
        return
    if group.state is not GroupState.PREPARING_REBALANCE:
        group.transition_to(GroupState.PREPARING_REBALANCE, events)
        group.prepare_started_ms = now_ms
    started_ms = group.prepare_started_ms if group.prepare_started_ms is not None else now_ms
    config = group.config
    deadline_ms = min(
        now_ms + config.rebalance_debounce_ms, started_ms + config.rebalance_max_delay_ms
    )
    group.timer.schedule(REBALANCE_TIMER, deadline_ms)
    events.append(RebalanceScheduled(group.group_id, deadline_ms))


def _rebalance(group: Group, events: list[Event]) -> None:
    """Start the next generation: a new target over the live members. Ownership is not
    touched here; it follows through the members' get_assignment calls."""
    if group.state is not GroupState.PREPARING_REBALANCE or not group.members:
        raise IllegalStateTransitionError(
            f"rebalance timer fired in state {group.state.name} with {len(group.members)} members"
        )
    group.generation += 1
    assignment = group.config.assignor.assign(
        sorted(group.members), range(group.partition_count)
    )
    group.target = {m: frozenset(ps) for m, ps in assignment.items()}
    group.target_owner = {p: m for m, ps in assignment.items() for p in ps}
    group.prepare_started_ms = None
    group.transition_to(GroupState.REBALANCING, events)
    events.append(
        GenerationStarted(
            group.group_id,
            group.generation,
            {m: tuple(sorted(ps)) for m, ps in assignment.items()},
        )
    )
