"""A group's membership survives a coordinator restart (dmq.coordinator.group.durable) and a
pause of the coordinator (handle_coordinator_pause), driven through the pure handlers; and the
PauseWatch that notices the pause (issue 28)."""

from __future__ import annotations

import json

import pytest
from test_group_state import APP, GROUP_ID, TOPIC, Ctx

from dmq.coordinator.group import (
    FindOrCreateGroupRequest,
    GroupRegistry,
    GroupState,
    NotOwnerError,
    handle_coordinator_pause,
)
from dmq.coordinator.group.durable import restore, snapshot
from dmq.coordinator.group.group import POLL_TIMER, REBALANCE_TIMER, SESSION_TIMER
from dmq.coordinator.pause_watch import PauseWatch
from tests.clocks import ManualClockMs


def restarted(ctx: Ctx, now_ms: int) -> Ctx:
    """A second Ctx whose group was replayed and restored from ctx's snapshot (through JSON, as
    stored), at now_ms on its own clock."""
    data = json.loads(json.dumps(snapshot(ctx.group)))
    again = Ctx(partitions=ctx.group.partition_count)
    again.clock.advance_to(now_ms)
    restore(again.group, data, now_ms)
    return again


def test_a_restored_group_keeps_generation_members_and_fencing() -> None:
    ctx = Ctx(partitions=4)
    a, b = ctx.join("a"), ctx.join("b")
    ctx.settle()
    generation = ctx.group.generation
    ctx.commit(a, [0, 1])
    again = restarted(ctx, now_ms=50_000)
    group = again.group
    assert (group.state, group.generation) == (GroupState.STABLE, generation)
    assert sorted(group.members) == [a, b]
    assert again.owned(a) == ctx.owned(a) and again.owned(b) == ctx.owned(b)
    assert group.target == ctx.group.target and group.target_owner == ctx.group.target_owner
    assert group.owners == ctx.group.owners
    again.commit(a, [0, 1])  # the owner still commits
    with pytest.raises(NotOwnerError):
        again.commit(b, [0])  # a non-owner is still fenced
    with pytest.raises(NotOwnerError):
        again.commit(a, [0], generation=generation + 1)  # a generation from the future too
    # A member heard again keeps its session; one never heard again expires a session later and
    # its partitions go to the other through the next generation, which continues the count.
    again.live_for(1_000, [a])
    assert group.timer.deadline_ms((SESSION_TIMER, a)) == again.now + group.members[a].session_timeout_ms
    again.live_for(group.members[b].session_timeout_ms, [a], step_ms=500)
    assert b not in group.members
    again.settle()
    assert group.generation == generation + 1
    assert again.owned(a) == [0, 1, 2, 3]


def test_restored_members_get_one_session_from_the_restart() -> None:
    ctx = Ctx(partitions=2)
    a = ctx.join("a", session_timeout_ms=3_000)
    ctx.settle()
    again = restarted(ctx, now_ms=1_000_000)
    assert again.group.timer.deadline_ms((SESSION_TIMER, a)) == 1_003_000
    assert again.group.timer.deadline_ms((POLL_TIMER, a)) == 1_000_000 + again.group.members[a].max_poll_interval_ms
    again.sleep(2_999)
    assert a in again.group.members
    again.sleep(1)
    assert a not in again.group.members and again.group.state is GroupState.EMPTY


def test_a_pending_rebalance_is_still_pending_after_a_restore() -> None:
    ctx = Ctx(partitions=2)
    a = ctx.join("a")
    ctx.settle()
    ctx.join("b")
    assert ctx.group.state is GroupState.PREPARING_REBALANCE
    again = restarted(ctx, now_ms=10_000)
    assert again.group.state is GroupState.PREPARING_REBALANCE
    assert REBALANCE_TIMER in again.group.timer
    again.settle()
    assert again.group.generation == ctx.group.generation + 1
    assert again.owned(a) == [0]


def test_an_empty_group_snapshots_to_nothing_and_a_bad_snapshot_changes_nothing() -> None:
    ctx = Ctx()
    assert snapshot(ctx.group) == {}
    registry = GroupRegistry(ctx.registry.config)
    registry.find_or_create(FindOrCreateGroupRequest(topic=TOPIC, app_id=APP, partition_count=2), 0)
    group = registry.get(GROUP_ID)
    with pytest.raises(ValueError, match="version"):
        restore(group, {"v": 99}, 0)
    with pytest.raises((KeyError, TypeError, ValueError)):
        restore(group, {"v": 1, "generation": 3, "state": "STABLE",
                        "members": [{"member_id": "x", "client_id": "", "consumer_id": "", "host": "",
                                     "session_timeout_ms": 1000, "max_poll_interval_ms": 1000,
                                     "acked_generation": 3, "secret": "", "target": [0], "owned": [["zero", 3]]}]})
    assert (group.state, group.generation, group.members, group.owners) == (GroupState.EMPTY, 0, {}, {})


def test_a_coordinator_pause_restarts_the_sessions_that_were_running() -> None:
    ctx = Ctx(partitions=2)
    a = ctx.join("a", session_timeout_ms=1_000)
    ctx.settle()
    generation = ctx.group.generation
    ctx.clock.advance(5_000)  # the coordinator was stopped: no tick, no heartbeat
    handle_coordinator_pause(ctx.group, 5_000, ctx.now)
    ctx.sleep(999)
    assert a in ctx.group.members and ctx.group.generation == generation
    ctx.sleep(1)
    assert a not in ctx.group.members  # a session after the resume, it was not heard: it expires


def test_a_pause_of_at_most_half_a_session_changes_nothing() -> None:
    ctx = Ctx(partitions=2)
    a = ctx.join("a", session_timeout_ms=1_000)
    ctx.settle()
    deadline = ctx.group.timer.deadline_ms((SESSION_TIMER, a))
    ctx.clock.advance(500)
    handle_coordinator_pause(ctx.group, 500, ctx.now)
    assert ctx.group.timer.deadline_ms((SESSION_TIMER, a)) == deadline


def test_a_session_that_had_lapsed_before_the_pause_is_not_revived() -> None:
    ctx = Ctx(partitions=2)
    a = ctx.join("a", session_timeout_ms=1_000)
    ctx.settle()
    ctx.clock.advance(1_500)  # expired at +1000, the ticker had not run yet when the pause began
    ctx.clock.advance(5_000)
    handle_coordinator_pause(ctx.group, 5_000, ctx.now)
    ctx.sleep(0)
    assert a not in ctx.group.members


def test_pause_watch_reports_a_gap_longer_than_its_threshold_once() -> None:
    clock = ManualClockMs(0)
    watch = PauseWatch(500, clock_ms=clock)
    clock.now_ms = 10_000
    assert watch.observe() == 0  # not armed: no owner loop observes
    watch.arm()
    for _ in range(5):
        clock.now_ms += 400
        assert watch.observe() == 0
    clock.now_ms += 20_000
    assert watch.observe() == 20_000
    assert watch.observe() == 0 and watch.pauses == 1
    watch.disarm()
    clock.now_ms += 20_000
    assert watch.observe() == 0
    with pytest.raises(ValueError, match="threshold_ms"):
        PauseWatch(0)
