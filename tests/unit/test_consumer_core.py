"""The consumer's sans-I/O group core (dmq.client.consumer._core): table-driven scenarios named
after what they check, and a seeded random walk that checks the core's invariants after every
step (DMQ_SIM_SEED=<seed> replays a failure).

No server, no thread, no clock: answers are protobuf messages or DMQErrors handed to the core,
time is the `now` argument."""

from __future__ import annotations

import ast
import inspect
import logging
import random
from dataclasses import dataclass, field

import pytest
from _seeded import simulate

from dmq.client._calls import RetryPolicy
from dmq.client._log import get_logger
from dmq.client.consumer import ConsumerConfig, OffsetAndMetadata, TopicPartition, _core
from dmq.client.consumer._core import ASSIGNMENT, FIND, HANDOVER, JOIN, ConsumerCore, GroupCall, Outcome
from dmq.client.consumer._group import Membership
from dmq.client.consumer._subscription import SubscriptionState
from dmq.client.errors import (
    CommitFailedError,
    CoordinatorUnavailableError,
    DMQError,
    GroupNotFoundError,
    TopicNotFoundError,
    UnknownMemberError,
)
from dmq.proto import dmq_pb2 as pb

T = "orders"
BACKOFF_MS = 100


def tp(p: int) -> TopicPartition:
    return TopicPartition(T, p)


@dataclass
class Ctx:
    """A core over a SubscriptionState, with the shell's bookkeeping of handed-out positions."""

    config: ConsumerConfig
    subs: SubscriptionState = field(default_factory=SubscriptionState)
    now: float = 1000.0
    core: ConsumerCore = field(init=False)

    def __post_init__(self) -> None:
        self.core = ConsumerCore(self.config, self.subs, self.to_commit, get_logger("dmq.test.core"), now=self.now,
                                 policy=RetryPolicy(BACKOFF_MS, 1_000, jitter=0.0))

    def to_commit(self, topic: str | None, only_changed: bool) -> dict[TopicPartition, OffsetAndMetadata]:
        return {t: OffsetAndMetadata(o) for t, o in self.subs.consumed(only_changed).items()
                if topic is None or t.topic == topic}

    def membership(self, topic: str = T) -> Membership:
        return self.core.add(Membership.pending(topic, f"G_{topic}_app", "127.0.0.1:1"))

    def call(self, topic: str = T) -> GroupCall:
        call = self.core.next_call(topic, self.now)
        assert call is not None, self.core
        return call

    def answer(self, call: GroupCall, response: object = None, error: DMQError | None = None,
               failed: dict[TopicPartition, str] | None = None) -> Outcome:
        return self.core.answered(call, self.now, response, error=error, coordinator="127.0.0.1:1", failed=failed)

    def joined(self, topic: str = T, member: str = "m-1") -> Membership:
        """Find and join: the membership, its assignment now stale."""
        m = self.membership(topic)
        self.answer(self.call(topic), pb.FindOrCreateGroupResponse(group_id=f"G_{topic}_app"))
        self.answer(self.call(topic), pb.JoinGroupResponse(member_id=member, generation=1))
        return m

    def assign(self, generation: int, *partitions: int, topic: str = T, starts: dict[int, int] | None = None,
               failed: dict[TopicPartition, str] | None = None) -> Outcome:
        """The stale assignment fetched (through a hand-off when positions moved)."""
        call = self.call(topic)
        if call.kind == HANDOVER:
            call = self.answer(call, failed=failed).next  # type: ignore[assignment]
        assert call.kind == ASSIGNMENT
        response = pb.GetAssignmentResponse(generation=generation, partitions=list(partitions), start_positions=[
            pb.StartPosition(partition=p, offset=o) for p, o in (starts or {}).items()])
        return self.answer(call, response)

    def consume(self, p: int, position: int, topic: str = T) -> None:
        self.subs.seek(TopicPartition(topic, p), position)


@pytest.fixture
def ctx() -> Ctx:
    return Ctx(ConsumerConfig(bootstrap_servers="127.0.0.1:1", group_id="app", retry_backoff_ms=BACKOFF_MS,
                              auto_commit_interval_ms=5_000))


def test_the_core_does_no_io_of_its_own() -> None:
    """Sans I/O: no clock, thread, event loop or gRPC is imported by the core itself."""
    imported = set()
    for node in ast.walk(ast.parse(inspect.getsource(_core))):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert imported.isdisjoint({"time", "threading", "asyncio", "grpc", "concurrent", "socket", "selectors"}), imported


# -- one call at a time, in order: find, join, hand-off ----------------------------------------


def test_a_new_membership_finds_joins_then_fetches_its_assignment(ctx: Ctx) -> None:
    m = ctx.membership()
    kinds = []
    for response in (pb.FindOrCreateGroupResponse(group_id="G_orders_app", coordinator_address="10.0.0.1:9"),
                     pb.JoinGroupResponse(member_id="m-1", member_secret="s", generation=1)):
        call = ctx.call()
        kinds.append(call.kind)
        assert ctx.core.next_call(T, ctx.now) is None, "a second call while one is in flight"
        out = ctx.answer(call, response)
        assert out.succeeded
    assert kinds == [FIND, JOIN]
    assert (m.found, m.coordinator, m.member_id, m.member_secret, m.assignment_stale) == (
        True, "10.0.0.1:9", "m-1", "s", True)
    assert ctx.call().kind == ASSIGNMENT  # nothing consumed: no commit before it
    assert out.track, "a join starts the heartbeats"


def test_revoked_partitions_are_dropped_and_called_back_before_the_assigned_ones(ctx: Ctx) -> None:
    ctx.joined()
    ctx.assign(1, 0, 1, 2)
    ctx.core.memberships[T].assignment_stale = True  # the heartbeat saw generation 2
    out = ctx.assign(2, 2, 3, starts={3: 40})
    assert out.callbacks == (("on_partitions_revoked", frozenset({tp(0), tp(1)})),
                             ("on_partitions_assigned", frozenset({tp(3)})))
    assert out.dropped == {tp(0), tp(1)} and out.rebalanced
    assert set(ctx.subs.assigned()) == {tp(2), tp(3)}
    assert ctx.subs.state(tp(3)).start_position == 40
    assert ctx.core.memberships[T].generation == 2


@pytest.mark.parametrize(("before", "after", "callbacks"), [
    ((), (0, 1), (("on_partitions_assigned", {0, 1}),)),
    ((0, 1), (), (("on_partitions_revoked", {0, 1}),)),
    ((0, 1), (0, 1), ()),
    ((0,), (1,), (("on_partitions_revoked", {0}), ("on_partitions_assigned", {1}))),
], ids=["only-assigned", "only-revoked", "unchanged-no-callback", "swap-revoke-first"])
def test_assignment_changes_and_their_callbacks(ctx: Ctx, before: tuple[int, ...], after: tuple[int, ...],
                                                callbacks: tuple[tuple[str, set[int]], ...]) -> None:
    ctx.joined()
    ctx.assign(1, *before)
    ctx.core.memberships[T].assignment_stale = True
    out = ctx.assign(2, *after)
    assert [(name, {t.partition for t in tps}) for name, tps in out.callbacks] == list(callbacks)
    assert out.rebalanced == bool(callbacks)


# -- the hand-off ------------------------------------------------------------------------------


def test_a_hand_off_commits_the_moved_positions_and_holds_the_partitions(ctx: Ctx) -> None:
    ctx.joined()
    ctx.assign(1, 0, 1)
    ctx.consume(0, 7)
    ctx.consume(1, 3)
    ctx.subs.mark_committed({tp(1): 3})  # already committed: not again
    ctx.core.memberships[T].assignment_stale = True
    call = ctx.call()
    assert call.kind == HANDOVER
    assert call.offsets == {tp(0): OffsetAndMetadata(7)}
    assert call.held == {tp(0), tp(1)}
    out = ctx.answer(call, failed={})
    assert out.next is not None and out.next.kind == ASSIGNMENT and out.next.held == call.held
    assert ctx.core.next_call(T, ctx.now) is None, "the GetAssignment is in flight"


def test_a_rebalance_during_the_hand_off_commit_fetches_the_assignment_again(ctx: Ctx) -> None:
    """The heartbeat flags generation 3 while generation 2's hand-off commit is in flight: the
    GetAssignment that follows answers for 2 (or 3); the flag makes another one follow."""
    ctx.joined()
    ctx.assign(1, 0, 1)
    ctx.consume(0, 5)
    ctx.core.memberships[T].assignment_stale = True
    handover = ctx.call()
    ctx.core.memberships[T].assignment_stale = True  # set by the heartbeat meanwhile
    assignment = ctx.answer(handover, failed={}).next
    assert assignment is not None
    ctx.answer(assignment, pb.GetAssignmentResponse(generation=2, partitions=[0]))
    ctx.consume(0, 9)
    again = ctx.call()
    assert again.kind == HANDOVER and again.offsets == {tp(0): OffsetAndMetadata(9)}


def test_a_failed_hand_off_commit_does_not_hold_the_rebalance(ctx: Ctx, caplog: pytest.LogCaptureFixture) -> None:
    ctx.joined()
    ctx.assign(1, 0, 1)
    ctx.consume(0, 5)
    ctx.core.memberships[T].assignment_stale = True
    caplog.set_level(logging.WARNING, logger="dmq.test.core")
    out = ctx.assign(2, 1, failed={tp(0): "broker away"})
    assert out.callbacks == (("on_partitions_revoked", frozenset({tp(0)})),)
    assert "commit before the hand-off failed" in caplog.text and "broker away" in caplog.text


# -- errors ------------------------------------------------------------------------------------


def test_a_fenced_member_loses_its_partitions_and_rejoins(ctx: Ctx) -> None:
    """GetAssignment answers NOT_FOUND (the coordinator expired the member): its partitions are
    lost, not revoked (someone else may own them), commits are refused, and it joins again."""
    m = ctx.joined()
    ctx.assign(1, 0, 1)
    ctx.consume(0, 4)
    m.assignment_stale = True
    call = ctx.call()
    assignment = ctx.answer(call, failed={}).next
    assert assignment is not None
    out = ctx.answer(assignment, error=UnknownMemberError("GetAssignment: member unknown"))
    assert not out.succeeded and out.error is None and m.rejoin_reason
    with pytest.raises(CommitFailedError, match="no longer in group G_orders_app.*max_poll_interval_ms"):
        ctx.core.check_can_commit({tp(0): OffsetAndMetadata(4)})
    assert ctx.core.auto_commit(ctx.now + 60) == {}, "no auto-commit for a member out of its group"
    join = ctx.call()
    assert join.kind == JOIN and join.before is not None and join.before.dropped == {tp(0), tp(1)}
    assert join.before.callbacks == (("on_partitions_lost", frozenset({tp(0), tp(1)})),)
    assert ctx.subs.assigned() == []
    ctx.answer(join, pb.JoinGroupResponse(member_id="m-2", generation=3))
    assert m.rejoin_reason is None and m.member_id == "m-2"
    ctx.core.check_can_commit({tp(0): OffsetAndMetadata(4)})  # a member again


def test_a_refused_commit_makes_the_member_fetch_its_assignment(ctx: Ctx) -> None:
    """A broker refused a commit (stale generation / not owner): ask for the assignment again."""
    m = ctx.joined()
    ctx.assign(1, 0)
    assert ctx.core.next_call(T, ctx.now) is None
    ctx.core.commit_refused({T})
    assert m.assignment_stale and ctx.call().kind == ASSIGNMENT


@pytest.mark.parametrize(("kind", "error", "then"), [
    (FIND, CoordinatorUnavailableError("coordinator away"), "backoff"),
    (JOIN, CoordinatorUnavailableError("coordinator away"), "backoff"),
    (ASSIGNMENT, CoordinatorUnavailableError("coordinator away"), "backoff"),
    (JOIN, GroupNotFoundError("group deleted"), FIND),
    (ASSIGNMENT, UnknownMemberError("member unknown"), JOIN),
    (FIND, TopicNotFoundError("no such topic"), "raise"),
], ids=["find-retriable", "join-retriable", "assignment-retriable", "join-group-gone", "assignment-fenced",
        "find-fatal"])
def test_what_each_group_error_means(ctx: Ctx, kind: str, error: DMQError, then: str) -> None:
    m = ctx.membership()
    if kind != FIND:
        ctx.answer(ctx.call(), pb.FindOrCreateGroupResponse(group_id="G_orders_app"))
    if kind == ASSIGNMENT:
        ctx.answer(ctx.call(), pb.JoinGroupResponse(member_id="m-1"))
    call = ctx.call()
    assert call.kind == kind
    out = ctx.answer(call, error=error)
    if then == "raise":
        assert out.error is error
        return
    assert out.error is None and not out.succeeded
    if then == "backoff":
        assert ctx.core.next_call(T, ctx.now) is None
        assert ctx.core.retry_at(T) == pytest.approx(ctx.now + BACKOFF_MS / 1000)
        ctx.now += BACKOFF_MS / 1000
        assert ctx.call().kind == kind
        if kind == ASSIGNMENT:
            assert m.assignment_stale is False  # cleared again by the retried call
    else:
        assert ctx.call().kind == then


def test_group_call_backoff_doubles_up_to_a_second_and_resets_on_success(ctx: Ctx) -> None:
    ctx.membership()
    pauses = []
    for _ in range(6):
        call = ctx.call()
        ctx.answer(call, error=CoordinatorUnavailableError("away"))
        pauses.append(round(ctx.core.retry_at(T) - ctx.now, 3))
        ctx.now = ctx.core.retry_at(T)
    assert pauses == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    ctx.answer(ctx.call(), pb.FindOrCreateGroupResponse(group_id="G_orders_app"))
    assert ctx.core.retry_at(T) == 0.0


def test_an_answer_after_the_membership_left_changes_nothing(ctx: Ctx) -> None:
    ctx.joined()
    ctx.assign(1, 0)
    ctx.core.memberships[T].assignment_stale = True
    call = ctx.call()
    ctx.core.leave(T)
    out = ctx.answer(call, pb.GetAssignmentResponse(generation=2, partitions=[0, 1]))
    assert out == Outcome() and T not in ctx.core.memberships


def test_an_abandoned_call_is_given_again(ctx: Ctx) -> None:
    ctx.membership()
    call = ctx.call()
    assert ctx.core.next_call(T, ctx.now) is None
    ctx.core.abandon(call)
    assert ctx.call().kind == FIND


# -- commits: auto-commit timing, leaving --------------------------------------------------------


def test_auto_commit_is_due_every_interval_and_covers_moved_positions_of_members(ctx: Ctx) -> None:
    ctx.joined()
    ctx.assign(1, 0, 1)
    ctx.consume(0, 3)
    assert ctx.core.auto_commit(ctx.now + 4.999) == {}, "not due before auto_commit_interval_ms"
    assert ctx.core.auto_commit(ctx.now + 5) == {tp(0): OffsetAndMetadata(3)}
    ctx.consume(1, 8)
    assert ctx.core.auto_commit(ctx.now + 9) == {}, "the next one counts from the last"
    assert ctx.core.auto_commit(ctx.now + 10) == {tp(0): OffsetAndMetadata(3), tp(1): OffsetAndMetadata(8)}


def test_auto_commit_off_never_commits() -> None:
    ctx = Ctx(ConsumerConfig(bootstrap_servers="127.0.0.1:1", group_id="app", enable_auto_commit=False))
    ctx.joined()
    ctx.assign(1, 0)
    ctx.consume(0, 3)
    assert ctx.core.auto_commit(ctx.now + 3600) == {}
    assert ctx.core.leave(T).offsets == {}


@pytest.mark.parametrize("rejoining", [False, True], ids=["member", "lost-its-group"])
def test_leaving_commits_only_as_a_member_and_revokes_what_it_owned(ctx: Ctx, rejoining: bool) -> None:
    m = ctx.joined()
    ctx.assign(1, 0, 1)
    ctx.consume(1, 6)
    if rejoining:
        m.rejoin_reason = "session expired"
    leaving = ctx.core.leave(T)
    assert leaving.offsets == ({} if rejoining else {tp(1): OffsetAndMetadata(6)})
    assert leaving.owned == {tp(0), tp(1)}
    assert ctx.core.release(leaving) == (("on_partitions_revoked", frozenset({tp(0), tp(1)})),)
    assert ctx.subs.assigned() == [] and ctx.core.next_call(T, ctx.now) is None


def test_repr_names_the_memberships_and_calls_in_flight(ctx: Ctx) -> None:
    ctx.membership()
    ctx.call()
    assert repr(ctx.core) == "<ConsumerCore memberships=['orders'] in_flight={'orders': 'find'} backing_off=[]>"


# -- a seeded random walk ----------------------------------------------------------------------


class Walk:
    """Random heartbeat flags, answers, errors, consumption and time over two memberships; after
    every step: at most one call in flight per membership, the SubscriptionState holds exactly
    the partitions of the last assignment applied (none while re-joining), revocations come
    before assignments, lost partitions only when re-joining, and a hand-off commits only
    positions of partitions it holds."""

    TOPICS = ("a", "b")

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.ctx = Ctx(ConsumerConfig(bootstrap_servers="127.0.0.1:1", group_id="app", retry_backoff_ms=BACKOFF_MS))
        self.calls: dict[str, GroupCall] = {}
        self.generation = 0
        for topic in self.TOPICS:
            self.ctx.membership(topic)

    @property
    def now_ms(self) -> int:
        return int(self.ctx.now * 1000)

    def step(self) -> None:
        ctx, rng = self.ctx, self.rng
        topic = rng.choice(self.TOPICS)
        m = ctx.core.memberships[topic]
        action = rng.choice(["tick", "call", "answer", "answer", "flag", "fence", "consume"])
        if action == "tick":
            ctx.now += rng.choice([0.01, 0.1, 0.5])
        elif action == "call":
            call = ctx.core.next_call(topic, ctx.now)
            assert call is None or topic not in self.calls, f"a second call while {self.calls.get(topic)} is in flight"
            if call is not None:
                lost = call.before.dropped if call.before is not None else frozenset()
                assert call.kind == JOIN or not lost, "partitions lost other than by re-joining"
                assert lost.isdisjoint(ctx.subs.assigned()), "lost but still assigned"
                assert m.rejoin_reason is not None or not m.joined or not lost, "lost by a member in its group"
                assert set(call.offsets) <= call.held, "a hand-off commits a partition it does not hold"
                self.calls[topic] = call
        elif action == "answer" and topic in self.calls:
            self.answer(topic, self.calls.pop(topic))
        elif action == "flag" and m.joined:
            m.assignment_stale = True
        elif action == "fence" and m.joined:
            m.rejoin_reason = "session expired"
        elif action == "consume":
            owned = ctx.subs.assigned(topic)
            if owned:
                ctx.subs.seek(rng.choice(owned), rng.randrange(1000))
        for t in self.TOPICS:
            assert ctx.core.in_flight(t) is self.calls.get(t), (t, ctx.core)

    def answer(self, topic: str, call: GroupCall) -> None:
        ctx, rng, m = self.ctx, self.rng, self.ctx.core.memberships[topic]
        if rng.random() < 0.2 and call.kind != HANDOVER:
            error = rng.choice([CoordinatorUnavailableError("away"), UnknownMemberError("gone")])
            out = ctx.answer(call, error=error)
            assert out.error is None and not out.callbacks
            return
        if call.kind == FIND:
            out = ctx.answer(call, pb.FindOrCreateGroupResponse(group_id=f"G_{topic}_app"))
        elif call.kind == JOIN:
            out = ctx.answer(call, pb.JoinGroupResponse(member_id=f"m-{rng.randrange(1 << 20)}"))
            assert m.joined and ctx.subs.assigned(topic) == []
        elif call.kind == HANDOVER:
            out = ctx.answer(call, failed={})
            assert out.next is not None
            self.calls[topic] = out.next
            return
        else:
            self.generation += 1
            partitions = sorted(rng.sample(range(6), rng.randrange(7)))
            out = ctx.answer(call, pb.GetAssignmentResponse(generation=self.generation, partitions=partitions))
            if out.succeeded:
                assert sorted(t.partition for t in ctx.subs.assigned(topic)) == partitions
            names = [name for name, _ in out.callbacks]
            assert names in ([], ["on_partitions_revoked"], ["on_partitions_assigned"],
                             ["on_partitions_revoked", "on_partitions_assigned"]), names
        assert out.error is None

    def drain(self) -> None:
        """A last generation gives each group's partition 0 to this member: answer every call
        from now on; each membership ends joined, owning partition 0, with no call pending."""
        ctx = self.ctx
        self.generation += 1
        for m in ctx.core.memberships.values():
            m.assignment_stale = True  # the heartbeat saw the last generation
        for _ in range(100):
            for topic in self.TOPICS:
                call = self.calls.pop(topic, None) or ctx.core.next_call(topic, ctx.now)
                if call is None:
                    continue
                if call.kind == FIND:
                    ctx.answer(call, pb.FindOrCreateGroupResponse(group_id=f"G_{topic}_app"))
                elif call.kind == JOIN:
                    ctx.answer(call, pb.JoinGroupResponse(member_id="m-final"))
                elif call.kind == HANDOVER:
                    self.calls[topic] = ctx.answer(call, failed={}).next  # type: ignore[assignment]
                else:
                    ctx.answer(call, pb.GetAssignmentResponse(generation=self.generation, partitions=[0]))
            ctx.now += 1.0
        for topic in self.TOPICS:
            m = ctx.core.memberships[topic]
            assert m.joined and m.rejoin_reason is None and not m.assignment_stale, m
            assert ctx.core.in_flight(topic) is None and ctx.subs.assigned(topic) == [TopicPartition(topic, 0)]


@pytest.mark.parametrize("round_", range(4))
def test_random_walk_keeps_the_core_invariants(round_: int) -> None:
    simulate("consumer core walk", round_, Walk, steps=2_000)
