"""Shared by the coordinator fault tests (test_coordinator_*.py): a short broker session so each
test stays short, and waits on conditions with deadlines."""

from __future__ import annotations

import functools

from _isolation_procs import ProcCluster

from dmq.client import AdminClient
from tests import polling

TOPIC = "ctl"
PARTITIONS = 3
SESSION_MS = 2_000
HEARTBEAT_MS = SESSION_MS // 4  # what the coordinator tells brokers (BrokerMembership.heartbeat_interval_ms)
READY_TIMEOUT_S = 30.0
# Slack for a loaded 2-core machine: the admin calls that poll, process scheduling.
SLACK_S = 2.0
# Long enough for gRPC's default reconnect backoff to have grown past several seconds (attempts
# about 1, 2.6, 5.2 and 9.3 s after the first failure, each +-20%).
OUTAGE_S = 8.0


# (predicate, timeout_s, what) -> seconds until predicate() held; AssertionError after timeout_s
wait_for = functools.partial(polling.seconds_until, poll_s=0.05)


def all_alive(admin: AdminClient, ids: set[int]) -> bool:
    try:
        return ids <= {b.broker_id for b in admin.list_brokers() if b.alive}
    except Exception:  # noqa: BLE001 - the coordinator is still starting: not yet
        return False


def create_rf3_topic(cluster: ProcCluster) -> None:
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic(TOPIC, PARTITIONS, {"replication_factor": 3})
        wait_for(lambda: all(len(p.isr) == 3 and p.leader_alive for p in admin.describe_topic(TOPIC).partitions),
                 READY_TIMEOUT_S, "a fully in-sync topic")
