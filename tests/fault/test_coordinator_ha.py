"""The control plane survives its faults (issue 28, Acceptance): real processes throughout.

A real etcd, three `dmq coordinator`s on it (lease TTL 3 s: one active, two standing by), three
`dmq broker`s given all three addresses, an RF-3 topic of 6 partitions (min in-sync 2), an
idempotent acks=all producer and a 2-member consumer group (each its own process, committing after
every poll) running throughout. In a seeded order (the seed is printed; DMQ_FAULT_SEED replays it):
SIGKILL the active coordinator five times, twice alone and three times followed 0.5 s later by a
SIGKILL of a broker that leads partitions (the seed picks which), and SIGSTOP it once for 10 s,
then SIGCONT. After each fault the killed processes are started again, as an operator's supervisor
would (a coordinator on its port), so the cluster is 3 + 3 again before the next fault; so is a
deposed coordinator that exited when resumed (today's behaviour; one that stays up to stand by
instead is left running). The next fault waits for the cluster to heal: every partition in sync
and led by its preferred replica, the group stable, and every partition acknowledged and
committed again.

Checked, and printed:
  - every acknowledged record is stored once, at the offset it was acknowledged with, in send
    order; the group read every one, and each time a member started reading a partition it
    started at or after the group's last acknowledged commit and not past what had been read
    (read exactly once, counting from the last commit);
  - when only the coordinator was killed, no partition's acknowledgements paused longer than 2 s;
    when a broker died too, every partition took produce again within the takeover + broker
    session timeout + replica lag time + 3 s of the broker's death;
  - a standby became active within the lease TTL + 1 s of each fault (each takeover is printed);
  - the resumed deposed coordinator changed nothing: it logged that it stepped down, a write sent
    to it while it was paused (a topic creation, answered once it resumed) was refused and
    created nothing, and every broker refuses a push of its controller epoch;
  - the group read every partition again within its session timeout + 3 s of each takeover.
Times are taken on the monotonic clock every process of the host shares (the children stamp their
events with it), so events of several processes are ordered without wall-clock care.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import random
import signal
import sys
import time
from dataclasses import dataclass, field

import grpc
import pytest
from _ha_procs import CoordinatorProc, HaCluster

from dmq.client import AdminClient, SimpleConsumer
from dmq.client.errors import DMQError
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import error_details
from dmq.proto.names import group_id_for

sys.path.insert(0, str(pathlib.Path(__file__).parent.parent / "e2e"))
from _procs import ConsumerProc, Proc  # noqa: E402

from tests import polling  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TOPIC = "ha"
PARTITIONS = 6
APP = "ha-app"
DEPOSED_TOPIC = "written-by-the-deposed"
# Not etcd's minimum of 2 s: with it (renewals every 0.67 s, acting until 1.5 s after the last one
# was sent) a coordinator whose loop stalls ~1 s steps down, and a full run at load 10-16 on 2
# cores saw stalls of 0.56 and 0.96 s: the lease went c2, c0, c2, c0 ... (epochs 3-8) for 10 s
# after fault 1 and broker 1's partitions took produce again only after 19.5 s. Forced: twelve
# 1.0 s SIGSTOPs of an active coordinator at every phase of its renewal cycle stepped it down 3
# times with TTL 2, never with TTL 3 (renewals every 1 s, acting until 2.25 s after one).
LEASE_TTL_S = 3
BROKER_SESSION_MS = 2_000
REPLICA_LAG_MS = 2_000
# The group must read again within its session + 3 s of a takeover, and where a broker died too
# nothing is readable until produce resumes (up to takeover + broker session + lag + 3 s after
# the broker's death): a session shorter than about 7 s could not hold both.
MEMBER_SESSION_MS = 10_000
MEMBER_CONFIG = {"session_timeout_ms": MEMBER_SESSION_MS, "heartbeat_interval_ms": 1_000,
                 "fetch_max_wait_ms": 200, "max_poll_records": 50}
RATE = 100.0  # records/s, round-robin over the partitions
BROKER_AFTER_S = 0.5
STOP_S = 10.0
ALONE_PAUSE_MAX_S = 2.0
SLACK_S = 3.0  # the acceptance's "+ 3 s"
HEAL_TIMEOUT_S = 60.0
WAIT_S = 30.0
FAULTS = ("kill",) * 2 + ("kill+broker",) * 3 + ("stop",)


@dataclass
class Fault:
    kind: str
    at: float  # monotonic: the signal to the active coordinator
    old: str
    old_epoch: int
    takeover_at: float = 0.0
    new: str = ""
    broker: int | None = None
    broker_at: float = 0.0
    healed_at: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def takeover_s(self) -> float:
        return self.takeover_at - self.at


wait_for = functools.partial(polling.seconds_until, poll_s=0.02)  # (predicate, timeout_s, what) -> seconds


def partitions(admin: AdminClient) -> list[object] | None:
    try:
        return list(admin.describe_topic(TOPIC).partitions)
    except DMQError:  # no coordinator active at this moment
        return None


def unhealthy(cluster: HaCluster, admin: AdminClient) -> str:
    """What is not healthy yet ("" once it all is): three coordinators up, one active; three live
    brokers; every partition fully in sync and led by its preferred replica (a restarted broker
    gets its leaderships back within the controller's preferred-leader check, 5 s: a move left
    pending would land in the next fault's window and pause produce there for its own reasons);
    the group stable with both members."""
    if not all(c.running() for c in cluster.coordinators) or cluster.active() is None:
        return f"coordinators {cluster.coordinators}"
    try:
        alive = {b.broker_id for b in admin.list_brokers() if b.alive}
        parts = admin.describe_topic(TOPIC).partitions
        group = admin.describe_group(group_id_for(TOPIC, APP))
    except DMQError as e:
        return repr(e)
    if alive != {0, 1, 2} or not all(len(p.isr) == 3 and p.leader_alive and p.leader_id == p.replicas[0] for p in parts):
        return f"live brokers {sorted(alive)}, partitions {parts}"
    if group.state != "STABLE" or len(group.members) != 2:
        return f"group {group}"
    return ""


def wait_healthy(cluster: HaCluster, admin: AdminClient, what: str) -> None:
    """Until healthy; meanwhile a coordinator that exited (killed, or deposed: it exits when
    resumed today; one that returns to standby instead stays up) is started again on its port, as
    an operator's supervisor would."""
    last = ["not asked yet"]

    def healthy() -> bool:
        for c in cluster.coordinators:
            if not c.running():
                c.kill()  # reaps it
                c.start()
        last[0] = unhealthy(cluster, admin)
        return not last[0]

    try:
        wait_for(healthy, HEAL_TIMEOUT_S, what)
    except AssertionError as e:
        raise AssertionError(f"{e}: {last[0]}") from None


def inject(cluster: HaCluster, admin: AdminClient, kind: str, rng: random.Random) -> Fault:
    old = cluster.active()
    assert old is not None and old.epoch() is not None
    victim = None
    if kind == "kill+broker":
        leaders = sorted({p.leader_id for p in admin.describe_topic(TOPIC).partitions})
        victim = rng.choice(leaders)
    others = [c for c in cluster.coordinators if c is not old]
    with grpc.insecure_channel(old.address) as channel:
        if kind == "stop":  # a connection to it, open before the pause (see resume_deposed)
            pb_grpc.CoordinatorStatusStub(channel).DescribeCoordinator(pb.DescribeCoordinatorRequest(), timeout=WAIT_S)
        fault = Fault(kind, time.monotonic(), old.name, old.epoch() or 0)
        old.signal(signal.SIGSTOP if kind == "stop" else signal.SIGKILL)
        if victim is not None:
            time.sleep(max(0.0, fault.at + BROKER_AFTER_S - time.monotonic()))  # the fault's own timing
            cluster.brokers[victim].signal(signal.SIGKILL)
            fault.broker, fault.broker_at = victim, time.monotonic()

        def taken_over() -> CoordinatorProc | None:
            return next((c for c in others if c.running() and (c.epoch() or 0) > fault.old_epoch), None)

        wait_for(lambda: taken_over() is not None, WAIT_S, f"takeover from {old.name}")
        fault.takeover_at = time.monotonic()
        new = taken_over()
        assert new is not None
        fault.new = new.name
        if kind == "stop":
            resume_deposed(old, channel, fault)
    if victim is not None:
        cluster.brokers[victim].kill()  # reaps it
        cluster.brokers[victim].start()
    return fault


def unread_bytes(server_port: int) -> int:
    """Bytes this process sent to `server_port` that the server has not read yet: the receive
    queues (/proc/net/tcp, and tcp6: gRPC's sockets are IPv6 with IPv4-mapped addresses) of the
    server's ends of this process's connections to it."""
    mine = set()
    for fd in pathlib.Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            mine.add(target[8:-1])
    rows = [line.split() for table in ("tcp", "tcp6")
            for line in pathlib.Path(f"/proc/net/{table}").read_text().splitlines()[1:]]
    port_of = lambda address: int(address.rsplit(":", 1)[1], 16)  # noqa: E731
    local_ports = {port_of(r[1]) for r in rows if r[9] in mine and port_of(r[2]) == server_port}
    return sum(int(r[4].split(":")[1], 16) for r in rows
               if port_of(r[1]) == server_port and port_of(r[2]) in local_ports)


def resume_deposed(old: CoordinatorProc, channel: grpc.Channel, fault: Fault) -> None:
    """SIGCONT after STOP_S, with a topic creation waiting for the deposed coordinator: sent on a
    connection it accepted before the pause, and in its socket (unread) when it resumes."""
    time.sleep(max(0.0, fault.at + STOP_S - time.monotonic()))  # the fault itself: a 10 s pause
    before = unread_bytes(old.port)
    write = pb_grpc.MetadataStub(channel).CreateTopic.future(
        pb.CreateTopicRequest(name=DEPOSED_TOPIC, partitions=1), timeout=WAIT_S)
    wait_for(lambda: unread_bytes(old.port) > before, WAIT_S, f"the write waiting in the paused {old.name}'s socket")
    old.signal(signal.SIGCONT)
    try:
        write.result()
        answer = "OK"
    except grpc.RpcError as e:
        answer = f"{e.code().name} ({error_details.reason_of(e.trailing_metadata())}): {e.details()}"
    wait_for(lambda: not old.running() or "stepping down" in old.log(), WAIT_S, f"{old.name} stepping down")
    fault.notes.append(f"the topic creation sent to the paused {old.name} was answered: {answer}")
    assert answer != "OK"
    assert "stepping down" in old.log(), old.log()[-3000:]


def check_brokers_refuse(cluster: HaCluster, admin: AdminClient, epoch: int) -> list[str]:
    """Every live broker refuses a push of the deposed controller epoch."""
    answers = []
    for b in admin.list_brokers():
        with grpc.insecure_channel(f"{b.host}:{b.port}") as channel:
            with pytest.raises(grpc.RpcError) as refused:
                pb_grpc.BrokerStub(channel).UpdatePartitionStates(
                    pb.UpdatePartitionStatesRequest(controller_epoch=epoch), timeout=WAIT_S)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, refused.value
        assert f"controller_epoch {epoch} is older than" in (refused.value.details() or ""), refused.value
        answers.append(f"broker {b.broker_id}: {refused.value.details()}")
    return answers


def acked_since(producer: Proc, since: float) -> set[int]:
    """The partitions with an acknowledgement after `since` (monotonic)."""
    return {e["p"] for e in producer.of("acked") if e["m"] > since}


def committed_since(members: list[ConsumerProc], since: float) -> set[int]:
    """The partitions the group committed after `since` (monotonic)."""
    return {int(p) for m in members for e in m.of("commit") if e["m"] > since for p in e["offsets"]}


def max_pause_s(acks: list[float], start: float, end: float) -> tuple[float, float]:
    """The longest time in [start, end] with no acknowledgement (acks sorted), and when it began
    (seconds after start)."""
    longest, began, last = 0.0, 0.0, start
    for t in acks:
        if t <= start:
            continue
        if t > end:
            break
        if t - last > longest:
            longest, began = t - last, last - start
        last = t
    return max((longest, began), (end - last, last - start))


def test_coordinator_and_broker_faults_lose_nothing_and_the_control_plane_takes_over(
    tmp_path: pathlib.Path, etcd_url: str
) -> None:
    test_started = time.monotonic()
    seed = int(os.environ.get("DMQ_FAULT_SEED", random.randrange(2**32)))
    print(f"\ncoordinator HA fault test seed: {seed} (DMQ_FAULT_SEED={seed} replays it)", flush=True)
    rng = random.Random(seed)
    order = list(FAULTS)
    rng.shuffle(order)
    with HaCluster(
        tmp_path, etcd_url, coordinators=3, brokers=3,
        coordinator_args=["--lease-ttl-s", str(LEASE_TTL_S), "--broker-session-timeout-ms", str(BROKER_SESSION_MS)],
        broker_args=["--replica-lag-time-max-ms", str(REPLICA_LAG_MS)],
    ) as cluster, AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topic(TOPIC, PARTITIONS, {"replication_factor": 3, "min_insync_replicas": 2})
        members = [ConsumerProc(f"member{i}", cluster.bootstrap, TOPIC, APP, commit="sync", config=MEMBER_CONFIG)
                   for i in range(2)]
        producer = Proc("producer", "acked_producer_proc.py",
                        ["--bootstrap", cluster.bootstrap, "--topic", TOPIC, "--partitions", str(PARTITIONS),
                         "--rate", str(RATE), "--name", "p"])
        faults: list[Fault] = []
        try:
            wait_healthy(cluster, admin, "a healthy cluster")
            for kind in order:
                fault = inject(cluster, admin, kind, rng)
                faults.append(fault)
                print(f"fault {len(faults)}: {kind}: {fault.old} (epoch {fault.old_epoch}) -> {fault.new} took over in "
                      f"{fault.takeover_s:.2f}s" + (f"; broker {fault.broker} killed" if fault.broker is not None else ""),
                      flush=True)
                wait_healthy(cluster, admin, f"healing after fault {len(faults)}")
                # ... and acknowledging on every partition again (the last leadership move, back
                # to a restarted broker's preferred replicas, is not the next fault's pause).
                fault.healed_at = time.monotonic()
                wait_for(lambda since=fault.healed_at: acked_since(producer, since) == set(range(PARTITIONS)), WAIT_S,
                         f"produce on every partition after fault {len(faults)}")
                # ... and the group committing on every partition again: commits wait for every
                # in-sync replica of the partition's internal offsets log, which a restarted
                # broker may not have caught up yet when its data is in sync (seen: commits
                # refused "the in-sync replicas did not all get the write" for several seconds),
                # and a fault before then would be measured with the previous one's wait in it.
                wait_for(lambda since=fault.healed_at: committed_since(members, since) == set(range(PARTITIONS)), WAIT_S,
                         f"commits on every partition after fault {len(faults)}")
                if kind == "stop":
                    fault.notes += check_brokers_refuse(cluster, admin, fault.old_epoch)
                    assert DEPOSED_TOPIC not in {t.name for t in admin.list_topics()}
                for note in fault.notes:
                    print(f"  {note}", flush=True)
            # The last fault's window: every partition acknowledged and read after it healed.
            healed = faults[-1].healed_at
            wait_for(lambda: acked_since(producer, healed) == set(range(PARTITIONS))
                     and {p for m in members for e in m.of("records") if e["m"] > healed for p, _, _ in e["items"]}
                     == set(range(PARTITIONS)), WAIT_S, "produce and consume after the last fault")
            producer.send("close")
            producer.wait_for(lambda e: e.get("ev") == "closed", WAIT_S * 4, "producer closed")
            acked = {e["v"]: (e["p"], e["o"]) for e in producer.of("acked")}
            wait_for(lambda: set(acked.values()) <= {(p, o) for m in members for p, o, _ in m.consumed()},
                     WAIT_S, "the group reading every acknowledged record")
        finally:
            producer.kill()
            for m in members:
                m.stop()
            for proc in [producer, *members]:  # for a failure's post-mortem (--basetemp keeps them)
                (tmp_path / f"{proc.name}.events").write_text("\n".join(json.dumps(e) for e in proc.events))
                (tmp_path / f"{proc.name}.stderr").write_text("".join(proc.stderr))
        assert not producer.of("failed"), producer.of("failed")[:5]
        assert len(acked) > 1_000, f"only {len(acked)} records acknowledged"
        with SimpleConsumer(cluster.bootstrap) as consumer:
            stored = {}
            for p in range(PARTITIONS):
                end = consumer.offsets(TOPIC, p)[1]
                stored[p] = [(r.offset, r.value.decode()) for r in consumer.consume(TOPIC, p, 0, max_records=end,
                                                                                     max_wait_ms=1000)]
    took_s = time.monotonic() - test_started

    # 1. Stored once, where acknowledged, in send order.
    for p, items in stored.items():
        values = [v for _, v in items]
        assert len(values) == len(set(values)), f"partition {p}: a record stored twice"
        sent = [int(v.split("-")[1]) for v in values]
        assert sent == sorted(sent), f"partition {p}: records out of send order"
    at = {v: (p, o) for p, items in stored.items() for o, v in items}
    moved = {v: where for v, where in acked.items() if at.get(v) != where}
    assert not moved, f"{len(moved)} acknowledged records lost or moved, e.g. {list(moved.items())[:5]}"

    # 2. Read exactly once, counting from the last commit.
    commits = sorted((e["m"], int(p), o) for m in members for e in m.of("commit") for p, o in e["offsets"].items())
    reads = {p: sorted((e["m"], o, m.name) for m in members for e in m.of("records") for q, o, _ in e["items"] if q == p)
             for p in range(PARTITIONS)}
    read_twice = 0
    for p, rs in reads.items():
        previous: dict[str, int] = {}
        for m_at, offset, name in rs:
            if previous.get(name) is not None and offset == previous[name] + 1:
                previous[name] = offset
                continue  # within a stint of this member
            committed = max((o for t, q, o in commits if q == p and t < m_at), default=0)
            read_up_to = max((o for t, o, _ in rs if t < m_at), default=-1)
            assert committed <= offset <= max(read_up_to + 1, committed), (
                f"{name} started partition {p} at {offset}: last commit {committed}, read up to {read_up_to}")
            read_twice += max(0, read_up_to + 1 - offset)
            previous[name] = offset
    consumed = [(p, o) for m in members for p, o, _ in m.consumed()]

    # 3-5. Per fault: takeover, produce pauses, the group reading again.
    acks = {p: sorted(e["m"] for e in producer.of("acked") if e["p"] == p) for p in range(PARTITIONS)}
    read_at = {p: [t for t, _, _ in rs] for p, rs in reads.items()}
    failures = []
    for n, fault in enumerate(faults, 1):
        window_end = faults[n].at if n < len(faults) else fault.healed_at
        if fault.kind == "kill+broker":
            bound_s = fault.takeover_s + (BROKER_SESSION_MS + REPLICA_LAG_MS) / 1000 + SLACK_S
            pauses = {p: max_pause_s(a, fault.broker_at, window_end) for p, a in acks.items()}
            what = f"after broker {fault.broker}'s death (bound {bound_s:.1f}s)"
        else:
            bound_s = ALONE_PAUSE_MAX_S if fault.kind == "kill" else float("inf")
            pauses = {p: max_pause_s(a, fault.at, window_end) for p, a in acks.items()}
            what = f"(bound {bound_s:.1f}s)" if fault.kind == "kill" else "(no bound: a paused coordinator)"
        read_again = {p: min((t for t in ts if t > fault.takeover_at), default=float("inf")) - fault.takeover_at
                      for p, ts in read_at.items()}
        read_bound_s = MEMBER_SESSION_MS / 1000 + SLACK_S
        longest = max(pauses.items(), key=lambda item: item[1][0])
        pauses = {p: pause for p, (pause, _began) in pauses.items()}
        print(f"fault {n} {fault.kind}: takeover {fault.takeover_s:.2f}s, healed {fault.healed_at - fault.at:.1f}s after it; "
              f"longest produce pause per partition {what}: {longest[1][0]:.2f}s (partition {longest[0]}, from "
              f"{longest[1][1]:.2f}s after the fault); group read every partition again "
              f"{max(read_again.values()):.2f}s after the takeover (bound {read_bound_s:.0f}s)")
        if fault.takeover_s > LEASE_TTL_S + 1:
            failures.append(f"fault {n}: takeover took {fault.takeover_s:.2f}s (bound {LEASE_TTL_S + 1}s)")
        if max(pauses.values()) > bound_s:
            failures.append(f"fault {n} {fault.kind}: produce paused {pauses} {what}")
        if max(read_again.values()) > read_bound_s:
            failures.append(f"fault {n} {fault.kind}: the group read again after {read_again} (bound {read_bound_s:.0f}s)")
    print(f"acknowledged {len(acked)}, stored {sum(len(s) for s in stored.values())}, read {len(consumed)} "
          f"({read_twice} read twice, after their last commit); test took {took_s:.0f}s")
    assert not failures, "\n".join(failures)
