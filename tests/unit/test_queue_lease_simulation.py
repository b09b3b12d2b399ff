"""A seeded simulation of queue leases: workers of two groups pop, renew, ack (some late), give up
and crash, while records are appended and a fake clock runs; driven through the broker's lease
table (dmq.broker.queue.leases.LeaseTable) with the calls dmq.broker.queue.manager makes: a pop
skips a (partition, group) that holds a lease (`held`); ack and renew act only on a live lease
(`get`: known, and busy or before its expiry); the expiry timer takes `expired(now)`, marks each
busy while its expiry is handled and then releases it, its records going back to the group.

After every step: at most one live lease per (partition, group); a lease is live exactly while
the model says (granted or renewed, expiry not passed, not finished); an ack or renew after the
expiry is refused and one before it accepted; a group's acknowledged offset only moves forward,
and only by an ack, from where its lease started to where it ended; a pop hands out the records
after the acknowledged offset, so an expired lease's records are handed out again. At the end a
patient worker drains every group. The seed is printed on failure (DMQ_SIM_SEED replays it).
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from _seeded import simulate

from dmq.broker.queue.leases import Lease, LeaseTable

TOPIC = "jobs"
PARTITIONS = 3
GROUPS = ("billing", "audit")
WORKERS = 4
LEASE_MS = (200, 1_000)  # a pop's lease length is drawn from this range
MAX_RECORDS = 5


@dataclasses.dataclass
class Held:
    """What a worker believes of a lease it popped (as a client does)."""

    lease_id: str
    partition: int
    group: str
    start: int
    end: int
    # The model's expiry: the grant's or the last accepted renewal's, on the fake monotonic clock in
    # seconds, reckoned as the table does (so the instant a lease ends is the same float in both).
    expiry: float


class Simulation:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.now_ms = 0
        self.table = LeaseTable()
        self.log_end = dict.fromkeys(range(PARTITIONS), 0)
        self.acked = {(p, g): 0 for p in range(PARTITIONS) for g in GROUPS}
        self.held: dict[int, list[Held]] = {w: [] for w in range(WORKERS)}
        self.expiring: list[Lease] = []  # the timer's expiries under way (busy)
        self.counts = dict.fromkeys(("pop", "ack", "late_ack", "renew", "late_renew", "expired", "refused_grant"), 0)

    @property
    def now(self) -> float:
        return self.now_ms / 1000

    # -- the broker's side (manager.py's calls on the table) --------------------------------------

    def pop(self, worker: int, group: str) -> None:
        lease_ms = self.rng.randint(*LEASE_MS)
        for p in self.rng.sample(range(PARTITIONS), PARTITIONS):
            if self.table.held(TOPIC, p, group) is not None:
                with pytest.raises(ValueError, match="already leased"):
                    self.table.grant(TOPIC, p, group, 0, 1, lease_ms, self.now, self.now_ms)
                self.counts["refused_grant"] += 1
                continue
            start = self.acked[(p, group)]
            if start >= self.log_end[p]:
                continue
            end = min(self.log_end[p], start + self.rng.randint(1, MAX_RECORDS))
            lease = self.table.grant(TOPIC, p, group, start, end, lease_ms, self.now, self.now_ms)
            assert (lease.start_offset, lease.end_offset) == (start, end)
            assert lease.expiry_ms == self.now_ms + lease_ms
            self.held[worker].append(Held(lease.lease_id, p, group, start, end, self.now + lease_ms / 1000))
            self.counts["pop"] += 1
            return

    def _live(self, lease_id: str) -> Lease | None:
        """manager._live: the lease an ack / renew may act on, or None (refused as expired)."""
        lease = self.table.get(lease_id, self.now)
        if lease is None or (lease.busy and lease.expiry <= self.now):
            return None
        return lease

    def ack(self, worker: int, h: Held) -> None:
        lease = self._live(h.lease_id)
        on_time = self.now < h.expiry
        assert (lease is not None) == on_time, (
            f"ack at {self.now} s of a lease expiring at {h.expiry} s was "
            f"{'accepted' if lease is not None else 'refused'}"
        )
        self.held[worker].remove(h)
        if lease is None:
            self.counts["late_ack"] += 1
            return
        assert (lease.start_offset, lease.end_offset) == (h.start, h.end)
        assert self.acked[(h.partition, h.group)] == h.start, "an ack from somewhere other than the acknowledged offset"
        self.table.release(lease)
        self.acked[(h.partition, h.group)] = h.end
        self.counts["ack"] += 1

    def renew(self, worker: int, h: Held) -> None:
        lease = self._live(h.lease_id)
        on_time = self.now < h.expiry
        assert (lease is not None) == on_time, f"renew at {self.now} s of a lease expiring at {h.expiry} s"
        if lease is None:
            self.held[worker].remove(h)
            self.counts["late_renew"] += 1
            return
        self.table.renew(lease, lease.lease_ms, self.now, self.now_ms)
        h.expiry = self.now + lease.lease_ms / 1000
        assert lease.expiry_ms == self.now_ms + lease.lease_ms
        self.counts["renew"] += 1

    def timer(self) -> None:
        """manager._expiry_loop: expired leases are marked busy, then (a step later) released."""
        for lease in self.expiring:
            self.table.release(lease)
        self.expiring = []
        for lease in self.table.expired(self.now):
            assert lease.expiry <= self.now, "the timer expired a lease before its time"
            lease.busy = True
            self.expiring.append(lease)
            self.counts["expired"] += 1

    # -- the simulation -----------------------------------------------------------------------------

    def step(self) -> None:
        roll = self.rng.random()
        worker = self.rng.randrange(WORKERS)
        mine = self.held[worker]
        if roll < 0.15:
            self.log_end[self.rng.randrange(PARTITIONS)] += self.rng.randint(1, 4)
        elif roll < 0.40:
            self.pop(worker, self.rng.choice(GROUPS))
        elif roll < 0.60 and mine:
            self.ack(worker, self.rng.choice(mine))
        elif roll < 0.75 and mine:
            self.renew(worker, self.rng.choice(mine))
        elif roll < 0.78 and mine:
            self.held[worker] = []  # the worker crashed: its leases expire
        elif roll < 0.90:
            # The clock moves; the timer runs on its own schedule (a tick later, or more), so an
            # expired lease may still be in the table when its worker's ack or renew arrives.
            self.now_ms += self.rng.randint(1, 300)
        else:
            self.timer()
        self.check()

    def check(self) -> None:
        leases = self.table.leases()
        keys = [x.key for x in leases]
        assert len(keys) == len(set(keys)), f"two live leases on one (partition, group): {sorted(keys)}"
        for x in leases:
            assert self.table.held(*x.key) is x
            assert x.start_offset == self.acked[(x.partition, x.group)], "a lease not starting at the acknowledged offset"
            assert x.start_offset < x.end_offset <= self.log_end[x.partition]
        believed = {h.lease_id: h for hs in self.held.values() for h in hs}
        for h in believed.values():
            live = self._live(h.lease_id)
            assert (live is not None) == (self.now < h.expiry), (
                f"lease of {h.group} on partition {h.partition} expiring at {h.expiry} s is "
                f"{'live' if live is not None else 'gone'} at {self.now} s"
            )

    def drain(self) -> None:
        """Every worker gone; one worker pops and acks at once until every group has acknowledged
        every record (leases left by the others expire first)."""
        self.held = {w: [] for w in range(WORKERS)}
        for _ in range(10_000):
            if all(self.acked[(p, g)] == self.log_end[p] for p in range(PARTITIONS) for g in GROUPS):
                return
            self.now_ms += 50
            self.timer()
            for group in GROUPS:
                self.pop(0, group)
            for h in list(self.held[0]):
                self.ack(0, h)
            self.check()
        raise AssertionError(f"not drained: acked {self.acked}, log ends {self.log_end}")


@pytest.mark.parametrize("round_", range(6))
def test_seeded_lease_simulation(round_: int) -> None:
    seed, sim = simulate("queue lease simulation", round_, Simulation, 3_000)
    # The run exercised what it claims to check.
    for what in ("pop", "ack", "late_ack", "renew", "expired", "refused_grant"):
        assert sim.counts[what] > 0, f"seed={seed}: no {what} happened in 3000 steps: {sim.counts}"
