"""The client's call shapes (dmq.client._calls) over real gRPC servers on loopback, one test each:

  - call_coordinator: asks again while the coordinator answers UNAVAILABLE itself, and fails at
    once when nothing listens at its address;
  - call_leader: a leader that moved (a cached address where no broker listens any more) is
    looked up again and the call lands at the real leader (EventStore and QueueConsumer);
  - fan_out_by_leader: ListOffsets for partitions on three brokers, one with a stale leader,
    answers every partition.

A stale leader is made by writing an address that refuses connections (a socket bound by the OS
and never listening, held for the test) into a Cluster's metadata cache, which is what the cache
holds after a leader moved or its broker died.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from dmq.client import AdminClient, Producer
from dmq.client._cluster import Cluster
from dmq.client.cli.runner import ClusterThread
from dmq.client.errors import BrokerUnavailableError, CoordinatorUnavailableError, DMQError
from dmq.client.events import Event, EventStore
from dmq.client.queue import QueueConsumer
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc

WAIT_S = 15.0


@pytest.fixture
def dead_address() -> Iterator[str]:
    """A loopback address that refuses connections: bound (so no one else gets the port), never
    listening."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{s.getsockname()[1]}"


def _make_leader_stale(cluster: Cluster, topic: str, partition: int, address: str) -> None:
    """The cache as it is after `partition`'s leader moved away from `address`: private state,
    set the way a refresh sets it."""
    md = cluster.topic_metadata(topic)
    parts = list(md.partitions)
    parts[partition] = dataclasses.replace(parts[partition], leader_address=address)
    cluster._topics[topic] = dataclasses.replace(md, partitions=tuple(parts))
    assert cluster.leader_for(topic, partition) == address


class _StartingCoordinator(pb_grpc.MetadataServicer):
    """A coordinator that answers UNAVAILABLE itself (as while it loads its store) `refusals` times."""

    def __init__(self, refusals: int) -> None:
        self._lock = threading.Lock()
        self.refusals = refusals
        self.calls = 0

    def ListTopics(self, request: pb.ListTopicsRequest, context: grpc.ServicerContext) -> pb.ListTopicsResponse:
        with self._lock:
            self.calls += 1
            refuse = self.calls <= self.refusals
        if refuse:
            context.abort(grpc.StatusCode.UNAVAILABLE, "coordinator starting: metadata not loaded yet")
        return pb.ListTopicsResponse(topics=[pb.TopicInfo(name="t", partition_count=1)])


@pytest.fixture
def starting_coordinator() -> Iterator[tuple[str, _StartingCoordinator]]:
    servicer = _StartingCoordinator(refusals=3)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_MetadataServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        server.stop(None).wait()


def test_call_coordinator_asks_again_while_the_coordinator_is_unavailable(
    starting_coordinator: tuple[str, _StartingCoordinator],
) -> None:
    address, servicer = starting_coordinator
    with AdminClient(address, request_timeout_ms=int(WAIT_S * 1000)) as admin:
        topics = admin.list_topics()
    assert [t.name for t in topics] == ["t"]
    assert servicer.calls == 4  # three refusals, then the answer


def test_call_coordinator_fails_at_once_when_nothing_listens(
    dead_address: str, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="dmq.client")
    with AdminClient(dead_address, request_timeout_ms=int(WAIT_S * 1000)) as admin, \
            pytest.raises(DMQError) as raised:
        admin.list_topics()
    assert isinstance(raised.value, (CoordinatorUnavailableError, BrokerUnavailableError)), raised.value
    assert dead_address in str(raised.value)
    assert not [r for r in caplog.records if "retrying" in r.getMessage()], "a refused connection was retried"


def test_call_leader_follows_a_moved_leader(cluster: ClusterThread, dead_address: str) -> None:
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("es", 1, config={"kind": "event-store"})
        admin.create_topic("jobs", 1)
    with Cluster(cluster.bootstrap, request_timeout_ms=int(WAIT_S * 1000)) as shared:
        # EventStore: a read (retried) at a leader that moved.
        store = EventStore(topic="es", cluster=shared)
        position = store.append(Event("opened", payload=b"{}"))
        _make_leader_stale(shared, "es", 0, dead_address)
        assert [e.position for e in store.read()] == [position]
        assert shared.leader_for("es", 0) != dead_address  # looked up again
        store.close()

        # QueueConsumer: an ack on a lease whose partition's leader moved after the pop.
        with Producer(cluster.bootstrap, linger_ms=0) as producer:
            producer.send("jobs", b"job-1")
            producer.flush(WAIT_S)
        with QueueConsumer(None, "jobs", "workers", cluster=shared) as worker:
            lease = worker.pop(timeout=WAIT_S)
            assert lease is not None and [r.value for r in lease.records] == [b"job-1"]
            _make_leader_stale(shared, "jobs", 0, dead_address)
            worker.ack(lease)
            assert shared.leader_for("jobs", 0) != dead_address
            assert worker.pop(timeout=0) is None  # acknowledged: nothing is handed out again


def test_fan_out_by_leader_answers_every_partition_when_one_leader_is_stale(
    cluster3: ClusterThread, dead_address: str,
) -> None:
    with AdminClient(cluster3.bootstrap, request_timeout_ms=int(WAIT_S * 1000)) as admin:
        admin.create_topic("spread", 3)
        leaders = {p.partition: p.leader_id for p in admin.describe_topic("spread").partitions}
        assert len(set(leaders.values())) == 3, f"expected one partition per broker, got {leaders}"
        with Producer(cluster3.bootstrap, linger_ms=0) as producer:
            for partition in range(3):
                for _ in range(partition + 1):
                    producer.send("spread", b"x", partition=partition)
            producer.flush(WAIT_S)
        _make_leader_stale(admin.cluster, "spread", 1, dead_address)
        got = admin.list_partition_offsets({("spread", p): "latest" for p in range(3)})
        assert {tp: info.offset for tp, info in got.items()} == {("spread", 0): 1, ("spread", 1): 2, ("spread", 2): 3}
        assert admin.cluster.leader_for("spread", 1) != dead_address
