"""A seeded simulation of event-store claims: workers of one group claim partitions, renew, ack
(some late), release and crash while events are appended and a fake clock runs; driven through
the broker's claim code (dmq.broker.events.groups.GroupManager, as the event store's writer runs
it) over a real partition log and event index, with `now_ms` from the simulation.

After every step: a claim is handed out only for a partition no live claim holds, the one whose
earliest pending event is oldest, with that partition's pending events in order; nothing is
handed out while a partition with pending events is unclaimed; an ack, renew or release is
accepted exactly while the worker's claim is live (before `claim_timeout_ms` after its last
renewal) and refused after (EventClaimNotHeldError); a partition's acknowledged position only moves
by an accepted ack. At the end one worker drains the group: every event acknowledged. The seed
is printed on failure (DMQ_SIM_SEED replays it).
"""

from __future__ import annotations

import dataclasses
import pathlib
import random
from collections.abc import Iterator

import pytest
from _seeded import simulate

from dmq.broker.events.errors import EventClaimNotHeldError
from dmq.broker.events.groups import GroupManager
from dmq.broker.events.progress import SqliteProgressStore
from dmq.broker.events.store import EventStore, NewEvent
from dmq.broker.log import LogConfig, PartitionLog
from dmq.proto import records
from dmq.proto.event_headers import event_headers

GROUP = "projector"
KEYS = ("a", "b", "c", "d")
WORKERS = 3
TIMEOUT_MS = (200, 1_000)  # a claim's timeout is drawn from this range
MAX_EVENTS = 4
STEPS = 1_500


@dataclasses.dataclass
class Claim:
    """The model's view of a claim (what the worker holds and until when)."""

    worker: int
    key: str  # the attribute value the simulation appends under ("a")
    partition: str  # the group's partition key for it, as the broker names it ("k:a")
    last_position: int
    timeout_ms: int
    expires_ms: int


class Simulation:
    def __init__(self, rng: random.Random, store: EventStore) -> None:
        self.rng = rng
        self.store = store
        assert store._groups is not None
        self.groups: GroupManager = store._groups
        self.groups.register(GROUP)
        self.now_ms = 0
        self.positions: dict[str, list[int]] = {k: [] for k in KEYS}  # every event's position, per key
        self.acked: dict[str, int] = {}  # key -> acknowledged position (absent: nothing acknowledged)
        self.claims: dict[str, Claim] = {}  # key -> the model's claim (live or expired)
        self.counts = dict.fromkeys(("claim", "ack", "late_ack", "renew", "late_renew", "release", "none"), 0)

    # -- helpers ------------------------------------------------------------------------------------

    def append(self, key: str) -> None:
        event = NewEvent("t", (f"k:{key}",), b"{}")
        batch = records.encode([event.payload], headers=[event_headers(event.type, event.tags, event.metadata)])
        index = self.store._index
        assert index is not None
        with index.transaction():
            position = self.store._append_one(index, [event], None, batch)[0]
        self.positions[key].append(position)

    def pending(self, key: str) -> list[int]:
        acked = self.acked.get(key)
        return [p for p in self.positions[key] if acked is None or p > acked]

    def live(self, key: str) -> Claim | None:
        claim = self.claims.get(key)
        return claim if claim is not None and self.now_ms < claim.expires_ms else None

    # -- the workers' calls -------------------------------------------------------------------------

    def claim(self, worker: int) -> None:
        limit = self.rng.randint(1, MAX_EVENTS)
        timeout_ms = self.rng.randint(*TIMEOUT_MS)
        until = self.store.readable_end()
        got = self.groups.claim_next(GROUP, ("k",), ("t",), f"w{worker}", limit=limit, timeout_ms=timeout_ms,
                                     until=until, now_ms=self.now_ms)
        free = {k: self.pending(k) for k in KEYS if self.pending(k) and self.live(k) is None}
        if got is None:
            assert not free, f"nothing handed out while {sorted(free)} have pending events and no live claim"
            self.counts["none"] += 1
            return
        key = got.values["k"]
        assert key in free, f"partition {key!r} handed out while {self.live(key)} holds it (or nothing is pending)"
        oldest = min(free, key=lambda k: (free[k][0], k))
        assert key == oldest, f"handed out {key!r}, but {oldest!r}'s earliest pending event is older"
        assert [p for p, _ in got.events] == free[key][:limit], "not the partition's pending events in order"
        assert got.last_position == free[key][:limit][-1]
        self.claims[key] = Claim(worker, key, got.key, got.last_position, timeout_ms, self.now_ms + timeout_ms)
        self.counts["claim"] += 1

    def _held_by(self, claim: Claim) -> bool:
        """Whether the broker must accept the worker's call on `claim` now."""
        return self.live(claim.key) is claim

    def finish(self, claim: Claim, how: str) -> None:
        """An ack, renew or release by the claim's worker; accepted exactly while the claim is live."""
        accepted = self._held_by(claim)
        worker = f"w{claim.worker}"
        try:
            if how == "ack":
                self.groups.ack(GROUP, claim.partition, worker, claim.last_position, self.now_ms,
                                self.store.readable_end())
            elif how == "renew":
                self.groups.renew(GROUP, claim.partition, worker, self.now_ms)
            else:
                self.groups.release(GROUP, claim.partition, worker, self.now_ms)
        except EventClaimNotHeldError:
            assert not accepted, f"{how} of a live claim refused at {self.now_ms} ms: {claim}"
            if self.claims.get(claim.key) is claim:
                del self.claims[claim.key]
            self.counts[f"late_{how}" if how != "release" else "release"] += 1
            return
        assert accepted, f"{how} accepted at {self.now_ms} ms of a claim that is not live: {claim}"
        if how == "renew":
            claim.expires_ms = self.now_ms + claim.timeout_ms
        else:
            if how == "ack":
                self.acked[claim.key] = claim.last_position
            del self.claims[claim.key]
        self.counts[how] += 1

    # -- the simulation -----------------------------------------------------------------------------

    def step(self) -> None:
        roll = self.rng.random()
        worker = self.rng.randrange(WORKERS)
        mine = [c for c in self.claims.values() if c.worker == worker]
        if roll < 0.2:
            self.append(self.rng.choice(KEYS))
        elif roll < 0.45:
            self.claim(worker)
        elif roll < 0.60 and mine:
            self.finish(self.rng.choice(mine), "ack")
        elif roll < 0.72 and mine:
            self.finish(self.rng.choice(mine), "renew")
        elif roll < 0.76 and mine:
            self.finish(self.rng.choice(mine), "release")
        elif roll < 0.78 and mine:
            for c in mine:  # the worker crashed: its claims are left to expire
                c.worker = -1
        else:
            self.now_ms += self.rng.randint(1, 300)

    def drain(self) -> None:
        """One worker claims and acks at once until the group has acknowledged every event."""
        for _ in range(10_000):
            self.now_ms += 50
            before = dict(self.claims)
            self.claim(0)
            got = [c for k, c in self.claims.items() if before.get(k) is not c]
            for c in got:
                self.finish(c, "ack")
            if all(not self.pending(k) for k in KEYS):
                return
        raise AssertionError(f"not drained: acknowledged {self.acked}")


@pytest.fixture
def store(tmp_path: pathlib.Path) -> Iterator[EventStore]:
    plog = PartitionLog(tmp_path / "es-0", "es", 0, LogConfig(flush_policy="interval"))
    s = EventStore(plog, progress=lambda: SqliteProgressStore(str(plog.directory)))
    s._open()  # in this thread: the simulation is the writer
    try:
        yield s
    finally:
        s._close_writer()
        s._writer.shutdown()
        plog.close()


@pytest.mark.parametrize("round_", range(3))
def test_seeded_claim_simulation(round_: int, store: EventStore) -> None:
    seed, sim = simulate("event claim simulation", round_, lambda rng: Simulation(rng, store), STEPS)
    assert all(sim.acked.get(k) == sim.positions[k][-1] for k in KEYS if sim.positions[k]), f"seed={seed}"
    for what in ("claim", "ack", "late_ack", "renew", "none"):
        assert sim.counts[what] > 0, f"seed={seed}: no {what} happened in {STEPS} steps: {sim.counts}"
