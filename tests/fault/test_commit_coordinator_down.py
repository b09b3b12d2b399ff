"""A commit while the coordinator is down names the coordinator, not the healthy broker (a real
`dmq coordinator` process, SIGKILLed). The broker cannot check the committing member's ownership,
so the commit fails; the error says the coordinator at its address is unreachable."""

from __future__ import annotations

import pathlib
import time

import pytest
from _isolation_procs import ProcCluster

from dmq.client import AdminClient, Producer
from dmq.client.consumer import DMQConsumer
from dmq.client.errors import DMQError

READY_TIMEOUT_S = 30.0


def test_a_commit_during_a_coordinator_outage_names_the_coordinator(tmp_path: pathlib.Path) -> None:
    with ProcCluster(tmp_path, brokers=1) as cluster:
        with AdminClient(cluster.bootstrap) as admin:
            admin.create_topic("cdown", 1)
        with Producer(cluster.bootstrap) as producer:
            producer.send("cdown", b"r").get(timeout=READY_TIMEOUT_S)
        consumer = DMQConsumer(metadata_service_url=cluster.bootstrap, group_id="cdown-app",
                               enable_auto_commit=False, fetch_max_wait_ms=200)
        try:
            consumer.subscribe("cdown")
            deadline = time.monotonic() + READY_TIMEOUT_S
            got: list = []  # type: ignore[type-arg]
            while not got:
                assert time.monotonic() < deadline, "the record was not consumed"
                got.extend(consumer.poll(200))
            cluster.kill_coordinator()
            with pytest.raises(DMQError) as refused:
                consumer.commit_sync({(got[0].topic, got[0].partition): got[0].offset + 1}, timeout=3.0)
        finally:
            consumer.close(timeout=2.0)
    message = str(refused.value)
    assert f"the group coordinator at {cluster.bootstrap} is unreachable" in message, message
    assert "nothing was committed" in message, message
