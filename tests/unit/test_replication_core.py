"""Tables for replication's pure parts: the epoch cache, the truncation point, the leader's
in-sync set and high watermark, and the controller's election and placement rules."""

from __future__ import annotations

import pytest

from dmq.broker.replication import (
    UNDEFINED_EPOCH,
    UNDEFINED_OFFSET,
    EpochEntry,
    LeaderEpochCache,
    PartitionReplicas,
    truncation_offset,
)
from dmq.coordinator.controller.election import (
    PartitionLeadership,
    elect_leader,
    on_broker_back,
    on_broker_failed,
    place_replicas,
    restore_preferred,
)


def cache(*pairs: tuple[int, int]) -> LeaderEpochCache:
    return LeaderEpochCache([EpochEntry(e, s) for e, s in pairs])


# -- epochs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "assign", "expected"),
    [
        ([], (0, 0), [(0, 0)]),
        ([(0, 0)], (0, 5), [(0, 0)]),  # a known epoch keeps its first start
        ([(0, 0)], (2, 10), [(0, 0), (2, 10)]),
        ([(0, 0), (2, 10)], (1, 12), [(0, 0), (2, 10)]),  # an older epoch cannot rewrite history
        ([(0, 0), (2, 10)], (3, 10), [(0, 0), (3, 10)]),  # same start: the newer epoch replaces it
        ([(0, 0), (2, 10), (3, 20)], (4, 15), [(0, 0), (2, 10), (4, 15)]),  # after truncation
    ],
)
def test_assign_keeps_both_columns_strictly_increasing(start, assign, expected):
    c = cache(*start)
    c.assign(*assign)
    assert [(e.epoch, e.start_offset) for e in c.entries] == expected


@pytest.mark.parametrize(
    ("epoch", "expected"),
    [
        (0, (UNDEFINED_EPOCH, UNDEFINED_OFFSET)),  # older than every entry
        (1, (1, 10)),
        (2, (1, 10)),  # unknown epoch between: the largest known below it
        (3, (3, 25)),
        (4, (4, 40)),  # the latest: the log end
        (9, (4, 40)),
    ],
)
def test_end_offset_for_epoch(epoch, expected):
    c = cache((1, 0), (3, 10), (4, 25))
    assert c.end_offset_for(epoch, log_end_offset=40) == expected


def test_truncation_of_the_cache_from_both_ends():
    c = cache((1, 0), (3, 10), (4, 25))
    c.truncate_from_end(25)
    assert c.entries == [EpochEntry(1, 0), EpochEntry(3, 10)]
    c.truncate_from_start(12)
    assert c.entries == [EpochEntry(3, 12)]
    assert c.epoch_for(11) == UNDEFINED_EPOCH and c.epoch_for(30) == 3


# -- truncation point (KIP-101 / KIP-279) -----------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "replica", "replica_end", "leader", "leader_end", "hw", "expected"),
    [
        ("same history, replica behind", [(0, 0)], 5, [(0, 0)], 9, 3, 5),
        ("same history, replica ahead (old leader's unreplicated tail)", [(0, 0)], 9, [(0, 0), (1, 6)], 12, 4, 6),
        # the old leader wrote offsets 6..8 in epoch 1 that nobody copied; epoch 2's leader wrote 6..
        ("diverged after a quick double failover", [(0, 0), (1, 6)], 9, [(0, 0), (2, 6)], 10, 6, 6),
        # the replica missed epoch 1 entirely; the leader's epoch 1 covers 4..7
        ("replica lacks the leader's epoch", [(0, 0), (2, 5)], 8, [(0, 0), (1, 4), (3, 7)], 9, 2, 4),
        ("nothing in common: high watermark", [(5, 0)], 8, [(7, 0)], 9, 3, 3),
        ("empty replica", [], 0, [(0, 0)], 9, 0, 0),
    ],
)
def test_truncation_offset(name, replica, replica_end, leader, leader_end, hw, expected):
    leader_cache = cache(*leader)
    got = truncation_offset(
        cache(*replica), replica_end, lambda e: leader_cache.end_offset_for(e, leader_end), high_watermark=hw
    )
    assert got == expected, name


# -- in-sync set and high watermark ---------------------------------------------------------------


def replicas(now_ms: int = 0, **kw: int) -> PartitionReplicas:
    args = {"log_end_offset": 10, "high_watermark": 10, "epoch_start_offset": 10, **kw}
    return PartitionReplicas(1, (1, 2, 3), (1, 2, 3), now_ms=now_ms, **args)


def test_high_watermark_is_the_smallest_in_sync_log_end_and_never_goes_back():
    r = replicas()
    r.on_append(20)
    assert r.high_watermark == 10
    assert r.on_fetch(2, 20, now_ms=1) == (None, False)  # 3 still at 10
    assert r.on_fetch(3, 15, now_ms=1) == (None, True) and r.high_watermark == 15
    assert r.set_isr({1, 2}) is True and r.high_watermark == 20  # 3 left: the smaller set is all at 20
    assert r.set_isr({1, 2, 3}) is False and r.high_watermark == 20  # never back


def test_acks_wait_for_the_set_and_refuse_below_min_insync():
    r = replicas()
    r.on_append(11)
    assert r.acknowledged(11, min_insync_replicas=2) is None  # not replicated yet
    r.on_fetch(2, 11, now_ms=1)
    r.on_fetch(3, 11, now_ms=1)
    assert r.acknowledged(11, min_insync_replicas=2) is True
    r.set_isr({1})
    r.on_append(12)
    assert r.high_watermark == 12  # an ISR of one: the leader alone
    assert r.acknowledged(12, min_insync_replicas=2) is False  # NOT_ENOUGH_REPLICAS
    assert not r.enough_replicas(2)


def test_a_follower_lags_out_and_rejoins_once_caught_up():
    r = replicas(now_ms=0)
    for t in range(0, 40_000, 1000):  # 2 keeps pace with a steady stream; 3 is stopped
        r.on_append(10 + t // 1000 + 1)
        r.on_fetch(2, 10 + t // 1000, now_ms=t)  # always one behind: caught up as of its last fetch
    assert r.lagging(now_ms=40_000, lag_time_max_ms=30_000) == {3}
    r.set_isr({1, 2})
    assert r.on_fetch(3, 12, now_ms=40_001)[0] is None  # below the high watermark: not yet
    expanded, _ = r.on_fetch(3, r.high_watermark, now_ms=40_002)
    assert expanded == {1, 2, 3}


def test_a_follower_from_an_older_epoch_must_pass_the_epoch_start_to_rejoin():
    # 3 is in sync but not yet fetched in this epoch, which holds the high watermark at 20
    r = PartitionReplicas(1, (1, 2, 3), (1, 3), log_end_offset=30, high_watermark=20, epoch_start_offset=25, now_ms=0)
    assert r.on_fetch(2, 22, now_ms=1) == (None, False)  # reached the watermark, not this epoch's start
    assert r.on_fetch(2, 25, now_ms=2)[0] == {1, 2, 3}


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda r: r.on_fetch(9, 0, now_ms=1), "not a follower"),
        (lambda r: r.on_fetch(2, 11, now_ms=1), "beyond the log end"),
        (lambda r: r.on_append(5), "cannot go back"),
        (lambda r: r.set_isr({1, 7}), "non-replicas"),
    ],
)
def test_impossible_inputs_are_refused(call, message):
    with pytest.raises((KeyError, ValueError), match=message):
        call(replicas())


# -- controller: election and placement -------------------------------------------------------------


@pytest.mark.parametrize(
    ("replicas_", "isr", "live", "unclean", "expected"),
    [
        ((1, 2, 3), {1, 2, 3}, {1, 2, 3}, False, 1),  # the preferred replica
        ((1, 2, 3), {2, 3}, {1, 2, 3}, False, 2),  # 1 is alive but not in sync
        ((1, 2, 3), {3}, {1, 2}, False, None),  # the only in-sync replica is down: offline
        ((1, 2, 3), {3}, {1, 2}, True, 1),  # unless unclean election is allowed
        ((1, 2, 3), set(), set(), True, None),
    ],
)
def test_elect_leader(replicas_, isr, live, unclean, expected):
    assert elect_leader(replicas_, isr, live, unclean=unclean) == expected


def test_failover_bumps_the_epoch_and_keeps_the_last_in_sync_replica():
    s = PartitionLeadership((1, 2, 3), frozenset({1, 2, 3}), 1, 4)
    s = on_broker_failed(s, 1, live={2, 3})
    assert (s.leader, s.isr, s.leader_epoch) == (2, {2, 3}, 5)
    s = on_broker_failed(s, 3, live={2})  # a follower: no new epoch
    assert (s.leader, s.isr, s.leader_epoch) == (2, {2}, 5)
    s = on_broker_failed(s, 2, live=set())  # the last in-sync replica: kept, partition offline
    assert (s.leader, s.isr, s.leader_epoch) == (None, {2}, 6)
    assert on_broker_back(s, 1, live={1}) == s  # 1 is not in sync: still offline
    s = on_broker_back(s, 2, live={1, 2})
    assert (s.leader, s.leader_epoch) == (2, 7)


def test_preferred_leader_returns_only_when_in_sync():
    s = PartitionLeadership((1, 2, 3), frozenset({2, 3}), 2, 5)
    assert restore_preferred(s, live={1, 2, 3}) == s
    s2 = restore_preferred(PartitionLeadership((1, 2, 3), frozenset({1, 2, 3}), 2, 5), live={1, 2, 3})
    assert (s2.leader, s2.leader_epoch) == (1, 6)


def test_placement_spreads_leaders_and_replicas_and_honours_racks():
    plan = place_replicas(6, 3, [1, 2, 3])
    assert [p[0] for p in plan.values()] == [1, 2, 3, 1, 2, 3]
    assert all(len(set(p)) == 3 for p in plan.values())
    racks = {1: "a", 2: "a", 3: "b", 4: "b"}
    for p in place_replicas(8, 2, [1, 2, 3, 4], racks).values():
        assert {racks[b] for b in p} == {"a", "b"}, p
    with pytest.raises(ValueError, match="replication_factor 4 must be 1..3"):
        place_replicas(1, 4, [1, 2, 3])
