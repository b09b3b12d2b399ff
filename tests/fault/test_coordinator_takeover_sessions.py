"""A takeover from a paused active coordinator expires nobody (issue 28 items 3 and 4), over real
processes: two `dmq coordinator`s on a real etcd (lease TTL 2 s, broker session 2 s), a
`dmq broker` given both addresses, and a group member (a DMQConsumer given both, session 3 s).

The active coordinator is paused (SIGSTOP) until a full broker and member session has passed
since the standby took over. The new active one gives the broker and the member one session from
its start to be heard; both must find it in time, so it expires neither.

Found by the HA fault test (test_coordinator_ha.py), each failing here before its fix:
  - the broker's heartbeat to the paused coordinator waited for the 5 s RPC deadline before it
    looked for another, longer than the session the new one gives: it declared the live broker
    dead ("broker did not re-register after the coordinator started") and moved its leaderships;
  - the member's heartbeats and group watch stayed at the coordinator that was active when it
    joined, whatever answered: the new active one never heard from it and removed it after one
    session ("member removed: session_timeout"); it re-joined with a new id and its partitions
    were handed over again;
  - a commit sent while the active coordinator was paused went unanswered until the client's
    deadline: the broker's ownership check in flight to the paused coordinator was cancelled when
    its link moved to another coordinator (closing the old channel), and a cancelled call raises
    CancelledError in the handler awaiting it, which then never answers;
  - a client's calls that timed out at the paused coordinator stayed there (only a refused
    connection or a NOT_COORDINATOR answer moved them): the admin client here asked the paused
    one again and again until it resumed.
"""

from __future__ import annotations

import pathlib
import signal
import time
from collections.abc import Callable
from typing import TypeVar

from _ha_procs import HaCluster

from dmq.client import AdminClient, DMQConsumer, Producer
from dmq.client.errors import DMQError
from dmq.proto.names import group_id_for

TOPIC = "takeover"
LEASE_TTL_S = 2
SESSION_MS = 2_000
MEMBER_SESSION_MS = 3_000
WAIT_S = 30.0
# The broker's ownership check gives up on the paused coordinator after 5 s (its RPC deadline);
# the client's retry then reaches the new active one through the broker's link.
COMMIT_TIMEOUT_S = 15.0
T = TypeVar("T")


def wait_for(predicate: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:.0f}s"
        time.sleep(0.05)  # polling a condition under a deadline


def retried(call: Callable[[], T]) -> T:
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            return call()
        except DMQError:
            if time.monotonic() > deadline:
                raise


def test_a_takeover_from_a_paused_coordinator_keeps_the_broker_and_the_member(
    tmp_path: pathlib.Path, etcd_url: str
) -> None:
    with HaCluster(
        tmp_path, etcd_url, coordinators=2, brokers=1,
        coordinator_args=["--lease-ttl-s", str(LEASE_TTL_S), "--broker-session-timeout-ms", str(SESSION_MS)],
        broker_args=[],
    ) as cluster, AdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=2_000) as admin:
        def broker_alive() -> bool:
            try:
                return any(b.alive for b in admin.list_brokers())
            except DMQError:  # no coordinator active yet
                return False

        wait_for(broker_alive, WAIT_S, "live broker")
        admin.create_topic(TOPIC, 2)
        with Producer(bootstrap_servers=cluster.bootstrap) as producer, DMQConsumer(
            bootstrap_servers=cluster.bootstrap, group_id="app", auto_offset_reset="earliest",
            session_timeout_ms=MEMBER_SESSION_MS, heartbeat_interval_ms=500,
        ) as consumer:
            producer.send(TOPIC, b"before", partition=0).get(WAIT_S)
            consumer.subscribe(TOPIC)
            wait_for(lambda: any(r.value == b"before" for r in consumer.poll(timeout_ms=200)), WAIT_S, "record read")
            group = admin.describe_group(group_id_for(TOPIC, "app"))
            old = cluster.active()
            assert old is not None
            old.signal(signal.SIGSTOP)
            try:
                # A commit while the active coordinator is paused: the broker's ownership check
                # waits for it, then (a standby having taken over) is asked again and passes.
                producer.send(TOPIC, b"during", partition=0).get(WAIT_S)
                wait_for(lambda: any(r.value == b"during" for r in consumer.poll(timeout_ms=200)), WAIT_S, "record read")
                consumer.commit_sync(timeout=COMMIT_TIMEOUT_S)
                new = next(c for c in cluster.coordinators if c is not old)
                wait_for(lambda: (new.epoch() or 0) > (old.epoch() or 0), WAIT_S, "takeover")
                took_over = time.monotonic()
                # The observation window (the fault itself): a full member session, which is
                # longer than the broker's, after the takeover, with the member polling.
                while time.monotonic() < took_over + MEMBER_SESSION_MS / 1000 + 1.0:
                    consumer.poll(timeout_ms=100)
                # The admin client's first call may go to the paused coordinator and time out;
                # it then asks the next one.
                after = retried(lambda: admin.describe_group(group_id_for(TOPIC, "app")))
                alive = retried(lambda: [b.broker_id for b in admin.list_brokers() if b.alive])
            finally:
                old.signal(signal.SIGCONT)
        log = new.log()
        print(f"\ngroup before the pause: generation {group.generation}, members {[m.member_id for m in group.members]}; "
              f"after the takeover: generation {after.generation}, members {[m.member_id for m in after.members]}; "
              f"live brokers {alive}")
        assert "broker did not re-register" not in log and "broker session expired" not in log, log[-3000:]
        assert alive == [0]
        assert "member removed" not in log, log[-3000:]
        assert [m.member_id for m in after.members] == [m.member_id for m in group.members]
        assert after.generation == group.generation
