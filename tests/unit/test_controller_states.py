"""The controller's pure parts: replica placement (dmq.coordinator.controller.placement) and the
state transitions of a partition (dmq.coordinator.controller.partition_states), as tables."""

from __future__ import annotations

import pytest

from dmq.coordinator.controller import partition_states as ps
from dmq.coordinator.controller.partition_states import StateRefusedError
from dmq.coordinator.controller.placement import place_partitions
from dmq.coordinator.store import NO_LEADER, PartitionRecord
from dmq.proto.server.domain_errors import ErrorCode
from dmq.proto.topic_settings import TopicSettings, ValidationError, replication_defaults

S = PartitionRecord


# -- placement -------------------------------------------------------------------------------------


def test_placement_keeps_the_unreplicated_leaders_and_spreads_followers() -> None:
    plan = place_partitions("events", range(9), 3, [2, 0, 1])
    leaders = [plan[p].leader for p in range(9)]
    start = leaders[0]
    assert leaders == [(start + p) % 3 for p in range(9)]  # round robin from crc32(topic) as before
    for state in plan.values():
        assert len(set(state.replicas)) == 3 and state.isr == state.replicas and state.leader == state.replicas[0]
        assert (state.leader_epoch, state.partition_epoch) == (0, 0)
    # every broker leads and follows equally often
    for b in (0, 1, 2):
        assert sum(s.leader == b for s in plan.values()) == 3
        assert sum(b in s.replicas[1:] for s in plan.values()) == 6


def test_added_partitions_continue_the_sequence() -> None:
    whole = place_partitions("t", range(6), 2, [1, 2, 3])
    assert place_partitions("t", range(4, 6), 2, [1, 2, 3]) == {4: whole[4], 5: whole[5]}


@pytest.mark.parametrize("rf", [1, 2, 3])
def test_racks_are_spread_first(rf: int) -> None:
    racks = {1: "a", 2: "a", 3: "b", 4: "b", 5: "c", 6: "c"}
    for state in place_partitions("t", range(12), rf, list(racks), racks).values():
        assert len({racks[b] for b in state.replicas}) == rf, state


def test_rf_above_live_brokers_is_refused() -> None:
    with pytest.raises(ValueError, match="replication_factor 4"):
        place_partitions("t", range(1), 4, [1, 2, 3])


# -- replication settings --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "live", "default", "expected"),
    [
        (TopicSettings(), 1, None, (1, 1, False)),  # the embedded server
        (TopicSettings(), 2, None, (2, 1, False)),
        (TopicSettings(), 5, None, (3, 2, False)),  # min(3, live); min_insync 2 with RF >= 3
        (TopicSettings(), 5, 1, (1, 1, False)),  # the coordinator's default
        (TopicSettings(), 2, 3, (3, 2, False)),  # an operator's default as set (refused while 2 are live)
        (TopicSettings(replication_factor=3, min_insync_replicas=3, unclean_leader_election=True), 3, None,
         (3, 3, True)),
        (TopicSettings(kind="event-store"), 5, None, (3, 2, False)),  # replicated as other topics
        (TopicSettings(kind="event-store"), 5, 1, (1, 1, False)),
    ],
)
def test_replication_defaults(given, live, default, expected) -> None:  # noqa: ANN001
    s = replication_defaults(given, live, default)
    assert (s.replication_factor, s.min_insync_replicas, s.unclean_leader_election) == expected


def test_replication_settings_are_checked() -> None:
    with pytest.raises(ValidationError, match="min_insync_replicas: must be at most replication_factor \\(2\\), got 3"):
        TopicSettings(replication_factor=2, min_insync_replicas=3).validate()
    with pytest.raises(ValidationError, match="replication_factor: must be between 1 and 16, got 0"):
        TopicSettings(replication_factor=0).validate()
    with pytest.raises(ValidationError, match="3 replicas need 3 live brokers, there are 2"):
        TopicSettings(replication_factor=3).check_replication(2)
    TopicSettings(kind="event-store", replication_factor=3).validate()
    TopicSettings(kind="event-store", replication_factor=1).validate()


# -- transitions -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("before", "failed", "live", "unclean", "after"),
    [
        # the leader dies: the next in-sync replica leads at a new epoch
        (S((1, 2, 3), (1, 2, 3), 1, 4, 7), 1, [2, 3], False, S((1, 2, 3), (2, 3), 2, 5, 8)),
        # a follower dies: it leaves the ISR, same leader epoch
        (S((1, 2, 3), (1, 2, 3), 1, 4, 7), 3, [1, 2], False, S((1, 2, 3), (1, 2), 1, 4, 8)),
        # a follower out of sync dies: nothing changes
        (S((1, 2, 3), (1, 2), 1, 4, 7), 3, [1, 2], False, S((1, 2, 3), (1, 2), 1, 4, 7)),
        # the last in-sync replica dies: offline, it stays in the ISR
        (S((1, 2, 3), (1,), 1, 4, 7), 1, [2, 3], False, S((1, 2, 3), (1,), NO_LEADER, 5, 8)),
        # ... unless unclean election is allowed
        (S((1, 2, 3), (1,), 1, 4, 7), 1, [2, 3], True, S((1, 2, 3), (2,), 2, 5, 8)),
        # an unreplicated partition keeps its broker (as before replication)
        (S((1,), (1,), 1, 0, 0), 1, [2], False, S((1,), (1,), 1, 0, 0)),
    ],
)
def test_broker_failed(before, failed, live, unclean, after) -> None:  # noqa: ANN001
    assert ps.broker_failed(before, failed, live, unclean=unclean) == after


def test_offline_partition_gets_its_in_sync_replica_back_and_preferred_returns() -> None:
    offline = S((1, 2, 3), (1,), NO_LEADER, 5, 8)
    assert ps.broker_back(offline, 2, [2, 3]) is offline  # 2 is not in sync
    back = ps.broker_back(offline, 1, [1, 2, 3])
    assert back == S((1, 2, 3), (1,), 1, 6, 9)
    moved = S((1, 2, 3), (1, 2, 3), 2, 6, 9)
    assert ps.preferred_leader(moved, [1, 2, 3]) == S((1, 2, 3), (1, 2, 3), 1, 7, 10)
    assert ps.preferred_leader(moved, [2, 3]) is moved  # the preferred replica is down
    not_in_sync = S((1, 2, 3), (2, 3), 2, 6, 9)
    assert ps.preferred_leader(not_in_sync, [1, 2, 3]) is not_in_sync


CURRENT = S((1, 2, 3), (1, 2), 1, 4, 7)


@pytest.mark.parametrize(
    ("request_", "code", "fragment"),
    [
        (dict(broker_id=2, leader_epoch=4, partition_epoch=7, isr=[1, 2]), "FAILED_PRECONDITION", "not the leader"),
        (dict(broker_id=1, leader_epoch=3, partition_epoch=7, isr=[1, 2]), "FAILED_PRECONDITION", "stale epochs"),
        (dict(broker_id=1, leader_epoch=4, partition_epoch=6, isr=[1, 2]), "FAILED_PRECONDITION", "partition_epoch 7"),
        (dict(broker_id=1, leader_epoch=4, partition_epoch=7, isr=[2, 3]), "INVALID_ARGUMENT", "must include the leader 1"),
        (dict(broker_id=1, leader_epoch=4, partition_epoch=7, isr=[1, 4]), "INVALID_ARGUMENT", "brokers [4] are not replicas"),
        (dict(broker_id=1, leader_epoch=4, partition_epoch=7, isr=[1, 1]), "INVALID_ARGUMENT", "twice"),
        (dict(broker_id=1, leader_epoch=4, partition_epoch=7, isr=[1, 2, 3]), "FAILED_PRECONDITION", "brokers [3] are not alive"),
    ],
)
def test_alter_isr_refusals(request_, code, fragment) -> None:  # noqa: ANN001
    with pytest.raises(StateRefusedError, match=fragment.replace("[", r"\[").replace("]", r"\]")) as info:
        ps.alter_isr(CURRENT, live=[1, 2], where="t partition 0", **request_)
    assert info.value.code == ErrorCode[code]


def test_alter_isr_accepted_in_replica_order_and_idempotent() -> None:
    grown = ps.alter_isr(CURRENT, broker_id=1, leader_epoch=4, partition_epoch=7, isr=[3, 1, 2], live=[1, 2, 3], where="p")
    assert grown == S((1, 2, 3), (1, 2, 3), 1, 4, 8)
    shrunk = ps.alter_isr(grown, broker_id=1, leader_epoch=4, partition_epoch=8, isr=[1], live=[1], where="p")
    assert shrunk == S((1, 2, 3), (1,), 1, 4, 9)  # a member leaving needs not be alive
    assert ps.alter_isr(shrunk, broker_id=1, leader_epoch=4, partition_epoch=9, isr=[1], live=[1], where="p") is shrunk


@pytest.mark.parametrize(
    ("target", "fragment"),
    [([], "at least one"), ([1, 1], "named twice"), ([1, 9], "brokers [9] are not live"),
     (list(range(17)), "at most 16 replicas")],
)
def test_reassignment_targets_are_checked(target, fragment) -> None:  # noqa: ANN001
    with pytest.raises(StateRefusedError, match=fragment.replace("[", r"\[").replace("]", r"\]")) as info:
        ps.check_reassignment(target, [1, 2, 3])
    assert info.value.code == ErrorCode.INVALID_ARGUMENT


def test_reassignment_adds_first_and_drops_once_in_sync() -> None:
    start = S((1, 2), (1, 2), 1, 2, 5)
    adding = ps.reassignment_started(start, [3, 2])
    assert adding == S((3, 2, 1), (1, 2), 1, 2, 6)  # target first, the leaving replica last
    assert not ps.reassignment_ready(adding, [3, 2])
    synced = ps.alter_isr(adding, broker_id=1, leader_epoch=2, partition_epoch=6, isr=[1, 2, 3], live=[1, 2, 3], where="p")
    assert synced.isr == (3, 2, 1) and ps.reassignment_ready(synced, [3, 2])
    done = ps.reassignment_finished(synced, [3, 2], [1, 2, 3])
    assert done == S((3, 2), (3, 2), 3, 3, 8)  # the leaving leader handed over at a new epoch
    assert ps.reassignment_started(done, [3, 2]) is done  # nothing to add
    kept = ps.reassignment_finished(S((2, 3, 1), (2, 3, 1), 2, 3, 8), [2, 3], [1, 2, 3])
    assert kept == S((2, 3), (2, 3), 2, 3, 9)  # the leader stays: same leader epoch


@pytest.mark.parametrize(
    ("state", "target", "live", "expected"),
    [
        # a new order, all in sync: the first listed leads at the next leader epoch
        (S((1, 2, 0), (0, 1, 2), 0, 3, 6), [1, 2, 0], [0, 1, 2], S((1, 2, 0), (1, 2, 0), 1, 4, 7)),
        # the preferred replica is down: the leader stays (no needless move), the order is kept
        (S((1, 2, 0), (0, 1, 2), 0, 3, 6), [1, 2, 0], [0, 2], S((1, 2, 0), (1, 2, 0), 0, 3, 7)),
        # the preferred replica is down and the leader leaves: the next live in-sync target replica
        (S((1, 2, 0), (0, 1, 2), 0, 3, 6), [1, 2], [0, 2], S((1, 2), (1, 2), 2, 4, 7)),
        # the preferred replica already leads: nothing moves but the replica list
        (S((1, 2, 0), (0, 1, 2), 1, 3, 6), [1, 2], [0, 1, 2], S((1, 2), (1, 2), 1, 3, 7)),
        # nothing in sync is alive and the leader leaves: offline
        (S((1, 2, 0), (0, 1, 2), 0, 3, 6), [1, 2], [0], S((1, 2), (1, 2), NO_LEADER, 4, 7)),
    ],
)
def test_reassignment_finish_elects_the_preferred_replica(state, target, live, expected) -> None:  # noqa: ANN001
    assert ps.reassignment_finished(state, target, live) == expected
    assert ps.reassignment_finished(expected, target, live) is expected  # done: nothing more to change
