"""A coordinator paused (SIGSTOP) for twice the broker and member sessions, then resumed (SIGCONT),
expires nobody: its pause is not the brokers' or members' fault (issue 28, dmq.coordinator.pause_watch).

Real processes: a `dmq coordinator`, three `dmq broker`s (broker session 2 s), an RF-3 topic, and a
2-member consumer group (member session 2 s, each member its own process). After the resume, the
test waits until every broker and member has been heard again after the resume plus a full session,
then checks: no broker was declared dead, no in-sync set shrank, no leadership moved (leaders and
leader epochs unchanged), and the group did not rebalance (same generation, same member ids).
Before the fix, a 20 s pause shrank every in-sync set, moved leadership and rebalanced the group.
"""

from __future__ import annotations

import pathlib
import signal
import sys
import time

from _coordinator_faults import READY_TIMEOUT_S, SESSION_MS, TOPIC, create_rf3_topic, wait_for
from _isolation_procs import ProcCluster

from dmq.client import AdminClient
from dmq.client.errors import GroupNotFoundError
from dmq.proto.names import group_id_for

sys.path.insert(0, str(pathlib.Path(__file__).parent.parent / "e2e"))
from _procs import ConsumerProc  # noqa: E402

APP = "pause-app"
PAUSE_S = 2 * SESSION_MS / 1000
MEMBER_CONFIG = {"session_timeout_ms": SESSION_MS, "heartbeat_interval_ms": SESSION_MS // 4,
                 "fetch_max_wait_ms": 200}


def snapshot(admin: AdminClient) -> tuple[object, ...]:
    """What must not change: per partition (leader, leader epoch, ISR); the group's generation and
    member ids; which brokers are alive."""
    partitions = tuple((p.partition, p.leader_id, p.leader_epoch, tuple(sorted(p.isr)))
                       for p in admin.describe_topic(TOPIC).partitions)
    group = admin.describe_group(group_id_for(TOPIC, APP))
    alive = tuple(sorted(b.broker_id for b in admin.list_brokers() if b.alive))
    return partitions, group.generation, tuple(m.member_id for m in group.members), alive


def test_a_paused_coordinator_expires_no_broker_and_no_member(tmp_path: pathlib.Path) -> None:
    with ProcCluster(tmp_path, brokers=3, broker_session_timeout_ms=SESSION_MS) as cluster:
        create_rf3_topic(cluster)
        members = [ConsumerProc(f"member{i}", cluster.bootstrap, TOPIC, APP, config=MEMBER_CONFIG) for i in range(2)]
        try:
            with AdminClient(cluster.bootstrap) as admin:
                def stable() -> bool:
                    try:
                        group = admin.describe_group(group_id_for(TOPIC, APP))
                    except GroupNotFoundError:  # no member subscribed yet
                        return False
                    return group.state == "STABLE" and len(group.members) == 2

                wait_for(stable, READY_TIMEOUT_S, "a stable group of two members")
                before = snapshot(admin)
                assert before[3] == (0, 1, 2), before

                assert cluster.coordinator is not None
                cluster.coordinator.send_signal(signal.SIGSTOP)
                try:
                    time.sleep(PAUSE_S)  # the fault itself: a pause of two sessions
                finally:
                    cluster.coordinator.send_signal(signal.SIGCONT)
                resumed_wall_ms = time.time() * 1000

                # Heard again after the resume: the coordinator's last heartbeat of every broker is
                # later than the resume (same host clock), and a full session has passed since, so
                # an expiry would have happened by now.
                def heard_again() -> bool:
                    return all(b.last_heartbeat_ms > resumed_wall_ms for b in admin.list_brokers())

                wait_for(heard_again, READY_TIMEOUT_S, "every broker's heartbeat after the resume")
                time.sleep(SESSION_MS / 1000 + 1.0)  # an observation window: an expiry would show in it
                after = snapshot(admin)
        finally:
            for m in members:
                m.stop()
        log = (tmp_path / "coordinator.log").read_text(errors="replace")
        print(f"\nbefore the {PAUSE_S:.0f}s SIGSTOP: {before}\nafter the SIGCONT:  {after}")
        assert after == before, f"the pause changed the cluster: before {before}, after {after}"
        assert "broker session expired" not in log, log[-3000:]
        assert "member removed" not in log, log[-3000:]
