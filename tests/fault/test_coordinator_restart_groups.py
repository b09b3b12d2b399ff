"""A restarted coordinator resumes its consumer groups (issue 28): their generation, members (ids,
secrets, sessions), target assignment and partition owners are durable, and the members are given
one session timeout from the start to be heard again, as Kafka's group coordinator does after it
moves.

Real processes: a `dmq coordinator` (SIGKILLed mid-stream, then restarted on its port), three
`dmq broker`s, an RF-3 topic, a producer writing throughout and a 2-member group (each member its
own process, committing after every poll). Afterwards: the generation did not go back (it is the
same, or later), the members kept their ids, every record was read, and the records read twice
are at most the members' uncommitted ones (a poll batch each: during the outage commits fail, and
the first commit after it covers what was read meanwhile). Before the fix, the restarted
coordinator answered the members NOT_FOUND: they re-joined with new ids at generation 1, and the
new owners re-read everything since the last commit before the outage.
"""

from __future__ import annotations

import pathlib
import sys

from _coordinator_faults import READY_TIMEOUT_S, SESSION_MS, TOPIC, create_rf3_topic, wait_for
from _isolation_procs import ProcCluster

from dmq.client import AdminClient
from dmq.client.errors import DMQError
from dmq.proto.names import group_id_for

sys.path.insert(0, str(pathlib.Path(__file__).parent.parent / "e2e"))
from _procs import ConsumerProc, ProducerProc  # noqa: E402

APP = "restart-app"
RECORDS = 1_500
RATE = 150.0
MAX_POLL_RECORDS = 20
# The members' gRPC channel to the coordinator reconnects on gRPC's default backoff (1 s growing
# 1.6x): after a restart that takes a few seconds on a loaded machine, their first heartbeat may
# come several seconds after the coordinator is back. The default session leaves room for it.
MEMBER_SESSION_MS = 10_000
MEMBER_CONFIG = {"session_timeout_ms": MEMBER_SESSION_MS, "heartbeat_interval_ms": 1_000,
                 "max_poll_records": MAX_POLL_RECORDS, "fetch_max_wait_ms": 200}


def group_view(admin: AdminClient) -> tuple[int, tuple[str, ...], str] | None:
    try:
        group = admin.describe_group(group_id_for(TOPIC, APP))
    except DMQError:  # not created yet, or the coordinator is starting
        return None
    return group.generation, tuple(m.member_id for m in group.members), group.state


def test_a_restarted_coordinator_keeps_its_groups(tmp_path: pathlib.Path) -> None:
    with ProcCluster(tmp_path, brokers=3, broker_session_timeout_ms=SESSION_MS) as cluster:
        create_rf3_topic(cluster)
        members = [ConsumerProc(f"member{i}", cluster.bootstrap, TOPIC, APP, commit="sync", config=MEMBER_CONFIG)
                   for i in range(2)]
        producer = ProducerProc(cluster.bootstrap, TOPIC, 3, RECORDS, RATE)
        try:
            with AdminClient(cluster.bootstrap) as admin:
                def stable_and_reading() -> bool:
                    view = group_view(admin)
                    return (view is not None and view[2] == "STABLE" and len(view[1]) == 2
                            and all(m.of("commit") for m in members))

                wait_for(stable_and_reading, READY_TIMEOUT_S, "a stable group of two members committing")
                before = group_view(admin)
            assert before is not None
            read_before = sum(len(m.consumed()) for m in members)
            cluster.kill_coordinator()
            cluster.start_coordinator()  # same port, same data directory
            producer.wait_for(lambda e: e.get("ev") == "done", READY_TIMEOUT_S + RECORDS / RATE, "producer done")

            def all_read() -> bool:
                return len({(p, o) for m in members for p, o, _ in m.consumed()}) >= RECORDS

            wait_for(all_read, READY_TIMEOUT_S, f"all {RECORDS} records read by the group")
            with AdminClient(cluster.bootstrap) as admin:
                after = group_view(admin)
        finally:
            producer.stop()
            for m in members:
                m.stop()
        consumed = [(p, o) for m in members for p, o, _ in m.consumed()]
        redelivered = len(consumed) - len(set(consumed))
        rejoined = [m.name for m in members if m.of("lost")]
        print(f"\ngroup before the coordinator restart (generation, members, state): {before}"
              f"\ngroup after it: {after}"
              f"\nrecords read before the kill: {read_before}; read in all: {len(consumed)}; read twice: "
              f"{redelivered}; members that lost their partitions: {rejoined}")
        assert after is not None
        assert after[0] >= before[0], f"the generation went back: {before[0]} -> {after[0]}"
        assert after[1] == before[1], f"the members changed ids: {before[1]} -> {after[1]}"
        assert redelivered <= 2 * MAX_POLL_RECORDS, f"{redelivered} records read twice"
