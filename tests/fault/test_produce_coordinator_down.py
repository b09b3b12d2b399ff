"""Produce needs no coordinator (issue 28 item 5), over real processes: a `dmq coordinator` and a
`dmq broker`; the coordinator is SIGKILLed and stays down.

A producer whose cached metadata is stale (as after any leader change it noticed) still sends
to the leader it knows. Before the fix its sender asked the coordinator for the leader before
every batch of a stale topic and, the coordinator being down, retried until the delivery
timeout: found by the HA fault test (test_coordinator_ha.py), where every partition's
acknowledgements paused until a standby took over whenever the coordinator died just after a
leader change.
"""

from __future__ import annotations

import pathlib

from _isolation_procs import ProcCluster

from dmq.client import AdminClient, Producer

TOPIC = "pdown"
WAIT_S = 30.0


def test_a_producer_with_stale_metadata_keeps_producing_while_the_coordinator_is_down(tmp_path: pathlib.Path) -> None:
    with ProcCluster(tmp_path, brokers=1) as cluster:
        with AdminClient(cluster.bootstrap) as admin:
            admin.create_topic(TOPIC, 2)
        with Producer(cluster.bootstrap, acks="all", enable_idempotence=True, request_timeout_ms=5_000,
                      delivery_timeout_ms=10_000) as producer:
            before = [producer.send(TOPIC, b"before", partition=p).get(WAIT_S) for p in (0, 1)]
            cluster.kill_coordinator()
            # What a NOT_LEADER answer or a metadata error does to the cache (the public way to
            # get there needs a leader change, which needs the coordinator this test takes away).
            producer._cluster.invalidate(TOPIC)  # noqa: SLF001
            after = [producer.send(TOPIC, b"after", partition=p).get(WAIT_S) for p in (0, 1)]
    assert [m.offset for m in after] == [m.offset + 1 for m in before], (before, after)
