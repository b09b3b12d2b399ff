"""A seeded simulation of one partition's three replicas under crashes, restarts, stopped
brokers, slow followers, stale leaders and elections, driven through replication's pure parts
(dmq.broker.replication) and the controller's rules (dmq.coordinator.controller.election).

After every step: the leader epoch only grows, an acknowledged acks=all record is in the log of
every in-sync replica, no replica's log differs from the leader's below its high watermark, and
a truncation never cuts below the replica's high watermark. At the end, with every broker back,
all logs are identical and hold every acknowledged record once. The seed is printed on failure.
"""

from __future__ import annotations

import dataclasses
import os
import random

import pytest

from dmq.broker.replication import LeaderEpochCache, PartitionReplicas, truncation_offset
from dmq.coordinator.controller.election import PartitionLeadership, on_broker_back, on_broker_failed, restore_preferred

BROKERS = (1, 2, 3)
MIN_INSYNC = 2
LAG_TIME_MAX_MS = 10_000
SESSION_TIMEOUT_MS = 6_000


@dataclasses.dataclass
class Replica:
    id: int
    log: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (epoch, value) per offset
    cache: LeaderEpochCache = dataclasses.field(default_factory=LeaderEpochCache)
    hw: int = 0
    alive: bool = True
    paused: bool = False
    down_since_ms: int = 0
    known_epoch: int = -1  # the controller's epoch this replica last acted on
    leading: PartitionReplicas | None = None
    leading_epoch: int = -1

    @property
    def leo(self) -> int:
        return len(self.log)

    @property
    def acting(self) -> bool:
        return self.alive and not self.paused


class Simulation:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.now_ms = 0
        self.replicas = {b: Replica(b) for b in BROKERS}
        self.live = set(BROKERS)  # as the controller sees them
        self.state = PartitionLeadership(BROKERS, frozenset(BROKERS), 1, 0)
        self.pending: list[tuple[int, int, int, int]] = []  # (leader, epoch, offset, value)
        self.acked: dict[int, int] = {}
        self.next_value = 0
        self.max_epoch_seen = 0
        self.log: list[str] = []
        self.sync(self.replicas[1])

    # -- the replicas' side -------------------------------------------------------------------

    def sync(self, r: Replica) -> None:
        """What a broker does on learning the controller's current leadership."""
        st = self.state
        if r.known_epoch == st.leader_epoch:
            return
        if st.leader == r.id:
            r.leading = PartitionReplicas(
                r.id, st.replicas, st.isr, log_end_offset=r.leo, high_watermark=r.hw,
                epoch_start_offset=r.leo, now_ms=self.now_ms,
            )
            r.leading_epoch = st.leader_epoch
            r.cache.assign(st.leader_epoch, r.leo)
            r.known_epoch = st.leader_epoch
            return
        r.leading = None
        leader = self.replicas[st.leader] if st.leader is not None else None
        if leader is None or not leader.acting or leader.leading_epoch != st.leader_epoch:
            return  # no leader to ask yet: truncate later
        point = truncation_offset(
            r.cache, r.leo, lambda e: leader.cache.end_offset_for(e, leader.leo), high_watermark=r.hw
        )
        assert point >= min(r.hw, r.leo), f"broker {r.id} truncated to {point}, below its high watermark {r.hw}"
        del r.log[point:]
        r.cache.truncate_from_end(point)
        r.known_epoch = st.leader_epoch

    def alter_isr(self, leader: Replica, isr: set[int]) -> None:
        """The leader asks the controller; only the current epoch's leader is heard."""
        assert leader.leading is not None
        if leader.leading_epoch != self.state.leader_epoch or self.state.leader != leader.id:
            return
        self.state = dataclasses.replace(self.state, isr=frozenset(isr))
        leader.leading.set_isr(isr)

    # -- steps --------------------------------------------------------------------------------

    def produce(self) -> None:
        # mostly the controller's leader; sometimes a stale one (a client with old metadata)
        candidates = [r for r in self.replicas.values() if r.acting and r.leading is not None]
        if not candidates:
            return
        r = self.rng.choice(candidates)
        assert r.leading is not None
        if not r.leading.enough_replicas(MIN_INSYNC):
            return  # NOT_ENOUGH_REPLICAS, nothing stored
        for _ in range(self.rng.randint(1, 3)):
            value = self.next_value
            self.next_value += 1
            r.log.append((r.leading_epoch, value))
            self.pending.append((r.id, r.leading_epoch, r.leo - 1, value))
        r.leading.on_append(r.leo)

    def fetch(self) -> None:
        st = self.state
        followers = [r for r in self.replicas.values() if r.acting and r.id != st.leader]
        if st.leader is None or not followers:
            return
        leader = self.replicas[st.leader]
        if not leader.acting or leader.leading is None or leader.leading_epoch != st.leader_epoch:
            return
        f = self.rng.choice(followers)
        self.sync(f)
        if f.known_epoch != st.leader_epoch:
            return
        expanded, _ = leader.leading.on_fetch(f.id, f.leo, self.now_ms)
        if expanded is not None:
            self.alter_isr(leader, expanded)
        n = self.rng.randint(0, leader.leo - f.leo)
        for offset in range(f.leo, f.leo + n):
            epoch, value = leader.log[offset]
            f.log.append((epoch, value))
            f.cache.assign(epoch, offset)
        f.hw = min(leader.leading.high_watermark, f.leo)

    def tick(self) -> None:
        self.now_ms += self.rng.choice([100, 500, 1000, 4000])
        for r in self.replicas.values():
            if r.acting:
                self.sync(r)
                if r.leading is not None and r.leading_epoch == self.state.leader_epoch:
                    r.hw = r.leading.high_watermark
                    lagging = r.leading.lagging(self.now_ms, LAG_TIME_MAX_MS)
                    if lagging:
                        self.alter_isr(r, set(self.state.isr) - lagging)
        for r in self.replicas.values():  # the controller's session timeout
            if not r.acting and r.id in self.live and self.now_ms - r.down_since_ms >= SESSION_TIMEOUT_MS:
                self.broker_failed(r.id)

    def broker_failed(self, broker: int) -> None:
        self.live.discard(broker)
        self.state = on_broker_failed(self.state, broker, self.live)

    def broker_back(self, broker: int) -> None:
        self.live.add(broker)
        self.state = on_broker_back(self.state, broker, self.live)

    def crash(self) -> None:
        r = self.rng.choice([r for r in self.replicas.values() if r.alive] or [None])
        if r is None:
            return
        r.alive, r.paused, r.down_since_ms = False, False, self.now_ms
        r.leading, r.leading_epoch = None, -1  # memory is gone; the log and epoch cache are on disk
        r.known_epoch = -1

    def restart(self) -> None:
        r = self.rng.choice([r for r in self.replicas.values() if not r.alive] or [None])
        if r is None:
            return
        if r.id in self.live:  # back before its session expired: the controller fences the old one
            self.broker_failed(r.id)
        r.alive = True
        self.broker_back(r.id)
        self.sync(r)

    def pause(self) -> None:
        r = self.rng.choice([r for r in self.replicas.values() if r.acting] or [None])
        if r is not None:
            r.paused, r.down_since_ms = True, self.now_ms

    def resume(self) -> None:
        r = self.rng.choice([r for r in self.replicas.values() if r.paused] or [None])
        if r is None:
            return
        r.paused = False
        if r.id not in self.live:
            self.broker_back(r.id)
        self.sync(r)

    def preferred(self) -> None:
        p = self.replicas[self.state.preferred]
        if p.acting and p.known_epoch == self.state.leader_epoch:
            self.state = restore_preferred(self.state, self.live)

    def settle_acks(self) -> None:
        still = []
        for leader_id, epoch, offset, value in self.pending:
            r = self.replicas[leader_id]
            if r.leading is None or r.leading_epoch != epoch:
                continue  # that leader is gone: the produce failed, the client retries
            verdict = r.leading.acknowledged(offset + 1, MIN_INSYNC)
            if verdict is None:
                still.append((leader_id, epoch, offset, value))
            elif verdict:
                assert self.acked.setdefault(offset, value) == value, f"offset {offset} acknowledged twice"
        self.pending = still

    # -- invariants ---------------------------------------------------------------------------

    def check(self, *, acked: bool = True) -> None:
        st = self.state
        assert st.leader_epoch >= self.max_epoch_seen, "leader epoch went back"
        self.max_epoch_seen = st.leader_epoch
        for r in self.replicas.values():
            epochs = [e.epoch for e in r.cache.entries]
            assert epochs == sorted(set(epochs)) and all(e <= st.leader_epoch for e in epochs), (r.id, epochs)
        for offset, value in self.acked.items() if acked else ():
            for b in st.isr:
                log = self.replicas[b].log
                assert offset < len(log) and log[offset][1] == value, (
                    f"acknowledged offset {offset} (value {value}) missing on in-sync broker {b}"
                )
        if st.leader is not None:
            leader = self.replicas[st.leader]
            for r in self.replicas.values():
                assert r.log[: r.hw] == leader.log[: r.hw], f"broker {r.id} diverges below its high watermark {r.hw}"

    def step(self, i: int) -> str:
        action = self.rng.choices(
            ["produce", "fetch", "tick", "crash", "restart", "pause", "resume", "preferred"],
            weights=[30, 40, 12, 3, 4, 2, 3, 2],
        )[0]
        getattr(self, action)()
        self.settle_acks()
        self.check(acked=i % 4 == 0)  # the acknowledged-record check is O(records): every 4th step
        return action

    def heal(self) -> None:
        """Every broker back and fetching until all logs agree."""
        for r in self.replicas.values():
            if not r.alive:
                self.crash_free_restart(r)
            if r.paused:
                r.paused = False
                if r.id not in self.live:
                    self.broker_back(r.id)
        for _ in range(2000):
            self.now_ms += 100
            for r in self.replicas.values():
                self.sync(r)
            self.fetch()
            self.settle_acks()
            self.check()
            leader = self.replicas[self.state.leader] if self.state.leader is not None else None
            if leader and all(r.log == leader.log for r in self.replicas.values()):
                return

    def crash_free_restart(self, r: Replica) -> None:
        r.alive = True
        self.broker_back(r.id)


def run(seed: int, steps: int) -> Simulation:
    sim = Simulation(random.Random(seed))
    for i in range(steps):
        try:
            sim.step(i)
        except AssertionError as e:
            raise AssertionError(f"seed={seed} step={i} state={sim.state}: {e}") from None
    return sim


@pytest.mark.parametrize("round_", range(8))
def test_seeded_simulation_keeps_every_acknowledged_record(round_):
    seed = int(os.environ.get("DMQ_SIM_SEED", random.randrange(1 << 30))) + round_
    print(f"replication simulation seed={seed}")
    sim = run(seed, 2500)
    sim.heal()
    leader = sim.replicas[sim.state.leader] if sim.state.leader is not None else None
    assert leader is not None, f"seed={seed}: no leader after every broker came back"
    for r in sim.replicas.values():
        assert r.log == leader.log, f"seed={seed}: broker {r.id} differs from the leader after healing"
    values = [v for _, v in leader.log]
    assert len(values) == len(set(values)), f"seed={seed}: a record stored twice"
    for offset, value in sim.acked.items():
        assert values[offset] == value, f"seed={seed}: acknowledged offset {offset} lost"
    assert sim.acked, f"seed={seed}: nothing was acknowledged (the simulation exercised nothing)"
    assert sim.max_epoch_seen > 0, f"seed={seed}: no election happened"
