"""Seeded simulation of the pure group machine (TigerBeetle VOPR / FoundationDB style, above the
transport): simulated consumers join, poll, commit, heartbeat, pause, crash and leave; heartbeats
and commits are delayed or lost; the clock jumps; partitions are added; the coordinator restarts
(replaying its records). Invariants are checked after every event.

Replay a failure with the seed from the assertion message:
    DMQ_SIM_SEED=<seed> .venv/bin/python -m pytest tests/unit/test_group_simulation.py -k <scenario>
DMQ_SIM_STEPS sets the number of random steps per scenario (default 10,000).

Checks:
1. the group's own invariants (see dmq.coordinator.group.group): owners are live members, acked
   members own only target partitions, STABLE means fully assigned and acknowledged, EMPTY means
   no members, the rebalance timer is armed iff PREPARING_REBALANCE;
2. a model of ownership rebuilt only from the emitted events equals the group's owners, and an
   acquisition never takes a partition somebody still owns (no partition owned twice);
3. generations only grow (within one coordinator incarnation: membership is in memory);
4. commits: a member's commit of what its last GetAssignment gave it always succeeds; a delayed
   commit succeeds iff the member still owns every partition in the *same ownership period* in
   which it sent the commit (an oracle based on time, not generations); any other commit
   succeeds iff the documented rule says so;
5. no duplicates on voluntary hand-off: a partition released through GetAssignment is acquired
   by its next owner at exactly the offset the previous owner committed last;
6. liveness: after faults stop, the group becomes STABLE with every partition owned by a live
   consumer that knows it owns it, within a bounded time.
"""

from __future__ import annotations

import heapq
import itertools
import os
import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import pytest

from dmq.coordinator.group import (
    CheckOwnershipRequest,
    FakeClock,
    FindOrCreateGroupRequest,
    GetAssignmentRequest,
    Group,
    GroupConfig,
    GroupRegistry,
    GroupState,
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    MemberRemoved,
    NotOwnerError,
    PartitionsAcquired,
    PartitionsReleased,
    Result,
    UnknownGroupMemberError,
    check_ownership,
    handle_get_assignment,
    handle_heartbeat,
    handle_join,
    handle_leave,
    record_from_dict,
    record_to_dict,
)
from dmq.coordinator.group.group import REBALANCE_TIMER

SEED = int(os.environ.get("DMQ_SIM_SEED") or random.SystemRandom().randrange(2**32))
STEPS = int(os.environ.get("DMQ_SIM_STEPS") or 10_000)
TOPIC, APP = "sim", "app"


@dataclass(frozen=True)
class Scenario:
    name: str
    partitions: int
    max_clients: int
    heartbeat_loss: float  # probability a heartbeat is lost
    delay: float  # probability a heartbeat or commit is delayed
    max_delay_ms: int
    max_partitions: int  # partitions may be added up to this count


SCENARIOS = [
    Scenario("few_partitions_many_members", 3, 7, 0.05, 0.10, 1_500, 5),
    Scenario("many_partitions", 24, 5, 0.05, 0.10, 1_500, 30),
    Scenario("lossy_network", 10, 5, 0.30, 0.30, 3_000, 12),
]


@dataclass
class Client:
    name: str
    session_timeout_ms: int
    max_poll_interval_ms: int
    heartbeat_interval_ms: int
    poll_interval_ms: int
    member_id: str | None = None
    generation: int = -1
    owned: set[int] = field(default_factory=set)  # what its last GetAssignment said
    positions: dict[int, int] = field(default_factory=dict)  # next offset per owned partition
    last_poll_ms: int = 0
    wants_assignment: bool = True
    crashed: bool = False
    crashed_at_ms: int = 0
    paused: bool = False  # the application loop is stuck: heartbeats go on, polls do not
    paused_at_ms: int = 0
    left: bool = False

    @property
    def active(self) -> bool:
        return not (self.crashed or self.left)


class Sim:
    def __init__(self, scenario: Scenario, seed: int) -> None:
        self.scenario = scenario
        self.rng = random.Random(f"{seed}-{scenario.name}")
        self.clock = FakeClock(1_000_000)
        self.ids = itertools.count()
        self.config = GroupConfig(
            rebalance_debounce_ms=500,
            rebalance_max_delay_ms=2_000,
            min_session_timeout_ms=500,
            min_max_poll_interval_ms=1_000,
            member_id_factory=lambda client_id: f"{client_id}-m{next(self.ids)}",
        )
        self.disk: list[dict[str, Any]] = []  # persisted records, as the service would store them
        self.registry = GroupRegistry(self.config)
        result = self.registry.find_or_create(
            FindOrCreateGroupRequest(TOPIC, APP, scenario.partitions), self.now
        )
        self.group_id = result.response.group_id
        self.faults = True
        self.clients: dict[str, Client] = {}
        self.queue: list[tuple[int, int, str, str, Any]] = []  # (time, seq, kind, client, payload)
        self.seq = itertools.count()
        self.trace: deque[str] = deque(maxlen=40)
        self.step = 0
        self.stats: dict[str, int] = {}
        # Model rebuilt from events only.
        self.model: dict[int, str] = {}  # partition -> owner member id
        self.period: dict[int, int] = {}  # partition -> ownership period counter
        self.voluntary_release: dict[int, int] = {}  # partition -> committed offset at release
        self.committed: dict[int, int] = {}  # the brokers' committed offsets (survive restarts)
        self.max_generation = 0
        self.member_client: dict[str, Client] = {}
        self.apply(result)

    # ------------------------------------------------------------------ plumbing

    @property
    def now(self) -> int:
        return self.clock.now_ms()

    @property
    def group(self) -> Group:
        return self.registry.get(self.group_id)

    def count(self, what: str) -> None:
        self.stats[what] = self.stats.get(what, 0) + 1

    def log(self, message: str) -> None:
        self.trace.append(f"t={self.now} step={self.step} {message}")

    def apply(self, result: Result[Any]) -> Any:
        self.disk.extend(record_to_dict(r) for r in result.records)
        for event in result.events:
            if isinstance(event, PartitionsAcquired):
                for p in event.partitions:
                    assert p not in self.model, f"acquired partition {p} still owned by {self.model[p]}"
                    self.model[p] = event.member_id
                    self.period[p] = self.period.get(p, 0) + 1
            elif isinstance(event, PartitionsReleased):
                for p in event.partitions:
                    assert self.model.pop(p, None) == event.member_id, f"release of {p} by non-owner"
            elif isinstance(event, MemberRemoved):
                self.log(f"removed {event.member_id} ({event.reason.value}) freeing {event.released}")
                self.count(f"removed_{event.reason.value}")
                for p in event.released:
                    assert self.model.pop(p, None) == event.member_id, f"{p} freed by non-owner"
                    self.voluntary_release.pop(p, None)
        return result.response

    def schedule(self, delay_ms: int, kind: str, client: str, payload: Any = None) -> None:
        heapq.heappush(self.queue, (self.now + delay_ms, next(self.seq), kind, client, payload))

    # ------------------------------------------------------------------ invariants

    def check(self) -> None:
        group = self.group
        owners = {p: o.member_id for p, o in group.owners.items()}
        assert owners == self.model, f"event model {self.model} != owners {owners}"
        for p, member_id in owners.items():
            assert member_id in group.members, f"partition {p} owned by gone member {member_id}"
            assert 0 <= p < group.partition_count, f"owned partition {p} out of range"
            assert p in group.owned_by[member_id]
        assert sum(len(s) for s in group.owned_by.values()) == len(owners)
        for member_id, member in group.members.items():
            if member.acked_generation == group.generation:
                extra = group.owned_by.get(member_id, set()) - group.target.get(member_id, set())
                assert not extra, f"{member_id} acked gen {group.generation} but keeps {extra}"
        assert group.generation >= self.max_generation, "generation went backwards"
        self.max_generation = group.generation
        if group.state is GroupState.STABLE:
            for p in range(group.partition_count):
                assert p in owners, f"STABLE but partition {p} unowned"
                assert owners[p] == group.target_owner[p], f"STABLE but {p} not with its target"
            assert all(m.acked_generation == group.generation for m in group.members.values())
        assert (group.state is GroupState.EMPTY) == (not group.members)
        if group.state is GroupState.EMPTY:
            assert not owners and not group.target
        armed = REBALANCE_TIMER in group.timer
        assert armed == (group.state is GroupState.PREPARING_REBALANCE), "rebalance timer"
        # Liveness is enforced: a stuck or crashed consumer is gone within its limit, plus the
        # slack of requests it sent before (a delayed commit counts as poll activity, a delayed
        # heartbeat's poll_age is optimistic by its delay).
        slack_ms = 2 * self.scenario.max_delay_ms
        for member_id, member in group.members.items():
            assert self.now < member.last_heartbeat_ms + member.session_timeout_ms
            assert self.now < member.last_poll_ms + member.max_poll_interval_ms
            client = self.member_client[member_id]
            if client.paused:
                assert self.now <= client.paused_at_ms + client.max_poll_interval_ms + slack_ms
            if client.crashed:
                assert self.now <= client.crashed_at_ms + client.session_timeout_ms + slack_ms

    # ------------------------------------------------------------------ client behaviour

    def spawn(self) -> None:
        name = f"c{next(self.ids)}"
        session = self.rng.choice([1_000, 2_000, 3_000])
        client = Client(
            name=name,
            session_timeout_ms=session,
            max_poll_interval_ms=self.rng.choice([2_000, 5_000, 10_000]),
            heartbeat_interval_ms=session // 3,
            poll_interval_ms=self.rng.choice([100, 300, 800]),
            last_poll_ms=self.now,
        )
        self.clients[name] = client
        self.log(f"spawn {name}")
        self.join(client)
        self.schedule(client.heartbeat_interval_ms, "heartbeat", name)
        self.schedule(client.poll_interval_ms, "poll", name)

    def join(self, client: Client) -> None:
        request = JoinGroupRequest(
            client_id=client.name,
            consumer_id=client.name,
            session_timeout_ms=client.session_timeout_ms,
            max_poll_interval_ms=client.max_poll_interval_ms,
        )
        response = self.apply(handle_join(self.group, request, self.now))
        client.member_id, client.generation = response.member_id, -1
        self.member_client[response.member_id] = client
        client.owned.clear()
        client.positions.clear()
        client.wants_assignment = True
        self.count("join")

    def kicked(self, client: Client, member_id: str) -> None:
        """The coordinator does not know this member (expired, or coordinator restarted)."""
        if client.member_id == member_id:
            client.member_id = None
            client.owned.clear()
            client.positions.clear()
        self.count("not_found")

    def poll(self, client: Client) -> None:
        """DMQConsumer.poll(): (re)join if needed; consume; commit then GetAssignment on a
        rebalance signal (so a revoked partition's final offset is committed first)."""
        if not client.active or client.paused:
            return
        client.last_poll_ms = self.now
        if client.member_id is None:
            self.join(client)
        for p in client.owned:
            client.positions[p] += self.rng.randint(0, 3)
        if client.wants_assignment or self.rng.random() < 0.05:
            if self.commit_owned(client):
                self.get_assignment(client)
        elif self.rng.random() < 0.3:
            self.commit_owned(client)

    def commit_owned(self, client: Client) -> bool:
        assert client.member_id is not None
        partitions = sorted(client.owned)
        request = CheckOwnershipRequest(client.member_id, client.generation, partitions, TOPIC)
        try:
            self.apply(check_ownership(self.group, request, self.now))
        except UnknownGroupMemberError:
            self.kicked(client, request.member_id)
            return False
        except NotOwnerError as error:
            raise AssertionError(f"{client.name} refused commit of its own partitions: {error}") from error
        for p in partitions:
            self.committed[p] = client.positions[p]
        self.count("commit_ok")
        return True

    def get_assignment(self, client: Client) -> None:
        assert client.member_id is not None
        try:
            response = self.apply(
                handle_get_assignment(self.group, GetAssignmentRequest(client.member_id), self.now)
            )
        except UnknownGroupMemberError:
            self.kicked(client, client.member_id)
            return
        for p in response.released:
            assert p in client.owned, f"{client.name} released {p} it did not know it owned"
            assert self.committed.get(p, 0) == client.positions[p], "released before committing"
            self.voluntary_release[p] = client.positions.pop(p)
        for p in response.acquired:
            start = self.committed.get(p, 0)
            if p in self.voluntary_release:  # hand-off through release: no duplicates
                assert self.voluntary_release.pop(p) == start, f"partition {p} moved under a commit"
                self.count("clean_handoff")
            client.positions[p] = start
        client.owned = set(response.partitions)
        client.generation = response.generation
        client.wants_assignment = False
        if response.released or response.acquired:
            self.log(f"{client.name} gen {response.generation} -{response.released} +{response.acquired}")
        self.count("get_assignment")

    def send_heartbeat(self, client: Client) -> None:
        if client.member_id is None:
            return
        request = HeartbeatRequest(client.member_id, client.generation, self.now - client.last_poll_ms)
        if self.faults and self.rng.random() < self.scenario.heartbeat_loss:
            self.count("heartbeat_lost")
        elif self.faults and self.rng.random() < self.scenario.delay:
            self.count("heartbeat_delayed")
            self.schedule(self.rng.randint(1, self.scenario.max_delay_ms), "deliver_heartbeat", client.name, request)
        else:
            self.deliver_heartbeat(client, request)

    def deliver_heartbeat(self, client: Client, request: HeartbeatRequest) -> None:
        try:
            response = self.apply(handle_heartbeat(self.group, request, self.now))
        except UnknownGroupMemberError:
            self.kicked(client, request.member_id)
            return
        if client.member_id == request.member_id and response.assignment_changed:
            client.wants_assignment = True

    # ------------------------------------------------------------------ adversarial commits

    def send_delayed_commit(self, client: Client) -> None:
        """A commit of the client's own partitions that arrives late (a retry, a slow path)."""
        if client.member_id is None or not client.owned:
            return
        partitions = sorted(client.owned)
        periods = {p: self.period[p] for p in partitions}
        request = CheckOwnershipRequest(client.member_id, client.generation, partitions, TOPIC)
        delay = self.rng.randint(1, self.scenario.max_delay_ms * 2)
        self.schedule(delay, "deliver_commit", client.name, (request, periods))

    def deliver_commit(self, request: CheckOwnershipRequest, periods: dict[int, int]) -> None:
        # Oracle: still the owner, in the same ownership period as when it was sent.
        expected = request.member_id in self.group.members and all(
            self.model.get(p) == request.member_id and self.period[p] == sent_period
            for p, sent_period in periods.items()
        )
        self.assert_commit_outcome(request, expected, "delayed")

    def rogue_commit(self) -> None:
        """Any member, any partitions, any generation: the rule decides."""
        group = self.group
        # Not on behalf of stuck or crashed consumers: an accepted commit is proof of life.
        candidates = [
            m for m in sorted(group.members) if not self.member_client[m].paused
            and self.member_client[m].active
        ] + ["ghost"]
        member_id = self.rng.choice(candidates)
        partitions = self.rng.sample(range(group.partition_count), k=min(2, group.partition_count))
        generation = self.rng.randint(max(0, group.generation - 3), group.generation + 1)
        expected = member_id in group.members and all(
            (o := group.owners.get(p)) is not None
            and o.member_id == member_id
            and o.since_generation <= generation <= group.generation
            for p in partitions
        )
        request = CheckOwnershipRequest(member_id, generation, partitions, TOPIC)
        self.assert_commit_outcome(request, expected, "rogue")

    def assert_commit_outcome(self, request: CheckOwnershipRequest, expected: bool, kind: str) -> None:
        try:
            self.apply(check_ownership(self.group, request, self.now))
            accepted = True
        except (UnknownGroupMemberError, NotOwnerError):
            accepted = False
        assert accepted == expected, f"{kind} commit {request} accepted={accepted}, expected={expected}"
        self.count(f"{kind}_commit_{'ok' if accepted else 'refused'}")

    # ------------------------------------------------------------------ time

    def advance(self, ms: int) -> None:
        """Move time forward, running coordinator timers and client events in time order."""
        until = self.now + ms
        while True:
            next_timer = self.registry.next_deadline_ms()
            next_event = self.queue[0][0] if self.queue else None
            candidates = [t for t in (next_timer, next_event) if t is not None and t <= until]
            if not candidates:
                break
            self.clock.advance_to(min(candidates))
            if next_timer is not None and next_timer <= self.now:
                self.apply(self.registry.tick(self.now))
                self.check()
            while self.queue and self.queue[0][0] <= self.now:
                _, _, kind, name, payload = heapq.heappop(self.queue)
                self.run_event(kind, self.clients[name], payload)
                self.check()
        self.clock.advance_to(until)

    def run_event(self, kind: str, client: Client, payload: Any) -> None:
        if kind == "deliver_heartbeat":  # delivered even if the sender crashed since
            self.deliver_heartbeat(client, payload)
        elif kind == "deliver_commit":
            self.deliver_commit(*payload)
        elif not client.active:
            return  # a crashed or departed client's own schedule stops
        elif kind == "heartbeat":
            self.send_heartbeat(client)
            self.schedule(client.heartbeat_interval_ms, "heartbeat", client.name)
        elif kind == "poll":
            self.poll(client)
            self.schedule(client.poll_interval_ms, "poll", client.name)

    # ------------------------------------------------------------------ random steps

    def active(self) -> list[Client]:
        return [c for c in self.clients.values() if c.active]

    def random_step(self) -> None:
        rng = self.rng
        active = self.active()
        joined = [c for c in active if c.member_id is not None and not c.paused]
        action = rng.choices(
            [
                "advance",
                "spawn",
                "crash",
                "pause",
                "resume",
                "leave",
                "poll",
                "heartbeat",
                "delayed_commit",
                "rogue_commit",
                "add_partitions",
                "restart",
            ],
            weights=[35, 4, 2, 2, 3, 2, 15, 10, 8, 8, 0.3, 0.2],
        )[0]
        if action == "advance":
            self.advance(rng.choice([1, 10, 50, 200, 500, 1_000, 3_000]))
        elif action == "spawn" and len(active) < self.scenario.max_clients:
            self.spawn()
        elif action == "crash" and active:
            client = rng.choice(active)
            client.crashed, client.crashed_at_ms = True, self.now
            self.log(f"crash {client.name}")
        elif action == "pause" and joined:
            client = rng.choice(joined)
            client.paused, client.paused_at_ms = True, self.now
        elif action == "resume":
            for client in active:
                client.paused = False
        elif action == "leave" and joined:
            client = rng.choice(joined)
            if self.commit_owned(client) and client.member_id is not None:
                response = self.apply(
                    handle_leave(self.group, LeaveGroupRequest(client.member_id), self.now)
                )
                for p in response.released:
                    self.voluntary_release[p] = client.positions[p]
            client.left = True
            self.log(f"leave {client.name}")
        elif action == "poll" and joined:
            client = rng.choice(joined)
            client.wants_assignment = True
            self.poll(client)
        elif action == "heartbeat" and active:
            self.send_heartbeat(rng.choice(active))
        elif action == "delayed_commit" and joined:
            self.send_delayed_commit(rng.choice(joined))
        elif action == "rogue_commit":
            self.rogue_commit()
        elif action == "add_partitions" and self.group.partition_count < self.scenario.max_partitions:
            count = min(self.scenario.max_partitions, self.group.partition_count + rng.randint(1, 3))
            self.log(f"partitions -> {count}")
            self.apply(self.registry.partition_count_changed(TOPIC, count, self.now))
            self.count("add_partitions")
        elif action == "restart":
            self.restart()
        self.check()

    def restart(self) -> None:
        """The coordinator restarts: groups come back from the records, membership does not."""
        self.log("coordinator restart")
        partition_count = self.group.partition_count
        self.registry = GroupRegistry(self.config)
        for row in self.disk:
            self.registry.replay(record_from_dict(row))
        # The service re-applies the topic's current partition count from the metadata store.
        self.apply(self.registry.partition_count_changed(TOPIC, partition_count, self.now))
        assert self.group.state is GroupState.EMPTY and self.group.generation == 0
        self.model.clear()
        self.voluntary_release.clear()
        self.max_generation = 0
        self.count("restart")

    # ------------------------------------------------------------------ liveness

    def calm_and_check_liveness(self) -> None:
        """Stop the faults and the stuck loops; the group must converge in bounded time."""
        self.faults = False
        for client in self.active():
            client.paused = False
        if not self.active():
            self.spawn()
        deadline = self.now + 30_000
        while self.now < deadline and not self.converged():
            self.advance(100)
        assert self.converged(), f"no convergence by t={self.now}: {self.group!r} {self.describe()}"
        self.count("converged")
        self.faults = True

    def converged(self) -> bool:
        group = self.group
        active = self.active()
        if group.state is not GroupState.STABLE:
            return False
        if any(c.member_id is None for c in active):
            return False
        if set(group.members) != {c.member_id for c in active}:
            return False  # crashed members must have expired
        if len(group.owners) != group.partition_count:
            return False
        return all(c.owned == set(group.owned_partitions(str(c.member_id))) for c in active)

    def describe(self) -> str:
        return " ".join(
            f"{c.name}(member={c.member_id}, gen={c.generation}, owned={sorted(c.owned)}, "
            f"paused={c.paused}, crashed={c.crashed})"
            for c in self.active()
        )


def run(scenario: Scenario, seed: int, steps: int) -> Sim:
    sim = Sim(scenario, seed)
    for _ in range(2):
        sim.spawn()
    try:
        for sim.step in range(1, steps + 1):
            sim.random_step()
            if sim.step % 1_000 == 0:
                sim.calm_and_check_liveness()
        sim.calm_and_check_liveness()
    except Exception as error:
        trace = "\n  ".join(sim.trace)
        raise AssertionError(
            f"simulation failed: DMQ_SIM_SEED={seed} scenario={scenario.name} step={sim.step}: "
            f"{type(error).__name__}: {error}\nlast actions:\n  {trace}"
        ) from error
    return sim


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_group_simulation(scenario: Scenario) -> None:
    started = time.monotonic()
    sim = run(scenario, SEED, STEPS)
    elapsed_s = time.monotonic() - started
    stats = sim.stats
    # The run must have exercised what it claims to check (else it checks nothing).
    for what in (
        "join",
        "commit_ok",
        "get_assignment",
        "clean_handoff",
        "removed_session_timeout",
        "removed_left",
        "removed_max_poll_interval",
        "delayed_commit_ok",
        "delayed_commit_refused",
        "rogue_commit_ok",
        "rogue_commit_refused",
        "not_found",
        "converged",
    ):
        assert stats.get(what, 0) > 0, f"DMQ_SIM_SEED={SEED}: never saw {what}: {stats}"
    print(f"{scenario.name}: seed={SEED} steps={STEPS} {elapsed_s:.1f}s {sorted(stats.items())}")


def test_same_seed_same_run() -> None:
    first = run(SCENARIOS[0], 12345, 2_000)
    second = run(SCENARIOS[0], 12345, 2_000)
    assert first.stats == second.stats and list(first.trace) == list(second.trace)


def test_simulation_catches_a_broken_commit_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness must fail when the machine is wrong: accept commits from anyone."""
    import dmq.coordinator.group.handlers as handlers

    def accept_everything(group: Group, request: CheckOwnershipRequest, now_ms: int) -> Result[Any]:
        from dmq.coordinator.group import CheckOwnershipResponse

        return Result(CheckOwnershipResponse(group.generation))

    monkeypatch.setattr(handlers, "check_ownership", accept_everything)
    monkeypatch.setitem(globals(), "check_ownership", accept_everything)
    with pytest.raises(AssertionError, match="DMQ_SIM_SEED=7 .*commit"):
        run(SCENARIOS[0], 7, 3_000)
