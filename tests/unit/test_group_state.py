"""Group coordinator state machine: scenarios driven through the pure handlers with a fake clock."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from dmq.coordinator.group import (
    START_AT_LOG_START,
    START_BY_TIMESTAMP,
    VALID_PREVIOUS_STATES,
    CheckOwnershipRequest,
    ConsumerGroupNotEmptyError,
    ConsumerGroupNotFoundError,
    FakeClock,
    FindOrCreateGroupRequest,
    GenerationStarted,
    GetAssignmentRequest,
    GetAssignmentResponse,
    Group,
    GroupConfig,
    GroupCreated,
    GroupDeleted,
    GroupFullError,
    GroupIdCollisionError,
    GroupRegistry,
    GroupState,
    HeartbeatRequest,
    HeartbeatResponse,
    IllegalStateTransitionError,
    InvalidRequestError,
    JoinGroupRequest,
    LeaveGroupRequest,
    MemberRemoved,
    NotOwnerError,
    PartitionsAcquired,
    PartitionsReleased,
    PollRequest,
    RemovalReason,
    Result,
    SubscriptionMode,
    Timer,
    UnknownGroupMemberError,
    check_ownership,
    handle_get_assignment,
    handle_heartbeat,
    handle_join,
    handle_leave,
    handle_poll,
    record_from_dict,
    record_to_dict,
    tick,
    transition_to,
)
from dmq.coordinator.group.group import REBALANCE_TIMER

TOPIC = "orders"
APP = "billing"
GROUP_ID = f"G_{TOPIC}_{APP}"


class Ctx:
    """A group, a fake clock, and everything the handlers returned (after Kafka's
    GroupMetadataManagerTestContext). Member ids are the client ids, so tests read naturally."""

    def __init__(self, partitions: int = 10, **config: Any) -> None:
        settings: dict[str, Any] = {
            "min_session_timeout_ms": 100,
            "min_max_poll_interval_ms": 100,
            "member_id_factory": lambda client_id: client_id,
        }
        settings.update(config)
        self.clock = FakeClock()
        self.registry = GroupRegistry(GroupConfig(**settings))
        self.records: list[Any] = []
        self.events: list[Any] = []
        self.apply(
            self.registry.find_or_create(
                FindOrCreateGroupRequest(topic=TOPIC, app_id=APP, partition_count=partitions),
                self.now,
            )
        )
        self.group: Group = self.registry.get(GROUP_ID)

    @property
    def now(self) -> int:
        return self.clock.now_ms()

    def apply(self, result: Result[Any]) -> Any:
        self.records.extend(result.records)
        self.events.extend(result.events)
        return result.response

    def join(self, client_id: str, **kwargs: Any) -> str:
        request = JoinGroupRequest(client_id=client_id, **kwargs)
        return str(self.apply(handle_join(self.group, request, self.now)).member_id)

    def assignment(self, member_id: str) -> GetAssignmentResponse:
        request = GetAssignmentRequest(member_id)
        response: GetAssignmentResponse = self.apply(
            handle_get_assignment(self.group, request, self.now)
        )
        return response

    def heartbeat(
        self, member_id: str, generation: int | None = None, poll_age_ms: int | None = None
    ) -> HeartbeatResponse:
        gen = self.group.generation if generation is None else generation
        request = HeartbeatRequest(member_id, gen, poll_age_ms)
        response: HeartbeatResponse = self.apply(handle_heartbeat(self.group, request, self.now))
        return response

    def commit(self, member_id: str, partitions: list[int], generation: int | None = None) -> None:
        gen = self.group.generation if generation is None else generation
        request = CheckOwnershipRequest(member_id, gen, partitions, topic=TOPIC)
        self.apply(check_ownership(self.group, request, self.now))

    def leave(self, member_id: str) -> tuple[int, ...]:
        released: tuple[int, ...] = self.apply(
            handle_leave(self.group, LeaveGroupRequest(member_id), self.now)
        ).released
        return released

    def sleep(self, ms: int) -> None:
        """Advance the clock, firing each timer at its own deadline."""
        until = self.now + ms
        while (deadline := self.group.next_deadline_ms()) is not None and deadline <= until:
            self.clock.advance_to(deadline)
            self.apply(tick(self.group, self.now))
        self.clock.advance_to(until)

    def live_for(self, ms: int, members: list[str], step_ms: int = 1_000) -> None:
        """Sleep while ``members`` heartbeat (reporting that they polled) every ``step_ms``."""
        end = self.now + ms
        while self.now < end:
            self.sleep(min(step_ms, end - self.now))
            for m in members:
                self.heartbeat(m, poll_age_ms=0)

    def settle(self) -> None:
        """Let the debounce fire, then let every member fetch until the group is STABLE."""
        deadline = self.group.timer.deadline_ms(REBALANCE_TIMER)
        if deadline is not None:
            self.sleep(deadline - self.now)
        for _ in range(3):
            for m in sorted(self.group.members):
                self.assignment(m)
        assert self.group.state is GroupState.STABLE

    def owned(self, member_id: str) -> list[int]:
        return list(self.group.owned_partitions(member_id))

    def of_type(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


# --------------------------------------------------------------------------------- join, debounce


def test_first_join_waits_for_the_debounce_then_gets_every_partition() -> None:
    ctx = Ctx()
    a = ctx.join("a")
    assert ctx.group.state is GroupState.PREPARING_REBALANCE
    assert ctx.group.generation == 0
    ctx.sleep(499)
    assert ctx.group.state is GroupState.PREPARING_REBALANCE
    ctx.sleep(1)
    assert (ctx.group.state, ctx.group.generation) == (GroupState.REBALANCING, 1)
    response = ctx.assignment(a)
    assert response.partitions == tuple(range(10))
    assert (response.generation, response.rebalance_in_progress) == (1, False)
    assert response.start_positions == tuple((p, START_AT_LOG_START) for p in range(10))
    assert ctx.group.state is GroupState.STABLE


def test_each_join_rearms_the_debounce() -> None:
    ctx = Ctx()
    ctx.join("a")
    ctx.sleep(300)
    ctx.join("b")
    ctx.sleep(300)
    ctx.join("c")
    ctx.sleep(499)  # t = 1099
    assert ctx.group.generation == 0
    ctx.sleep(1)  # t = 1100: 500 ms after the last join
    assert ctx.group.generation == 1
    assert ctx.of_type(GenerationStarted)[-1].assignment == {
        "a": (0, 1, 2, 3),
        "b": (4, 5, 6),
        "c": (7, 8, 9),
    }


def test_continuous_churn_cannot_postpone_the_rebalance_past_max_delay() -> None:
    ctx = Ctx(rebalance_debounce_ms=500, rebalance_max_delay_ms=2_000)
    for i in range(10):  # a join every 400 ms would re-arm a 500 ms debounce forever
        ctx.join(f"m{i}")
        ctx.sleep(400)
        if ctx.group.generation:
            break
    assert ctx.group.generation == 1
    assert ctx.of_type(GenerationStarted)[0].generation == 1
    assert ctx.now == 2_000  # capped: first change at 0 + rebalance_max_delay_ms


@pytest.mark.parametrize(
    ("debounce_ms", "fires_at_ms"), [(0, 0), (100, 100), (2_000, 2_000)], ids=str
)
def test_debounce_is_configurable(debounce_ms: int, fires_at_ms: int) -> None:
    ctx = Ctx(rebalance_debounce_ms=debounce_ms)
    ctx.join("a")
    assert ctx.group.next_deadline_ms() == fires_at_ms
    ctx.sleep(fires_at_ms)
    assert ctx.group.generation == 1


def test_three_members_get_the_range_assignment() -> None:
    ctx = Ctx()
    a, b, c = ctx.join("a"), ctx.join("b"), ctx.join("c")
    ctx.settle()
    assert [ctx.owned(m) for m in (a, b, c)] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]


def test_join_with_known_consumer_id_returns_the_same_member_without_rebalance() -> None:
    ctx = Ctx()
    first = ctx.join("a", consumer_id="proc-1")
    ctx.settle()
    gen = ctx.group.generation
    again = ctx.apply(handle_join(ctx.group, JoinGroupRequest("a", consumer_id="proc-1"), ctx.now))
    assert (again.member_id, again.rejoined) == (first, True)
    assert (ctx.group.state, ctx.group.generation) == (GroupState.STABLE, gen)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("session_timeout_ms", 50),
        ("session_timeout_ms", 300_001),
        ("max_poll_interval_ms", 50),
        ("max_poll_interval_ms", 3_600_001),
        ("client_id", "x" * 256),
    ],
    ids=["session_too_short", "session_too_long", "poll_too_short", "poll_too_long", "long_id"],
)
def test_join_rejects_out_of_range_settings_and_changes_nothing(field: str, value: Any) -> None:
    ctx = Ctx()
    kwargs: dict[str, Any] = {"client_id": "a", field: value}
    with pytest.raises(InvalidRequestError, match=field) as info:
        handle_join(ctx.group, JoinGroupRequest(**kwargs), ctx.now)
    assert info.value.code == "INVALID_ARGUMENT"
    assert ctx.group.state is GroupState.EMPTY and not ctx.group.members


def test_join_defaults_timeouts_when_zero() -> None:
    ctx = Ctx()
    response = ctx.apply(handle_join(ctx.group, JoinGroupRequest("a"), ctx.now))
    assert (response.session_timeout_ms, response.max_poll_interval_ms) == (10_000, 300_000)


def test_group_full() -> None:
    ctx = Ctx(max_members=2)
    ctx.join("a")
    ctx.join("b")
    with pytest.raises(GroupFullError) as info:
        ctx.join("c")
    assert info.value.code == "RESOURCE_EXHAUSTED"
    assert sorted(ctx.group.members) == ["a", "b"]


def test_random_member_ids_are_unique_and_prefixed_by_client_id() -> None:
    registry = GroupRegistry()
    registry.find_or_create(FindOrCreateGroupRequest(TOPIC, APP, 1), 0)
    group = registry.get(GROUP_ID)
    ids = {handle_join(group, JoinGroupRequest("cli"), 0).response.member_id for _ in range(50)}
    assert len(ids) == 50 and all(i.startswith("cli-") for i in ids)


# ------------------------------------------------------------------------------------ liveness


def test_session_timeout_removes_member_frees_partitions_and_rebalances() -> None:
    ctx = Ctx()
    a, b = ctx.join("a", session_timeout_ms=10_000), ctx.join("b", session_timeout_ms=10_000)
    ctx.settle()
    assert ctx.owned(b) == [5, 6, 7, 8, 9]
    start = ctx.now
    ctx.live_for(9_000, [a])  # b is silent
    assert b in ctx.group.members
    ctx.live_for(1_000, [a])
    assert b not in ctx.group.members and ctx.now == start + 10_000
    removed = ctx.of_type(MemberRemoved)[-1]
    assert (removed.member_id, removed.reason, removed.released) == (
        b,
        RemovalReason.SESSION_TIMEOUT,
        (5, 6, 7, 8, 9),
    )
    assert ctx.group.state is GroupState.PREPARING_REBALANCE
    assert ctx.heartbeat(a).assignment_changed is False  # old target: nothing to do yet
    ctx.live_for(1_000, [a])
    assert ctx.group.generation == 2
    assert ctx.heartbeat(a, generation=1).assignment_changed is True
    assert ctx.assignment(a).partitions == tuple(range(10))
    assert ctx.group.state is GroupState.STABLE


def test_heartbeats_keep_a_member_alive_past_its_session_timeout() -> None:
    ctx = Ctx()
    a = ctx.join("a", session_timeout_ms=1_000, max_poll_interval_ms=100_000)
    ctx.settle()
    ctx.live_for(20_000, [a], step_ms=900)
    assert a in ctx.group.members


@pytest.mark.parametrize(
    ("activity", "survives"),
    [
        ("heartbeat_only", False),
        ("heartbeat_with_poll_age", True),
        ("get_assignment", True),
        ("commit", True),
        ("explicit_poll", True),
    ],
)
def test_max_poll_interval(activity: str, survives: bool) -> None:
    ctx = Ctx()
    a = ctx.join("a", session_timeout_ms=1_000, max_poll_interval_ms=5_000)
    ctx.settle()
    for _ in range(20):  # 10 s, twice the poll interval
        ctx.sleep(500)
        if a not in ctx.group.members:
            break
        if activity == "heartbeat_with_poll_age":
            ctx.heartbeat(a, poll_age_ms=100)
        else:
            ctx.heartbeat(a)
        if activity == "get_assignment":
            ctx.assignment(a)
        elif activity == "commit":
            ctx.commit(a, [0])
        elif activity == "explicit_poll":
            ctx.apply(handle_poll(ctx.group, PollRequest(a), ctx.now))
    assert (a in ctx.group.members) is survives
    if not survives:
        removed = ctx.of_type(MemberRemoved)[-1]
        assert removed.reason is RemovalReason.MAX_POLL_INTERVAL
        assert ctx.group.state is GroupState.EMPTY and not ctx.group.owners


def test_stale_poll_age_does_not_move_last_poll_backwards() -> None:
    ctx = Ctx()
    a = ctx.join("a", max_poll_interval_ms=5_000)
    ctx.sleep(1_000)
    ctx.apply(handle_poll(ctx.group, PollRequest(a), ctx.now))
    ctx.heartbeat(a, poll_age_ms=900)  # reports an older poll than the one already seen
    assert ctx.group.members[a].last_poll_ms == 1_000


def test_leave_releases_at_once_and_last_leave_empties_the_group() -> None:
    ctx = Ctx()
    a, b = ctx.join("a"), ctx.join("b")
    ctx.settle()
    assert ctx.leave(b) == (5, 6, 7, 8, 9)
    assert not any(o.member_id == b for o in ctx.group.owners.values())
    assert ctx.group.state is GroupState.PREPARING_REBALANCE
    assert ctx.leave(a) == (0, 1, 2, 3, 4)
    assert ctx.group.state is GroupState.EMPTY
    assert ctx.group.next_deadline_ms() is None  # no rebalance for nobody
    with pytest.raises(UnknownGroupMemberError):
        ctx.leave(a)


@pytest.mark.parametrize("call", ["heartbeat", "get_assignment", "leave", "poll", "commit"])
def test_unknown_member_is_not_found(call: str) -> None:
    ctx = Ctx()
    ctx.join("a")
    actions = {
        "heartbeat": lambda: ctx.heartbeat("ghost"),
        "get_assignment": lambda: ctx.assignment("ghost"),
        "leave": lambda: ctx.leave("ghost"),
        "poll": lambda: handle_poll(ctx.group, PollRequest("ghost"), ctx.now),
        "commit": lambda: ctx.commit("ghost", [0]),
    }
    with pytest.raises(UnknownGroupMemberError, match="join the group again") as info:
        actions[call]()
    assert info.value.code == "NOT_FOUND" and info.value.retriable


# ------------------------------------------------------------------------------------ hand-off


def _a_owns_all_then_b_joins() -> tuple[Ctx, str, str]:
    ctx = Ctx()
    a = ctx.join("a")
    ctx.settle()
    assert ctx.group.generation == 1 and ctx.owned(a) == list(range(10))
    b = ctx.join("b")
    ctx.sleep(500)
    assert (ctx.group.state, ctx.group.generation) == (GroupState.REBALANCING, 2)
    assert ctx.owned(a) == list(range(10))  # nothing taken away by the rebalance itself
    return ctx, a, b


def test_handoff_when_old_owner_acknowledges_first() -> None:
    ctx, a, b = _a_owns_all_then_b_joins()
    assert ctx.heartbeat(a, generation=1).assignment_changed is True
    ctx.commit(a, [5, 6, 7, 8, 9], generation=1)  # the final commit before acknowledging
    response = ctx.assignment(a)
    assert (response.partitions, response.released) == ((0, 1, 2, 3, 4), (5, 6, 7, 8, 9))
    assert response.rebalance_in_progress is True
    assert all(p not in ctx.group.owners for p in range(5, 10))  # free, not yet b's
    response = ctx.assignment(b)
    assert (response.partitions, response.acquired, response.pending_partitions) == (
        (5, 6, 7, 8, 9),
        (5, 6, 7, 8, 9),
        (),
    )
    assert response.rebalance_in_progress is False
    assert ctx.group.state is GroupState.STABLE


def test_handoff_when_new_owner_asks_first() -> None:
    ctx, a, b = _a_owns_all_then_b_joins()
    response = ctx.assignment(b)
    assert response.partitions == ()
    assert response.pending_partitions == (5, 6, 7, 8, 9)
    assert response.rebalance_in_progress is True
    assert ctx.heartbeat(b).assignment_changed is False  # waiting on a: nothing to fetch yet
    with pytest.raises(NotOwnerError):
        ctx.commit(b, [5])
    ctx.commit(a, [5], generation=1)  # a still owns it: its stale generation is fine
    ctx.assignment(a)
    assert ctx.heartbeat(b).assignment_changed is True  # now free
    assert ctx.group.state is GroupState.REBALANCING
    response = ctx.assignment(b)
    assert response.partitions == (5, 6, 7, 8, 9) and response.pending_partitions == ()
    assert ctx.group.state is GroupState.STABLE
    acquired = ctx.of_type(PartitionsAcquired)[-1]
    assert (acquired.member_id, acquired.generation, acquired.partitions) == (b, 2, (5, 6, 7, 8, 9))


def test_handoff_completes_when_the_old_owner_crashes_instead_of_acknowledging() -> None:
    ctx = Ctx()
    a = ctx.join("a", session_timeout_ms=3_000)
    ctx.settle()
    b = ctx.join("b", session_timeout_ms=3_000)
    ctx.live_for(1_000, [b])
    assert ctx.assignment(b).pending_partitions == (5, 6, 7, 8, 9)
    ctx.live_for(2_000, [b])  # a never answers: gone by its session timeout
    assert a not in ctx.group.members
    assert ctx.heartbeat(b).assignment_changed is True  # its target partitions are free
    assert ctx.assignment(b).partitions == (5, 6, 7, 8, 9)  # taken under the current target
    ctx.live_for(1_000, [b])  # the next generation gives b everything
    assert ctx.assignment(b).partitions == tuple(range(10))
    assert ctx.group.state is GroupState.STABLE


def test_hand_off_keeps_consuming_during_preparing_rebalance() -> None:
    ctx, a, b = _a_owns_all_then_b_joins()
    c = ctx.join("c")  # back to PREPARING: gen-2 hand-offs may still proceed
    assert ctx.group.state is GroupState.PREPARING_REBALANCE
    ctx.assignment(a)
    response = ctx.assignment(b)
    assert response.partitions == (5, 6, 7, 8, 9) and response.rebalance_in_progress
    assert ctx.assignment(c).partitions == ()  # c has no target before generation 3
    ctx.settle()
    assert [ctx.owned(m) for m in (a, b, c)] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]


def test_lost_assignment_answer_is_flagged_by_the_heartbeat_generation() -> None:
    ctx, a, b = _a_owns_all_then_b_joins()
    ctx.assignment(a)  # answer lost: the client still believes generation 1
    assert ctx.heartbeat(a, generation=1).assignment_changed is True
    assert ctx.heartbeat(a, generation=2).assignment_changed is False


# ------------------------------------------------------------------------------------- commits


def _stable_pair() -> tuple[Ctx, str, str]:
    ctx = Ctx()
    a, b = ctx.join("a"), ctx.join("b")
    ctx.settle()
    return ctx, a, b


def test_owner_commits_with_current_generation() -> None:
    ctx, a, b = _stable_pair()
    ctx.commit(a, [0, 1, 4])
    ctx.commit(b, [9])
    ctx.commit(a, [])  # nothing to check


def test_non_owner_commit_is_refused_with_actionable_message() -> None:
    ctx, a, b = _stable_pair()
    with pytest.raises(NotOwnerError) as info:
        ctx.commit(a, [4, 5])
    error = info.value
    assert error.code == "FAILED_PRECONDITION"
    assert str(error).startswith("stale generation / not owner: fetch your assignment")
    assert error.reasons == {5: "not owned by this member"}


def test_refused_commit_changes_nothing() -> None:
    ctx, a, b = _stable_pair()
    ctx.sleep(1_000)
    before = (ctx.group.members[a].last_heartbeat_ms, ctx.group.members[a].last_poll_ms)
    with pytest.raises(NotOwnerError):
        ctx.commit(a, [9])
    assert (ctx.group.members[a].last_heartbeat_ms, ctx.group.members[a].last_poll_ms) == before


def test_commit_naming_a_generation_before_reacquisition_is_refused() -> None:
    # a owns 5 in gen 1, hands it to b in gen 2, gets it back in gen 3 after b leaves: a
    # delayed gen-1 commit from a must not overwrite what b committed in between.
    ctx = Ctx()
    a = ctx.join("a")
    ctx.settle()
    b = ctx.join("b")
    ctx.settle()
    ctx.commit(b, [5])
    ctx.leave(b)
    ctx.settle()
    assert ctx.group.generation == 3 and 5 in ctx.owned(a)
    with pytest.raises(NotOwnerError) as info:
        ctx.commit(a, [5], generation=1)
    assert info.value.reasons == {5: "owned since generation 3, commit names generation 1"}
    ctx.commit(a, [0], generation=1)  # never left a: still fine
    ctx.commit(a, [5], generation=3)


def test_commit_from_the_future_is_refused() -> None:
    ctx, a, _ = _stable_pair()
    with pytest.raises(NotOwnerError, match="newer than the group's"):
        ctx.commit(a, [0], generation=ctx.group.generation + 1)


def test_commit_after_release_is_refused_even_with_the_old_generation() -> None:
    ctx, a, b = _a_owns_all_then_b_joins()
    ctx.assignment(a)
    with pytest.raises(NotOwnerError):
        ctx.commit(a, [7], generation=1)


@pytest.mark.parametrize(("members", "allowed"), [(0, True), (1, False)], ids=["empty", "active"])
def test_operator_reset_only_while_empty(members: int, allowed: bool) -> None:
    ctx = Ctx()
    for i in range(members):
        ctx.join(f"m{i}")
    request = CheckOwnershipRequest("", -1, [0, 1], topic=TOPIC)
    if allowed:
        check_ownership(ctx.group, request, ctx.now)
    else:
        with pytest.raises(ConsumerGroupNotEmptyError) as info:
            check_ownership(ctx.group, request, ctx.now)
        assert info.value.code == "FAILED_PRECONDITION"


def test_commit_for_another_topic_is_invalid() -> None:
    ctx, a, _ = _stable_pair()
    with pytest.raises(InvalidRequestError, match="consumes topic"):
        check_ownership(ctx.group, CheckOwnershipRequest(a, 1, [0], topic="other"), ctx.now)


# ------------------------------------------------------------------------- partition count


def test_partition_count_increase_schedules_a_rebalance_that_assigns_new_partitions() -> None:
    ctx = Ctx()
    a, b = ctx.join("a"), ctx.join("b")
    ctx.settle()
    ctx.apply(ctx.registry.partition_count_changed(TOPIC, 12, ctx.now))
    assert ctx.group.partition_count == 12
    assert ctx.group.state is GroupState.PREPARING_REBALANCE
    assert 10 not in ctx.group.owners and 11 not in ctx.group.owners
    assert ctx.owned(a) == [0, 1, 2, 3, 4]  # nothing revoked before the new generation
    ctx.settle()
    assert (ctx.owned(a), ctx.owned(b)) == ([0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11])


def test_partition_count_increase_via_find_or_create_and_on_an_empty_group() -> None:
    ctx = Ctx()
    request = FindOrCreateGroupRequest(topic=TOPIC, app_id=APP, partition_count=15)
    response = ctx.apply(ctx.registry.find_or_create(request, ctx.now))
    assert (response.created, response.partition_count) == (False, 15)
    assert ctx.group.state is GroupState.EMPTY and ctx.group.next_deadline_ms() is None


def test_partition_count_cannot_shrink() -> None:
    ctx = Ctx()
    with pytest.raises(InvalidRequestError, match="cannot shrink"):
        ctx.registry.partition_count_changed(TOPIC, 9, ctx.now)
    assert ctx.group.partition_count == 10


# ---------------------------------------------------------------- records, replay, subscriptions


def test_restart_replays_groups_and_members_must_rejoin() -> None:
    ctx = Ctx()
    a = ctx.join("a")
    ctx.settle()
    assert [type(r) for r in ctx.records] == [GroupCreated]
    persisted = [record_to_dict(r) for r in ctx.records]  # what SQLite would hold

    restarted = GroupRegistry(ctx.registry.config)
    for row in persisted:
        restarted.replay(record_from_dict(row))
    group = restarted.get(GROUP_ID)
    assert (group.state, group.generation, group.members) == (GroupState.EMPTY, 0, {})
    assert group.subscription == ctx.group.subscription
    with pytest.raises(UnknownGroupMemberError):
        handle_heartbeat(group, HeartbeatRequest(a, 1), 0)
    handle_join(group, JoinGroupRequest("a2"), 0)
    assert group.state is GroupState.PREPARING_REBALANCE


def test_replay_is_idempotent_and_applies_deletes() -> None:
    registry = GroupRegistry()
    created = GroupCreated(
        GROUP_ID, TOPIC, APP, 3, ctx_subscription(SubscriptionMode.NEW, {0: 1, 1: 2, 2: 3})
    )
    registry.replay(created)
    registry.replay(created)
    assert len(registry) == 1
    registry.replay(GroupDeleted(GROUP_ID))
    registry.replay(GroupDeleted(GROUP_ID))
    assert registry.find(GROUP_ID) is None and registry.groups_for_topic(TOPIC) == []


def ctx_subscription(mode: SubscriptionMode, snapshot: dict[int, int]) -> Any:
    from dmq.coordinator.group import Subscription

    return Subscription(mode=mode, snapshot_offsets=snapshot)


@pytest.mark.parametrize(
    "record",
    [
        GroupCreated(GROUP_ID, TOPIC, APP, 2, ctx_subscription(SubscriptionMode.NEW, {0: 7, 1: 0})),
        GroupDeleted(GROUP_ID),
    ],
    ids=["created", "deleted"],
)
def test_record_dict_round_trip(record: Any) -> None:
    assert record_from_dict(record_to_dict(record)) == record


def test_subscription_is_recorded_once_first_wins() -> None:
    registry = GroupRegistry()
    first = FindOrCreateGroupRequest(
        TOPIC, APP, 3, SubscriptionMode.NEW, snapshot_offsets={0: 10, 1: 0, 2: 5}, created_ms=77
    )
    result = registry.find_or_create(first, 0)
    assert result.response.created is True and len(result.records) == 1
    second = FindOrCreateGroupRequest(TOPIC, APP, 3, SubscriptionMode.TIMESTAMP, 123)
    again = registry.find_or_create(second, 0)
    assert again.response.created is False and again.records == ()
    subscription = again.response.subscription
    assert (subscription.mode, subscription.created_ms) == (SubscriptionMode.NEW, 77)


@pytest.mark.parametrize(
    ("mode", "from_ms", "snapshot", "expected"),
    [
        (None, None, None, [START_AT_LOG_START] * 4),
        (SubscriptionMode.ALL, None, None, [START_AT_LOG_START] * 4),
        # partition 3 appears after the group was created: it starts at 0, nothing skipped
        (SubscriptionMode.NEW, None, {0: 10, 1: 0, 2: 5}, [10, 0, 5, 0]),
        (SubscriptionMode.TIMESTAMP, 1_700_000_000_000, None, [START_BY_TIMESTAMP] * 4),
    ],
    ids=["server_default", "all", "new", "timestamp"],
)
def test_start_positions_by_subscription_mode(
    mode: SubscriptionMode | None,
    from_ms: int | None,
    snapshot: dict[int, int] | None,
    expected: list[int],
) -> None:
    registry = GroupRegistry(GroupConfig(member_id_factory=lambda c: c))
    registry.find_or_create(FindOrCreateGroupRequest(TOPIC, APP, 3, mode, from_ms, snapshot), 0)
    registry.partition_count_changed(TOPIC, 4, 0)
    group = registry.get(GROUP_ID)
    handle_join(group, JoinGroupRequest("a"), 0)
    tick(group, 500)
    response = handle_get_assignment(group, GetAssignmentRequest("a"), 500).response
    assert response.start_positions == tuple(enumerate(expected))


@pytest.mark.parametrize(
    "request_",
    [
        FindOrCreateGroupRequest(TOPIC, APP, 3, SubscriptionMode.TIMESTAMP),
        FindOrCreateGroupRequest(TOPIC, APP, 3, SubscriptionMode.NEW, snapshot_offsets={0: 1}),
        FindOrCreateGroupRequest(TOPIC, "bad app", 3),
        FindOrCreateGroupRequest("", APP, 3),
        FindOrCreateGroupRequest(TOPIC, APP, -1),
    ],
    ids=["timestamp_without_time", "new_without_full_snapshot", "bad_app_id", "no_topic", "neg"],
)
def test_find_or_create_rejects_bad_requests(request_: FindOrCreateGroupRequest) -> None:
    registry = GroupRegistry()
    with pytest.raises(InvalidRequestError):
        registry.find_or_create(request_, 0)
    assert len(registry) == 0


def test_group_id_collision_between_topic_and_app_underscores() -> None:
    registry = GroupRegistry()
    registry.find_or_create(FindOrCreateGroupRequest("a_b", "c", 1), 0)
    with pytest.raises(GroupIdCollisionError, match="choose another app_id"):
        registry.find_or_create(FindOrCreateGroupRequest("a", "b_c", 1), 0)


def test_delete_only_an_empty_group() -> None:
    ctx = Ctx()
    a = ctx.join("a")
    with pytest.raises(ConsumerGroupNotEmptyError, match="delete it"):
        ctx.registry.delete_group(GROUP_ID, ctx.now)
    ctx.leave(a)
    result = ctx.registry.delete_group(GROUP_ID, ctx.now)
    assert result.records == (GroupDeleted(GROUP_ID),)
    with pytest.raises(ConsumerGroupNotFoundError) as info:
        ctx.registry.get(GROUP_ID)
    assert info.value.code == "NOT_FOUND"


def test_topic_deleted_removes_its_groups() -> None:
    ctx = Ctx()
    ctx.join("a")
    ctx.registry.find_or_create(FindOrCreateGroupRequest("other", APP, 1), 0)
    result = ctx.registry.topic_deleted(TOPIC, ctx.now)
    assert result.response == (GROUP_ID,) and result.records == (GroupDeleted(GROUP_ID),)
    assert [g.topic for g in ctx.registry.groups()] == ["other"]


def test_registry_tick_fires_every_due_group() -> None:
    registry = GroupRegistry(GroupConfig(member_id_factory=lambda c: c))
    for app in ("x", "y"):
        registry.find_or_create(FindOrCreateGroupRequest(TOPIC, app, 2), 0)
        handle_join(registry.get(f"G_{TOPIC}_{app}"), JoinGroupRequest("a"), 0)
    assert registry.next_deadline_ms() == 500
    assert registry.tick(499).events == ()
    result = registry.tick(500)
    assert sorted(e.group_id for e in result.events if isinstance(e, GenerationStarted)) == [
        "G_orders_x",
        "G_orders_y",
    ]
    assert result.response.next_deadline_ms == 10_000  # the members' session deadlines


# -------------------------------------------------------------------------- states, timer, repr


LEGAL = {
    (GroupState.EMPTY, GroupState.PREPARING_REBALANCE),
    (GroupState.PREPARING_REBALANCE, GroupState.REBALANCING),
    (GroupState.PREPARING_REBALANCE, GroupState.EMPTY),
    (GroupState.REBALANCING, GroupState.STABLE),
    (GroupState.REBALANCING, GroupState.PREPARING_REBALANCE),
    (GroupState.REBALANCING, GroupState.EMPTY),
    (GroupState.STABLE, GroupState.PREPARING_REBALANCE),
    (GroupState.STABLE, GroupState.EMPTY),
}


@pytest.mark.parametrize(
    ("current", "target"),
    list(itertools.product(GroupState, GroupState)),
    ids=lambda s: s.name,
)
def test_transition_table(current: GroupState, target: GroupState) -> None:
    if (current, target) in LEGAL:
        assert transition_to(current, target) is target
    else:
        with pytest.raises(IllegalStateTransitionError, match="illegal group state transition"):
            transition_to(current, target)


def test_transition_table_is_the_single_source_of_truth() -> None:
    table = {(prev, s) for s, prevs in VALID_PREVIOUS_STATES.items() for prev in prevs}
    assert table == LEGAL


def test_state_values_match_the_wire_enum() -> None:
    assert [(s.name, s.value) for s in GroupState] == [
        ("EMPTY", 0),
        ("PREPARING_REBALANCE", 1),
        ("REBALANCING", 2),
        ("STABLE", 3),
    ]


def test_group_refuses_an_illegal_transition() -> None:
    ctx = Ctx()
    with pytest.raises(IllegalStateTransitionError):
        ctx.group.transition_to(GroupState.STABLE, [])
    assert ctx.group.state is GroupState.EMPTY


def test_timer_orders_replaces_and_cancels() -> None:
    timer: Timer[str] = Timer()
    timer.schedule("b", 20)
    timer.schedule("a", 10)
    timer.schedule("c", 30)
    timer.schedule("a", 25)  # replaces a's deadline
    timer.cancel("c")
    assert timer.next_deadline_ms() == 20
    assert timer.pop_expired(19) is None
    assert [timer.pop_expired(100), timer.pop_expired(100), timer.pop_expired(100)] == [
        "b",
        "a",
        None,
    ]
    assert len(timer) == 0 and timer.next_deadline_ms() is None


def test_timer_heap_stays_bounded_under_rescheduling() -> None:
    timer: Timer[str] = Timer()
    for i in range(10_000):
        timer.schedule("member", i)
    assert len(timer) == 1 and len(timer._heap) <= 2 + 64
    assert timer.pop_expired(10_000) == "member"


def test_reprs_are_informative() -> None:
    ctx = Ctx()
    ctx.join("a")
    assert repr(ctx.group) == (
        "Group(group_id='G_orders_billing', state=PREPARING_REBALANCE, generation=0, "
        "members=1, partitions=10, owned=0, mode=all)"
    )
    assert repr(ctx.registry) == "GroupRegistry(groups=1, topics=1)"
    assert repr(FakeClock(5)) == "FakeClock(now_ms=5)"


def test_describe_lists_owned_and_target_partitions() -> None:
    ctx, a, b = _a_owns_all_then_b_joins()
    ctx.assignment(b)
    description = ctx.group.describe()
    assert (description.state, description.generation) == (GroupState.REBALANCING, 2)
    by_id = {m.member_id: m for m in description.members}
    assert by_id[a].partitions == tuple(range(10)) and by_id[a].target_partitions == (0, 1, 2, 3, 4)
    assert by_id[b].partitions == () and by_id[b].target_partitions == (5, 6, 7, 8, 9)
    assert description.owners[7] == (7, a)


def test_released_and_acquired_events_name_the_generation() -> None:
    ctx, a, b = _a_owns_all_then_b_joins()
    ctx.assignment(a)
    ctx.assignment(b)
    released = ctx.of_type(PartitionsReleased)
    assert [(e.member_id, e.generation, e.partitions) for e in released] == [(a, 2, (5, 6, 7, 8, 9))]
