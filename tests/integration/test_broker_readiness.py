"""A restarted broker answers nothing from state it has not loaded yet (issue 26, item 1).

Its port is open before its logs and offset store are loaded (the runner starts the server first,
and clients of a restarted broker are already calling). Seen: FetchCommittedOffsets answered OK
with [40, -1, -1, -1] right after a restart, and a resuming consumer went to its reset policy.
Every RPC that reads state loaded at start answers UNAVAILABLE "starting; retry" until it is
loaded (dmq.broker.readiness), then the acknowledged values.

Real servers on loopback: a coordinator and a broker (ClusterThread); the broker is stopped and a
new BrokerNode on its data directory serves its port before (and while) it starts.
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from dmq.broker.node import BrokerNode
from dmq.client import TopicPartition
from dmq.client.aio import AsyncConsumer
from dmq.client.cli.runner import ClusterThread
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import records

TOPIC = "ready"
PARTITIONS = 4
COMMITTED = 40
GROUP = "G_ready_app"
TIMEOUT_S = 10.0
# The controller's own commands: answered while the broker registers (dmq.broker.readiness).
EXEMPT = {"CreatePartitions", "DeletePartitions"}
BROKER_RPCS = pb.DESCRIPTOR.services_by_name["Broker"].methods


class Restarted:
    """A BrokerNode on a stopped broker's data directory, its server started on the cluster's
    loop and the node not (yet) started."""

    def __init__(self, cluster: ClusterThread, data_dir: pathlib.Path) -> None:
        self.cluster = cluster
        self.data_dir = data_dir
        self.node: BrokerNode | None = None
        self.server: grpc.aio.Server | None = None
        self.address = ""

    async def serve(self) -> None:
        self.server = grpc.aio.server()
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.node = BrokerNode(self.data_dir, broker_id=0, coordinator_address=self.cluster.bootstrap,
                               advertised_host="127.0.0.1", advertised_port=port)
        self.node.add_to_server(self.server)
        await self.server.start()
        self.address = f"127.0.0.1:{port}"

    async def start(self) -> None:
        assert self.node is not None
        await self.node.start()

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0)
        if self.node is not None:
            await self.node.stop()


@pytest.fixture
def restarted(cluster_factory: Callable[..., ClusterThread], tmp_path: pathlib.Path) -> Iterator[Restarted]:
    """Commits of COMMITTED on every partition, then the broker stopped and a new node serving."""
    # A short broker session: the new node registers under the old one's id at a new address.
    cluster = cluster_factory(data_dir=tmp_path / "c", shared_port=False, broker_session_timeout_ms=1000)
    with grpc.insecure_channel(cluster.bootstrap) as channel:
        pb_grpc.MetadataStub(channel).CreateTopic(pb.CreateTopicRequest(name=TOPIC, partitions=PARTITIONS),
                                                  timeout=TIMEOUT_S)
        found = pb_grpc.GroupCoordinatorStub(channel).FindOrCreateGroup(
            pb.FindOrCreateGroupRequest(topic=TOPIC, app_id="app"), timeout=TIMEOUT_S)
        assert found.group_id == GROUP
    broker_address = cluster.cluster.brokers[0].address
    with grpc.insecure_channel(broker_address) as channel:
        broker = pb_grpc.BrokerStub(channel)
        for p in range(PARTITIONS):
            batch = records.encode([b"v"] * COMMITTED)
            broker.Produce(pb.ProduceRequest(topic=TOPIC, partition=p, batch=batch), timeout=TIMEOUT_S)
        # An operator's commit (no member id): accepted while the group has no members.
        broker.CommitOffsets(pb.CommitOffsetsRequest(group_id=GROUP, generation=-1, offsets=[
            pb.PartitionOffset(topic=TOPIC, partition=p, offset=COMMITTED) for p in range(PARTITIONS)]),
            timeout=TIMEOUT_S)
    cluster.call(cluster.cluster.stop_broker(0))
    node = Restarted(cluster, tmp_path / "c" / "broker-0")
    cluster.call(node.serve())
    try:
        yield node
    finally:
        cluster.call(node.stop())


def _committed(stub: pb_grpc.BrokerStub) -> list[int]:
    answer = stub.FetchCommittedOffsets(pb.FetchCommittedOffsetsRequest(group_id=GROUP, partitions=[
        pb.TopicPartition(topic=TOPIC, partition=p) for p in range(PARTITIONS)]), timeout=TIMEOUT_S)
    return [o.offset for o in answer.offsets]


def _call(channel: grpc.Channel, method: Any) -> grpc.StatusCode:
    """Call a Broker RPC with an empty request; the status it ends with."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    request_class = getattr(pb, method.input_type.name)
    response_class = getattr(pb, method.output_type.name)
    try:
        if method.server_streaming:
            call = channel.unary_stream(path, request_serializer=request_class.SerializeToString,
                                        response_deserializer=response_class.FromString)
            for _ in call(request_class(), timeout=TIMEOUT_S):
                pass
        else:
            channel.unary_unary(path, request_serializer=request_class.SerializeToString,
                                response_deserializer=response_class.FromString)(request_class(), timeout=TIMEOUT_S)
    except grpc.RpcError as e:
        assert e.code() != grpc.StatusCode.UNAVAILABLE or "is starting; retry" in (e.details() or ""), e
        return e.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def test_committed_offsets_are_unavailable_until_loaded_then_the_acknowledged_values(restarted: Restarted) -> None:
    with grpc.insecure_channel(restarted.address) as channel:
        stub = pb_grpc.BrokerStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            _committed(stub)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
        assert refused.value.details() == "broker 0 is starting; retry"
        restarted.cluster.call(restarted.start())
        assert _committed(stub) == [COMMITTED] * PARTITIONS


def test_every_rpc_reading_loaded_state_is_unavailable_while_starting(restarted: Restarted) -> None:
    with grpc.insecure_channel(restarted.address) as channel:
        answered = {m.name: _call(channel, m) for m in BROKER_RPCS if m.name not in EXEMPT}
    assert answered == dict.fromkeys(answered, grpc.StatusCode.UNAVAILABLE)
    assert len(answered) == len(BROKER_RPCS) - len(EXEMPT)


def test_unavailable_while_loading_and_registering(restarted: Restarted) -> None:
    """Between loading and registration (roles not known yet) too: ready is one step at the end."""
    node = restarted.node
    assert node is not None
    loop: asyncio.AbstractEventLoop = restarted.cluster._loop  # noqa: SLF001 - the cluster's own loop
    starting = asyncio.run_coroutine_threadsafe(restarted.start(), loop)
    with grpc.insecure_channel(restarted.address) as channel:
        stub = pb_grpc.BrokerStub(channel)
        while True:
            try:
                offsets = _committed(stub)
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE, e
                assert not starting.done() or starting.exception() is None, starting.exception()
                continue
            assert offsets == [COMMITTED] * PARTITIONS  # never -1, never a missing entry
            break
    starting.result(TIMEOUT_S)


async def _set_ready(node: BrokerNode, ready: bool) -> None:
    node.ready = ready


def test_async_consumer_committed_retries_a_starting_broker(restarted: Restarted,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """The async consumer's committed() retries "starting" as the synchronous one does, within
    request_timeout_ms (it raised BrokerUnavailableError at the first refusal)."""
    cluster, node = restarted.cluster, restarted.node
    assert node is not None
    cluster.call(restarted.start())
    # Registered at its address (clients are sent to it), its state as if still loading.
    cluster.call(_set_ready(node, False))
    caplog.set_level(logging.INFO, logger="dmq.client.aio.consumer")

    async def read() -> int | None:
        async with AsyncConsumer(bootstrap_servers=cluster.bootstrap, group_id="app", retry_backoff_ms=20,
                                 request_timeout_ms=30_000) as consumer:
            reading = asyncio.ensure_future(consumer.committed(TopicPartition(TOPIC, 1)))
            deadline = time.monotonic() + TIMEOUT_S
            while "is starting; retry" not in caplog.text:  # refused once, and retrying
                assert time.monotonic() < deadline and not reading.done(), (reading, caplog.text[-2000:])
                await asyncio.sleep(0.01)
            await asyncio.to_thread(cluster.call, _set_ready(node, True))
            return await reading

    assert asyncio.run(read()) == COMMITTED
