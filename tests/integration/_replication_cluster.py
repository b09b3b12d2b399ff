"""Three real brokers on loopback with the test as their controller (issue 15, broker side).

The brokers register with a small in-test Metadata servicer (a real gRPC server) that plays the
controller's part the broker side needs: it answers RegisterBroker with the CreatePartitions it
holds for the broker (states included, so a restarted broker learns its role again), accepts
AlterIsr when the epochs match (bumping partition_epoch, as the controller does) and records
every call. The test creates partitions and changes leaders by calling the brokers'
CreatePartitions / UpdatePartitionStates itself, as the controller would.
"""

from __future__ import annotations

import asyncio
import pathlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import pytest

from dmq.broker.log import LogConfig
from dmq.broker.node import BrokerNode
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import records


class TestController(pb_grpc.MetadataServicer):
    """The controller's side of the broker protocol, as far as the brokers call it."""

    __test__ = False

    def __init__(self) -> None:
        self.creates: dict[int, dict[tuple[str, int], pb.CreatePartitionsRequest]] = {}
        self.states: dict[tuple[str, int], pb.PartitionState] = {}
        self.alter_calls: list[pb.AlterIsrRequest] = []
        self.shutting_down: list[int] = []  # brokers whose heartbeat said so

    async def RegisterBroker(self, request, context):  # noqa: N802 - gRPC method name
        held = self.creates.get(request.broker_id, {})
        out = []
        for (topic, partition), create in held.items():
            c = pb.CreatePartitionsRequest()
            c.CopyFrom(create)
            del c.states[:]
            c.states.append(self.states[(topic, partition)])
            out.append(c)
        return pb.RegisterBrokerResponse(partitions=out, heartbeat_interval_ms=200)

    async def BrokerHeartbeat(self, request, context):  # noqa: N802
        if request.shutting_down:
            self.shutting_down.append(request.broker_id)
        return pb.BrokerHeartbeatResponse(acl_version=0)

    async def ListAcls(self, request, context):  # noqa: N802
        return pb.ListAclsResponse(version=0)

    async def GetMetadata(self, request, context):  # noqa: N802
        """What clients learn leaders from: the states as this controller holds them."""
        topics: dict[str, list[pb.PartitionState]] = {}
        for (topic, _), st in sorted(self.states.items()):
            if not request.topics or topic in request.topics:
                topics.setdefault(topic, []).append(st)
        return pb.GetMetadataResponse(topics=[
            pb.TopicInfo(name=name, partition_count=len(states), partitions=[
                pb.PartitionInfo(partition=st.partition, leader_id=st.leader_id, leader_address=st.leader_address,
                                 leader_alive=True, replicas=st.replicas, isr=st.isr, leader_epoch=st.leader_epoch)
                for st in states])
            for name, states in topics.items()])

    async def AlterIsr(self, request, context):  # noqa: N802
        self.alter_calls.append(request)
        key = (request.topic, request.partition)
        st = self.states[key]
        if (request.leader_epoch, request.partition_epoch) != (st.leader_epoch, st.partition_epoch):
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "stale epoch")
        if st.leader_id not in request.isr or not set(request.isr) <= set(st.replicas):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad isr")
        new = pb.PartitionState()
        new.CopyFrom(st)
        del new.isr[:]
        new.isr.extend(request.isr)
        new.partition_epoch += 1
        self.states[key] = new
        return pb.AlterIsrResponse(state=new)

    def isr_proposals(self) -> list[list[int]]:
        return [sorted(c.isr) for c in self.alter_calls]


class Broker:
    def __init__(self, node: BrokerNode, server: grpc.aio.Server, channel: grpc.aio.Channel) -> None:
        self.node = node
        self.server = server
        self.channel = channel
        self.stub = pb_grpc.BrokerStub(channel)

    @property
    def id(self) -> int:
        return self.node.broker_id

    @property
    def address(self) -> str:
        return self.node.address


class ReplicationCluster:
    def __init__(self, root: pathlib.Path, *, brokers: int = 3, lag_ms: int = 10_000, ack_timeout_ms: int = 5_000) -> None:
        self.root = root
        self.n = brokers
        self.lag_ms = lag_ms
        self.ack_timeout_ms = ack_timeout_ms
        self.controller = TestController()
        self.brokers: dict[int, Broker] = {}
        self._server: grpc.aio.Server | None = None
        self.controller_address = ""

    async def start(self) -> None:
        self._server = grpc.aio.server()
        pb_grpc.add_MetadataServicer_to_server(self.controller, self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        self.controller_address = f"127.0.0.1:{port}"
        await self._server.start()
        for i in range(1, self.n + 1):
            await self.start_broker(i)

    async def start_broker(self, broker_id: int) -> Broker:
        server = grpc.aio.server()
        port = server.add_insecure_port("127.0.0.1:0")
        node = BrokerNode(
            self.root / f"b{broker_id}", broker_id=broker_id, coordinator_address=self.controller_address,
            advertised_host="127.0.0.1", advertised_port=port, log_config=LogConfig(),
            replica_lag_time_max_ms=self.lag_ms, replica_ack_timeout_ms=self.ack_timeout_ms,
        )
        node.add_to_server(server)
        await server.start()
        await node.start()
        b = Broker(node, server, grpc.aio.insecure_channel(f"127.0.0.1:{port}"))
        self.brokers[broker_id] = b
        return b

    async def stop_broker(self, broker_id: int) -> None:
        b = self.brokers.pop(broker_id)
        await b.channel.close(None)
        await b.node.stop()
        await b.server.stop(None)

    async def close(self) -> None:
        for i in list(self.brokers):
            await self.stop_broker(i)
        if self._server is not None:
            await self._server.stop(None)

    # -- the controller's calls ---------------------------------------------------------------------

    def state(self, topic: str, partition: int, leader: int, epoch: int, replicas: list[int], isr: list[int],
              partition_epoch: int) -> pb.PartitionState:
        address = self.brokers[leader].address if leader in self.brokers else "127.0.0.1:1"
        return pb.PartitionState(topic=topic, partition=partition, leader_id=leader, leader_address=address,
                                 leader_epoch=epoch, replicas=replicas, isr=isr, partition_epoch=partition_epoch)

    async def create(self, topic: str, replicas: list[int], config: pb.TopicConfig | None = None) -> None:
        """One partition (0) led by replicas[0] at epoch 0, every replica in sync."""
        st = self.state(topic, 0, replicas[0], 0, replicas, replicas, 0)
        self.controller.states[(topic, 0)] = st
        request = pb.CreatePartitionsRequest(topic=topic, partitions=[0], config=config or pb.TopicConfig(),
                                             topic_partition_count=1, states=[st])
        for r in replicas:
            self.controller.creates.setdefault(r, {})[(topic, 0)] = request
            await self.brokers[r].stub.CreatePartitions(request, timeout=10)

    async def push(self, state: pb.PartitionState, to: list[int]) -> None:
        """UpdatePartitionStates to the brokers `to`; the controller's record follows."""
        self.controller.states[(state.topic, state.partition)] = state
        for b in to:
            answer = await self.brokers[b].stub.UpdatePartitionStates(
                pb.UpdatePartitionStatesRequest(states=[state]), timeout=10)
            assert not answer.errors, answer.errors

    # -- looking -----------------------------------------------------------------------------------

    def log_bytes(self, broker_id: int, topic: str, partition: int = 0) -> bytes:
        plog = self.brokers[broker_id].node.logs.get(topic, partition)
        out = bytearray()
        offset = plog.log_start_offset
        while offset < plog.log_end_offset:
            chunk = plog.read(offset, 1 << 20)
            if not chunk:
                break
            out += chunk
            last = list(records.iter_headers(chunk))[-1][1]
            offset = last.base_offset + last.record_count
        return bytes(out)

    def log_end(self, broker_id: int, topic: str, partition: int = 0) -> int:
        return self.brokers[broker_id].node.logs.get(topic, partition).log_end_offset


async def until(check: Callable[[], bool | Awaitable[bool]], timeout_s: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if not isinstance(got, bool):
            got = await got
        if got:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what or check}")
        await asyncio.sleep(0.02)


@pytest.fixture
async def rc(tmp_path: pathlib.Path) -> AsyncIterator[ReplicationCluster]:
    """A started ReplicationCluster with its default settings, closed after the test (import it
    into a test module to use it)."""
    c = ReplicationCluster(tmp_path)
    await c.start()
    yield c
    await c.close()
