"""A restarted coordinator resumes the controller's duties (issue 28), over real processes: a
`dmq coordinator` and three `dmq broker`s (see _isolation_procs.py), an RF-3 topic, a short broker
session (2 s) so each test stays short.

1. A broker SIGKILLed while the coordinator is down is declared dead one broker session after the
   coordinator is back (it is given that long to re-register), and its partitions get a live
   leader from the ISR, without it. Before the fix the restarted coordinator started no session
   for a broker that never re-registered: its partitions kept it as their (dead) leader for as
   long as it stayed dead. The test also prints, without asserting it, the issue's finding that
   is not fixed here: while the coordinator is down and a broker is dead, acks=all produce to the
   other leaders' partitions waits (no in-sync set can shrink without the controller).
2. Brokers re-register within about a second of the coordinator being back, however long it was
   down: their channel to it retries its connection at most every
   COORDINATOR_RECONNECT_BACKOFF_MAX_MS (jittered), and a failed heartbeat is retried as soon as
   the channel connects. Before the fix gRPC's default reconnect backoff (1 s growing 1.6x to
   120 s) kept them away for 9.5-18 s after a 30 s outage (9.9 s after the 8 s one here).

Each test prints what it measured.
"""

from __future__ import annotations

import pathlib
import signal
import time

import grpc
from _coordinator_faults import (
    HEARTBEAT_MS,
    OUTAGE_S,
    READY_TIMEOUT_S,
    SESSION_MS,
    SLACK_S,
    TOPIC,
    all_alive,
    create_rf3_topic,
    wait_for,
)
from _isolation_procs import ProcCluster

from dmq.broker.node import COORDINATOR_RECONNECT_BACKOFF_MAX_MS
from dmq.client import AdminClient
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import records


class AcksAllProbe:
    """One acks=all Produce per partition to its leader, each with a short deadline: which
    partitions acknowledge now (for the report only: fixing it needs a live controller)."""

    def __init__(self, leaders: dict[int, str]) -> None:
        self._channels = {p: grpc.insecure_channel(a) for p, a in leaders.items()}

    def acknowledged(self, timeout_s: float) -> dict[int, bool]:
        acked = {}
        for p, channel in self._channels.items():
            try:
                pb_grpc.BrokerStub(channel).Produce(pb.ProduceRequest(
                    topic=TOPIC, partition=p, batch=records.encode([b"probe"]), acks=pb.ACKS_ALL), timeout=timeout_s)
                acked[p] = True
            except grpc.RpcError:
                acked[p] = False
        return acked

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()


def test_a_broker_that_died_while_the_coordinator_was_down_is_failed_over(tmp_path: pathlib.Path) -> None:
    with ProcCluster(tmp_path, brokers=3, broker_session_timeout_ms=SESSION_MS) as cluster:
        create_rf3_topic(cluster)
        with AdminClient(cluster.bootstrap) as admin:
            partitions = admin.describe_topic(TOPIC).partitions
        victim = partitions[0].leader_id
        led = {p.partition for p in partitions if p.leader_id == victim}
        probe = AcksAllProbe({p.partition: p.leader_address for p in partitions if p.leader_id != victim})
        try:
            cluster.kill_coordinator()
            cluster.signal_broker(victim, signal.SIGKILL)
            cluster.brokers[victim].wait(10)
            # The second finding, measured (not fixed here: it needs a live controller to
            # shrink the in-sync sets): with the coordinator down and one broker dead, the other
            # leaders' acks=all produce waits for the dead replica.
            during = probe.acknowledged(timeout_s=2.0)
            print(f"\nacks=all produce while the coordinator is down and broker {victim} is dead: "
                  f"acknowledged on {sum(during.values())} of {len(during)} partitions led by live brokers (2 s deadline)")
        finally:
            probe.close()
        cluster.start_coordinator()  # same port; returns once it listens
        back = time.monotonic()
        # The session the coordinator gives it from its start, the survivors' re-registration (they
        # must be live to lead), the election and its push, and the polling admin calls.
        bound_s = SESSION_MS / 1000 + SLACK_S + 1.0
        with AdminClient(cluster.bootstrap) as admin:
            def failed_over() -> bool:
                try:
                    now = {p.partition: p for p in admin.describe_topic(TOPIC).partitions}
                except Exception:  # noqa: BLE001 - still starting
                    return False
                return all(now[p].leader_id != victim and now[p].leader_alive and victim not in now[p].isr
                           for p in led)

            try:
                wait_for(failed_over, bound_s, f"new leader for broker {victim}'s partitions {sorted(led)}")
            finally:
                print(f"partitions after the restart: {admin.describe_topic(TOPIC).partitions}")
        took_s = time.monotonic() - back
        print(f"broker {victim} (SIGKILLed while the coordinator was down) failed over {took_s:.2f}s after the "
              f"coordinator was back (session {SESSION_MS} ms, bound {bound_s:.1f}s)")


def test_brokers_reregister_within_a_second_of_the_coordinator_coming_back(tmp_path: pathlib.Path) -> None:
    with ProcCluster(tmp_path, brokers=3, broker_session_timeout_ms=SESSION_MS) as cluster:
        with AdminClient(cluster.bootstrap) as admin:
            wait_for(lambda: all_alive(admin, {0, 1, 2}), READY_TIMEOUT_S, "three live brokers")
        cluster.kill_coordinator()
        time.sleep(OUTAGE_S)  # the fault itself (an outage this long), not a wait for readiness
        cluster.start_coordinator()
        back = time.monotonic()
        # The channel's next attempt (cap + 20% jitter), then the heartbeat that learns it must
        # re-register, and its registration.
        bound_s = COORDINATOR_RECONNECT_BACKOFF_MAX_MS * 1.2 / 1000 + HEARTBEAT_MS / 1000 + SLACK_S
        with AdminClient(cluster.bootstrap) as admin:
            wait_for(lambda: all_alive(admin, {0, 1, 2}), bound_s + 20.0, "three re-registered brokers")
        took_s = time.monotonic() - back
        print(f"\nall brokers re-registered {took_s:.2f}s after the coordinator was back from a {OUTAGE_S:.0f}s "
              f"outage (bound {bound_s:.1f}s)")
        assert took_s <= bound_s, f"brokers re-registered {took_s:.2f}s after the coordinator was back (bound {bound_s:.1f}s)"
