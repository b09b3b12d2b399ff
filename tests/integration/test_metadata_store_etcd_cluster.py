"""The etcd metadata store on a real three-member etcd cluster (three processes): the URL lists the
members, and a store whose member is killed (SIGKILL) goes on through another."""

from __future__ import annotations

import pathlib
import socket
import time

import pytest

from dmq.coordinator.metastore.base import BrokerRecord, PartitionRecord, TopicRecord
from dmq.coordinator.metastore.config import make_metadata_store
from tests.etcd_server import healthy, running_etcd_cluster

pytestmark = pytest.mark.processes  # left out of `make check`

QUORUM_TIMEOUT_S = 30.0


async def test_a_killed_member_is_failed_over(tmp_path: pathlib.Path) -> None:
    with running_etcd_cluster(tmp_path, 3) as members:
        with socket.socket() as closed:  # a bound port nobody listens on: the first endpoint is down at open
            closed.bind(("127.0.0.1", 0))
            endpoints = [f"127.0.0.1:{closed.getsockname()[1]}", *(m.endpoint for m in members)]
            store = make_metadata_store(f"etcd://{','.join(endpoints)}/ha", tmp_path)
            await store.open()
        try:
            await store.create_topic(TopicRecord("t", 1, {}, states={0: PartitionRecord((1, 2), (1, 2), 1)}))
            await store.upsert_broker(BrokerRecord(1, "h", 1, 1))
            await store.load_topics()
            members[0].process.kill()  # the member the store uses: the first that answered
            members[0].process.wait(10)
            # The two left elect a leader among themselves; the store is still on the dead one.
            deadline = time.monotonic() + QUORUM_TIMEOUT_S
            while not all(healthy(m.client_port, None) for m in members[1:]):
                assert time.monotonic() < deadline, "the two remaining etcd members did not elect a leader"
                time.sleep(0.05)  # polling a condition (their health) under a deadline
            await store.upsert_broker(BrokerRecord(2, "h", 2, 2))
            await store.update_partitions({("t", 0): PartitionRecord((1, 2), (2,), 2, 1, 1)})  # a CAS write too
            assert [b.broker_id for b in await store.load_brokers()] == [1, 2]
            assert (await store.load_topics())[0].states[0] == PartitionRecord((1, 2), (2,), 2, 1, 1)
        finally:
            await store.close()
