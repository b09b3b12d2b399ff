"""The Metadata gRPC service on a real grpc.aio server, with real SQLite files in tmp_path.

Brokers here are FakeBroker servicers on their own real servers: they record the CreatePartitions /
DeletePartitions calls the coordinator makes and never register by themselves (the tests register
them, which makes the broker's side of the protocol explicit and lets the clock be injected).
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dmq.coordinator import node as node_module
from dmq.coordinator.broker_pool import BrokerPool
from dmq.coordinator.node import CoordinatorNode
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto.grpc_options import channel_options
from dmq.proto.server.grpc_options import server_options
from dmq.proto.topic_settings import PARTITIONS_MAX, TopicSettings
from tests.clocks import ManualClockMs

SESSION_MS = 10_000
T0_MS = 1_700_000_000_000


class FakeBroker(pb_grpc.BrokerServicer):
    """Records the coordinator's internal calls. `hang` makes CreatePartitions wait (bounded)."""

    def __init__(self) -> None:
        self.created: list[pb.CreatePartitionsRequest] = []
        self.deleted: list[pb.DeletePartitionsRequest] = []
        self.hang = False
        self.release = asyncio.Event()
        self.server: grpc.aio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = grpc.aio.server(options=server_options())
        pb_grpc.add_BrokerServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()

    async def stop(self) -> None:
        self.release.set()
        if self.server is not None:
            await self.server.stop(0)

    async def CreatePartitions(self, request, context):  # noqa: N802
        if self.hang:
            await asyncio.wait_for(self.release.wait(), 10)
        self.created.append(request)
        return pb.CreatePartitionsResponse()

    async def DeletePartitions(self, request, context):  # noqa: N802
        self.deleted.append(request)
        return pb.DeletePartitionsResponse()

    def created_partitions(self, topic: str) -> list[int]:
        return sorted(p for r in self.created if r.topic == topic for p in r.partitions)


@dataclass
class Harness:
    data_dir: pathlib.Path
    clock: ManualClockMs = field(default_factory=lambda: ManualClockMs(T0_MS))
    node: CoordinatorNode | None = None
    server: grpc.aio.Server | None = None
    channel: grpc.aio.Channel | None = None
    stub: pb_grpc.MetadataStub | None = None
    brokers: dict[int, FakeBroker] = field(default_factory=dict)
    node_kwargs: dict[str, object] = field(default_factory=dict)

    async def start_coordinator(self, *, start_node: bool = True) -> None:
        self.server = grpc.aio.server(options=server_options())
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.node = CoordinatorNode(
            self.data_dir,
            advertised_address=f"127.0.0.1:{port}",
            broker_session_timeout_ms=SESSION_MS,
            clock_ms=self.clock,
            **self.node_kwargs,  # type: ignore[arg-type]
        )
        self.node.add_to_server(self.server)
        await self.server.start()
        if start_node:
            await self.node.start()
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=channel_options())
        self.stub = pb_grpc.MetadataStub(self.channel)

    async def stop_coordinator(self) -> None:
        if self.channel is not None:
            await self.channel.close()
        if self.server is not None:
            await self.server.stop(0)
        if self.node is not None:
            await self.node.stop()
        self.node = self.server = self.channel = self.stub = None

    async def restart_coordinator(self) -> None:
        await self.stop_coordinator()
        await self.start_coordinator()

    async def add_broker(self, broker_id: int) -> FakeBroker:
        broker = FakeBroker()
        await broker.start()
        self.brokers[broker_id] = broker
        await self.register(broker_id)
        return broker

    async def register(self, broker_id: int) -> pb.RegisterBrokerResponse:
        assert self.stub is not None
        return await self.stub.RegisterBroker(
            pb.RegisterBrokerRequest(broker_id=broker_id, host="127.0.0.1", port=self.brokers[broker_id].port),
            timeout=5,
        )

    async def create(self, name: str, partitions: int, **config: int) -> pb.TopicInfo:
        assert self.stub is not None
        return await self.stub.CreateTopic(
            pb.CreateTopicRequest(name=name, partitions=partitions, config=pb.TopicConfig(**config)), timeout=5
        )

    async def describe(self, name: str) -> pb.TopicInfo:
        assert self.stub is not None
        return await self.stub.DescribeTopic(pb.DescribeTopicRequest(name=name), timeout=5)

    async def close(self) -> None:
        await self.stop_coordinator()
        for broker in self.brokers.values():
            await broker.stop()


@contextlib.asynccontextmanager
async def running_harness(data_dir: pathlib.Path) -> AsyncIterator[Harness]:
    """A Harness with its coordinator started, closed (with its brokers) on leaving."""
    h = Harness(data_dir)
    await h.start_coordinator()
    try:
        yield h
    finally:
        await h.close()


@pytest.fixture
async def harness(tmp_path: pathlib.Path) -> AsyncIterator[Harness]:
    async with running_harness(tmp_path / "coordinator") as h:
        yield h


async def expect_error(call: object, code: grpc.StatusCode, *fragments: str) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    assert info.value.code() == code, info.value.details()
    details = info.value.details() or ""
    for fragment in fragments:
        assert fragment in details, details
    return details


def leaders(info: pb.TopicInfo) -> list[int]:
    return [p.leader_id for p in sorted(info.partitions, key=lambda p: p.partition)]


# -- topics --------------------------------------------------------------------------------------


async def test_create_describe_list_delete(harness: Harness) -> None:
    broker = await harness.add_broker(1)
    info = await harness.create("orders", 3, retention_ms=60_000)

    assert (info.name, info.partition_count, info.created_ms) == ("orders", 3, T0_MS)
    assert [p.partition for p in info.partitions] == [0, 1, 2]
    assert all(p.leader_id == 1 and p.leader_alive for p in info.partitions)
    assert {p.leader_address for p in info.partitions} == {f"127.0.0.1:{broker.port}"}
    assert info.config.retention_ms == 60_000
    assert not info.config.HasField("segment_bytes")  # unset: the broker's default applies
    assert [(r.topic, list(r.partitions), r.config.retention_ms) for r in broker.created] == [
        ("orders", [0, 1, 2], 60_000)
    ]

    assert await harness.describe("orders") == info
    listed = await harness.stub.ListTopics(pb.ListTopicsRequest(), timeout=5)
    assert [t.name for t in listed.topics] == ["orders"]
    md = await harness.stub.GetMetadata(pb.GetMetadataRequest(topics=["orders"]), timeout=5)
    assert [t.name for t in md.topics] == ["orders"]
    assert [(b.broker_id, b.alive, b.partitions_led) for b in md.brokers] == [(1, True, 3)]
    # The in-process view the group coordinator uses.
    record = harness.node.metadata.topic("orders")
    assert record is not None and dict(record.placement) == {0: 1, 1: 1, 2: 1}
    # The replication settings are recorded with the topic: one live broker, so one replica.
    assert record.config == TopicSettings(
        retention_ms=60_000, replication_factor=1, min_insync_replicas=1, unclean_leader_election=False
    )
    assert harness.node.metadata.broker_address(1) == f"127.0.0.1:{broker.port}"

    deleted: list[str] = []
    harness.node.metadata.on_topic_deleted(deleted.append)
    await harness.stub.DeleteTopic(pb.DeleteTopicRequest(name="orders"), timeout=5)
    assert [(r.topic, list(r.partitions)) for r in broker.deleted] == [("orders", [0, 1, 2])]
    assert deleted == ["orders"]
    await expect_error(harness.describe("orders"), grpc.StatusCode.NOT_FOUND, "'orders'")
    await expect_error(
        harness.stub.DeleteTopic(pb.DeleteTopicRequest(name="orders"), timeout=5),
        grpc.StatusCode.NOT_FOUND,
        "'orders'",
    )
    await expect_error(
        harness.stub.GetMetadata(pb.GetMetadataRequest(topics=["orders", "other"]), timeout=5),
        grpc.StatusCode.NOT_FOUND,
        "'orders'",
        "'other'",
    )
    assert harness.node.metadata.topic("orders") is None
    # The name is free again.
    await harness.create("orders", 1)


async def test_create_existing_topic_is_already_exists(harness: Harness) -> None:
    await harness.add_broker(1)
    await harness.create("t", 2)
    await expect_error(harness.create("t", 2), grpc.StatusCode.ALREADY_EXISTS, "'t'")
    assert (await harness.describe("t")).partition_count == 2


@pytest.mark.parametrize(
    ("name", "partitions", "config", "fragments"),
    [
        ("", 1, {}, ["name:", "empty"]),
        ("a b", 1, {}, ["name:", "' '"]),
        ("é", 1, {}, ["name:", "'é'"]),
        (".", 1, {}, ["name:", "'.'"]),
        ("..", 1, {}, ["name:"]),
        ("x" * 250, 1, {}, ["name:", "249"]),
        ("ok", 0, {}, ["partitions:", "between 1 and 10000", "got 0"]),
        ("ok", -5, {}, ["partitions:", "got -5"]),
        ("ok", PARTITIONS_MAX + 1, {}, ["partitions:", "10000"]),
        ("ok", 1, {"retention_ms": -2}, ["config.retention_ms:", "-1"]),
        ("ok", 1, {"segment_bytes": 1}, ["config.segment_bytes:", "1024"]),
        ("ok", 1, {"segment_ms": 0}, ["config.segment_ms:"]),
        ("ok", 1, {"max_message_bytes": 2**31 - 1}, ["config.max_message_bytes:"]),
    ],
)
async def test_create_topic_validation(harness: Harness, name, partitions, config, fragments) -> None:
    await harness.add_broker(1)
    await expect_error(harness.create(name, partitions, **config), grpc.StatusCode.INVALID_ARGUMENT, *fragments)
    assert harness.brokers[1].created == []


async def test_invalid_name_in_describe_and_metadata(harness: Harness) -> None:
    await expect_error(harness.describe("bad/name"), grpc.StatusCode.INVALID_ARGUMENT, "name:")
    await expect_error(
        harness.stub.GetMetadata(pb.GetMetadataRequest(topics=["fine", "bad name"]), timeout=5),
        grpc.StatusCode.INVALID_ARGUMENT,
        "topics[1]:",
    )


async def test_default_topic_config_fills_unset_fields(tmp_path: pathlib.Path) -> None:
    h = Harness(tmp_path / "c", node_kwargs={"default_topic_config": TopicSettings(retention_ms=1000, segment_ms=5000)})
    await h.start_coordinator()
    try:
        await h.add_broker(1)
        info = await h.create("t", 1, retention_ms=2000)
        assert (info.config.retention_ms, info.config.segment_ms) == (2000, 5000)
        assert not info.config.HasField("segment_bytes")
        assert h.brokers[1].created[0].config.segment_ms == 5000
    finally:
        await h.close()


async def test_no_live_brokers(harness: Harness) -> None:
    await expect_error(harness.create("t", 1), grpc.StatusCode.UNAVAILABLE, "no live brokers", "dmq broker")
    await harness.add_broker(1)
    await harness.create("t", 1)
    harness.clock.advance(SESSION_MS + 1)
    await expect_error(harness.create("u", 1), grpc.StatusCode.UNAVAILABLE, "no live brokers")
    await expect_error(
        harness.stub.AddPartitions(pb.AddPartitionsRequest(name="t", partitions=2), timeout=5),
        grpc.StatusCode.UNAVAILABLE,
        "no live brokers",
    )
    assert harness.node.metadata.topic("u") is None
    assert harness.node.metadata.topic("t").partition_count == 1


# -- placement -----------------------------------------------------------------------------------


async def test_round_robin_placement_over_three_brokers_survives_restart(harness: Harness) -> None:
    ids = [7, 3, 11]  # registration order and ids deliberately unsorted
    for broker_id in ids:
        await harness.add_broker(broker_id)
    info = await harness.create("events", 8, replication_factor=1)  # leaders only (replicas: test_replication.py)
    placed = leaders(info)
    ring = sorted(ids)
    start = ring.index(placed[0])
    assert placed == [ring[(start + p) % 3] for p in range(8)]
    for broker_id, broker in harness.brokers.items():
        assert broker.created_partitions("events") == [p for p, b in enumerate(placed) if b == broker_id]

    await harness.restart_coordinator()

    after = await harness.describe("events")
    assert leaders(after) == placed
    assert after.created_ms == info.created_ms
    # Brokers are remembered but not alive until they register with this coordinator process.
    assert not any(p.leader_alive for p in after.partitions)
    listed = await harness.stub.ListBrokers(pb.ListBrokersRequest(), timeout=5)
    assert [(b.broker_id, b.alive, b.port) for b in listed.brokers] == [
        (i, False, harness.brokers[i].port) for i in sorted(ids)
    ]
    assert sum(b.partitions_led for b in listed.brokers) == 8
    beat = await harness.stub.BrokerHeartbeat(pb.BrokerHeartbeatRequest(broker_id=3), timeout=5)
    assert beat.reregister
    for broker_id in ids:
        response = await harness.register(broker_id)
        assert [(r.topic, list(r.partitions)) for r in response.partitions] == [
            ("events", [p for p, b in enumerate(placed) if b == broker_id])
        ]
    assert all(p.leader_alive for p in (await harness.describe("events")).partitions)


async def test_partition_zero_of_different_topics_spreads_over_brokers(harness: Harness) -> None:
    for broker_id in (1, 2, 3):
        await harness.add_broker(broker_id)
    first_leaders = [leaders(await harness.create(f"topic-{i}", 1))[0] for i in range(12)]
    assert set(first_leaders) == {1, 2, 3}


async def test_placement_uses_only_live_brokers(harness: Harness) -> None:
    await harness.add_broker(1)
    await harness.add_broker(2)
    harness.clock.advance(SESSION_MS // 2)
    await harness.stub.BrokerHeartbeat(pb.BrokerHeartbeatRequest(broker_id=2), timeout=5)
    harness.clock.advance(SESSION_MS // 2 + 1)  # broker 1 expired, broker 2 still alive
    info = await harness.create("t", 4)
    assert leaders(info) == [2, 2, 2, 2]


async def test_add_partitions(harness: Harness) -> None:
    b1 = await harness.add_broker(1)
    await harness.create("t", 1)
    b2 = await harness.add_broker(2)
    seen: list[tuple[str, int]] = []

    async def listener(topic: str, count: int) -> None:
        seen.append((topic, count))

    harness.node.metadata.on_partitions_added(listener)
    info = await harness.stub.AddPartitions(pb.AddPartitionsRequest(name="t", partitions=5), timeout=5)
    assert info.partition_count == 5
    placed = leaders(info)
    assert placed[0] == 1  # existing partitions never move
    assert sorted(placed[1:].count(b) for b in (1, 2)) == [2, 2]
    assert b1.created_partitions("t") == [0] + [p for p in range(1, 5) if placed[p] == 1]
    assert b2.created_partitions("t") == [p for p in range(1, 5) if placed[p] == 2]
    assert seen == [("t", 5)]
    assert (await harness.describe("t")) == info

    for bad in (5, 3, 0, PARTITIONS_MAX + 1):
        await expect_error(
            harness.stub.AddPartitions(pb.AddPartitionsRequest(name="t", partitions=bad), timeout=5),
            grpc.StatusCode.INVALID_ARGUMENT,
            "partitions:",
            str(bad),
        )
    await expect_error(
        harness.stub.AddPartitions(pb.AddPartitionsRequest(name="nope", partitions=2), timeout=5),
        grpc.StatusCode.NOT_FOUND,
        "'nope'",
    )
    await harness.restart_coordinator()
    assert leaders(await harness.describe("t")) == placed


# -- brokers ---------------------------------------------------------------------------------------


async def test_broker_liveness_expires_with_the_clock(tmp_path: pathlib.Path) -> None:
    # The node's monitor ends expired sessions on its own ticks (real time, every SESSION_MS / 10):
    # between this test's reads after the clock passes the limit it could run first, and then the
    # explicit expire_brokers() below finds nothing (seen under load). This test drives expiry by
    # hand, so its monitor waits an hour.
    harness = Harness(tmp_path / "coordinator", node_kwargs={"liveness_check_interval_ms": 3_600_000})
    await harness.start_coordinator()
    try:
        await _liveness_expires_with_the_clock(harness)
    finally:
        await harness.close()


async def _liveness_expires_with_the_clock(harness: Harness) -> None:
    await harness.add_broker(1)
    await harness.create("t", 1)
    harness.clock.advance(SESSION_MS)
    assert (await harness.describe("t")).partitions[0].leader_alive  # exactly at the limit: alive
    beat = await harness.stub.BrokerHeartbeat(pb.BrokerHeartbeatRequest(broker_id=1), timeout=5)
    assert not beat.reregister
    harness.clock.advance(SESSION_MS)
    assert harness.node.metadata.is_broker_alive(1)
    harness.clock.advance(1)

    assert not (await harness.describe("t")).partitions[0].leader_alive
    listed = await harness.stub.ListBrokers(pb.ListBrokersRequest(), timeout=5)
    assert [(b.broker_id, b.alive, b.last_heartbeat_ms) for b in listed.brokers] == [(1, False, T0_MS + SESSION_MS)]
    assert harness.node.metadata.membership.expire_brokers() == [1]
    assert harness.node.metadata.membership.expire_brokers() == []
    beat = await harness.stub.BrokerHeartbeat(pb.BrokerHeartbeatRequest(broker_id=1), timeout=5)
    assert beat.reregister
    response = await harness.register(1)
    assert [list(r.partitions) for r in response.partitions] == [[0]]
    assert (await harness.describe("t")).partitions[0].leader_alive


async def test_heartbeat_from_unknown_broker_asks_to_reregister(harness: Harness) -> None:
    beat = await harness.stub.BrokerHeartbeat(pb.BrokerHeartbeatRequest(broker_id=42), timeout=5)
    assert beat.reregister


async def test_registration_returns_every_partition_placed_on_the_broker(harness: Harness) -> None:
    await harness.add_broker(1)
    await harness.add_broker(2)
    await harness.create("a", 4, segment_bytes=1 << 20, replication_factor=1)
    await harness.create("b", 3, replication_factor=1)
    placed_a = leaders(await harness.describe("a"))
    placed_b = leaders(await harness.describe("b"))

    response = await harness.register(2)
    assert response.heartbeat_interval_ms == SESSION_MS // 4
    by_topic = {r.topic: r for r in response.partitions}
    assert list(by_topic["a"].partitions) == [p for p, b in enumerate(placed_a) if b == 2]
    assert by_topic["a"].config.segment_bytes == 1 << 20
    assert list(by_topic.get("b", pb.CreatePartitionsRequest()).partitions) == [
        p for p, b in enumerate(placed_b) if b == 2
    ]


async def test_broker_moving_to_a_new_address(harness: Harness) -> None:
    old = await harness.add_broker(1)
    await harness.create("t", 1)
    new = FakeBroker()
    await new.start()
    harness.brokers[1] = new
    try:
        # While the old registration is live the id is not moved (issue 18: a stray or hostile
        # RegisterBroker re-pointed live brokers); once its session expires the move is taken.
        await expect_error(harness.register(1), grpc.StatusCode.FAILED_PRECONDITION, "broker id 1 is live at")
        harness.clock.advance(SESSION_MS + 1)
        await harness.register(1)
        info = await harness.describe("t")
        assert info.partitions[0].leader_address == f"127.0.0.1:{new.port}"
        await harness.stub.AddPartitions(pb.AddPartitionsRequest(name="t", partitions=2), timeout=5)
        assert new.created_partitions("t") == [1]
        assert old.created_partitions("t") == [0]
    finally:
        await old.stop()


@pytest.mark.parametrize(
    ("broker_id", "host", "port", "field"),
    [(-1, "h", 1, "broker_id:"), (1, "", 1, "host:"), (1, "a b", 1, "host:"), (1, "h", 0, "port:"), (1, "h", 70000, "port:")],
)
async def test_register_broker_validation(harness: Harness, broker_id, host, port, field) -> None:
    await expect_error(
        harness.stub.RegisterBroker(pb.RegisterBrokerRequest(broker_id=broker_id, host=host, port=port), timeout=5),
        grpc.StatusCode.INVALID_ARGUMENT,
        field,
    )


async def test_unreachable_broker_still_records_the_topic(harness: Harness) -> None:
    broker = await harness.add_broker(1)
    await broker.stop()  # registered, heartbeating as far as the coordinator knows, but down
    info = await harness.create("t", 2)
    assert leaders(info) == [1, 1]
    assert broker.created == []
    # It comes back (same address) and learns its partitions from the registration answer.
    revived = FakeBroker()
    revived.port = broker.port
    revived.server = grpc.aio.server(options=server_options())
    pb_grpc.add_BrokerServicer_to_server(revived, revived.server)
    assert revived.server.add_insecure_port(f"127.0.0.1:{broker.port}") == broker.port
    await revived.server.start()
    harness.brokers[1] = revived
    response = await harness.register(1)
    assert [(r.topic, list(r.partitions)) for r in response.partitions] == [("t", [0, 1])]


async def test_cancelled_create_still_leaves_memory_and_disk_consistent(harness: Harness) -> None:
    broker = await harness.add_broker(1)
    broker.hang = True
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await harness.stub.CreateTopic(pb.CreateTopicRequest(name="t", partitions=1), timeout=0.3)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # Recorded before the broker call, so it is visible while the broker is still busy...
    assert (await harness.describe("t")).partition_count == 1
    broker.release.set()
    # ...and on disk: a restarted coordinator knows it too.
    await harness.restart_coordinator()
    assert (await harness.describe("t")).partition_count == 1


# -- robustness --------------------------------------------------------------------------------------


async def test_not_ready_before_start(tmp_path: pathlib.Path) -> None:
    h = Harness(tmp_path / "c")
    await h.start_coordinator(start_node=False)
    try:
        await expect_error(
            h.stub.ListTopics(pb.ListTopicsRequest(), timeout=5), grpc.StatusCode.UNAVAILABLE, "starting"
        )
        await h.node.start()
        assert (await h.stub.ListTopics(pb.ListTopicsRequest(), timeout=5)).topics == []
    finally:
        await h.close()


async def test_unexpected_error_is_internal_and_server_keeps_serving(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom() -> list[object]:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(harness.node.metadata, "topics", boom)
    await expect_error(
        harness.stub.ListTopics(pb.ListTopicsRequest(), timeout=5), grpc.StatusCode.INTERNAL, "ListTopics", "disk on fire"
    )
    monkeypatch.undo()
    assert (await harness.stub.ListTopics(pb.ListTopicsRequest(), timeout=5)).topics == []


TOPIC_CHARS = st.sampled_from("abcXYZ019._-")
names = st.one_of(
    st.text(TOPIC_CHARS, min_size=1, max_size=12),
    st.text(max_size=20),
    st.text(TOPIC_CHARS, min_size=245, max_size=255),
    st.sampled_from([".", "..", "", "a/b", "a\x00b"]),
)
counts = st.one_of(st.integers(-3, 40), st.integers(-(2**31), 2**31 - 1), st.just(PARTITIONS_MAX))
configs = st.fixed_dictionaries(
    {},
    optional={
        "retention_ms": st.integers(-(2**63), 2**63 - 1),
        "segment_bytes": st.integers(-(2**63), 2**63 - 1),
        "max_message_bytes": st.integers(-(2**31), 2**31 - 1),
    },
)
# RESOURCE_EXHAUSTED: the brokers' partition limit (max_partitions_per_broker) is reached.
CREATE_CODES = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.RESOURCE_EXHAUSTED}
ADD_CODES = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.RESOURCE_EXHAUSTED}
DESCRIBE_CODES = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND}


@settings(deadline=None, max_examples=75, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=names, partitions=counts, config=configs, total=counts)
async def test_fuzz_create_add_describe(harness: Harness, name, partitions, config, total) -> None:
    if not harness.brokers:
        await harness.add_broker(1)
        await harness.add_broker(2)
    harness.clock.advance(1)
    for broker_id in harness.brokers:  # stay alive however long the run
        await harness.stub.BrokerHeartbeat(pb.BrokerHeartbeatRequest(broker_id=broker_id), timeout=5)

    async def outcome(call: object, allowed: set[grpc.StatusCode]) -> object:
        try:
            return await call  # type: ignore[misc]
        except grpc.aio.AioRpcError as e:
            assert e.code() in allowed, (e.code(), e.details())
            assert e.details()
            return None

    created = await outcome(harness.create(name, partitions, **config), CREATE_CODES)
    if created is not None:
        assert created.partition_count == partitions
    grown = await outcome(
        harness.stub.AddPartitions(pb.AddPartitionsRequest(name=name, partitions=total), timeout=5), ADD_CODES
    )
    described = await outcome(harness.describe(name), DESCRIBE_CODES)
    if described is not None:
        record = harness.node.metadata.topic(name)
        assert record is not None
        assert described.partition_count == record.partition_count == len(described.partitions)
        assert sorted(record.placement) == list(range(record.partition_count))
        if grown is not None:
            assert described.partition_count == total
    assert (created is None and grown is None) or described is not None
    listed = await harness.stub.ListTopics(pb.ListTopicsRequest(), timeout=5)
    assert len(listed.topics) == len(harness.node.metadata.topics())


# -- components ------------------------------------------------------------------------------------


class RecordingComponent:
    def __init__(self, node: CoordinatorNode, events: list[str]) -> None:
        self.node = node
        self.events = events

    def add_to_server(self, server: grpc.aio.Server) -> None:
        self.events.append("add_to_server")

    async def start(self) -> None:
        assert self.node.metadata.ready  # metadata is loaded before components start
        self.events.append("start")

    async def stop(self) -> None:
        self.events.append("stop")


async def test_group_service_is_built_and_run(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    monkeypatch.setattr(node_module, "build_group_service", lambda node: RecordingComponent(node, events))

    h = Harness(tmp_path / "c")
    await h.start_coordinator()
    try:
        assert isinstance(h.node.groups, RecordingComponent)
        assert events == ["add_to_server", "start"]
    finally:
        await h.close()
    assert events == ["add_to_server", "start", "stop"]


async def test_stop_is_bounded_and_closes_channels(harness: Harness) -> None:
    await harness.add_broker(1)
    await harness.create("t", 1)
    assert len(harness.node.broker_pool) == 1
    pool = harness.node.broker_pool
    await asyncio.wait_for(harness.stop_coordinator(), 10)
    assert len(pool) == 0
    with pytest.raises(RuntimeError):
        pool.stub("127.0.0.1:1")


async def test_broker_pool_is_bounded() -> None:
    pool = BrokerPool(max_channels=2)
    a = pool.stub("127.0.0.1:1")
    assert pool.stub("127.0.0.1:1") is a
    pool.stub("127.0.0.1:2")
    pool.stub("127.0.0.1:1")  # most recently used: "...:2" goes first
    pool.stub("127.0.0.1:3")
    assert len(pool) == 2
    assert pool.stub("127.0.0.1:1") is a
    pool.forget("127.0.0.1:1")
    assert len(pool) == 1
    await asyncio.wait_for(pool.close(), 10)
    assert len(pool) == 0


# -- with the real brokers (dmq.broker.node.BrokerNode through the conftest cluster fixtures) ------


async def _log_partitions(broker: object, topic: str) -> list[int]:
    return sorted(p for t, p in broker.logs.partitions() if t == topic)  # type: ignore[attr-defined]


def test_real_brokers_create_and_delete_their_partitions(cluster3) -> None:  # noqa: ANN001
    with grpc.insecure_channel(cluster3.bootstrap, options=channel_options()) as channel:
        stub = pb_grpc.MetadataStub(channel)
        listed = stub.ListBrokers(pb.ListBrokersRequest(), timeout=5).brokers
        assert [(b.broker_id, b.alive) for b in listed] == [(0, True), (1, True), (2, True)]
        info = stub.CreateTopic(
            pb.CreateTopicRequest(
                name="real", partitions=7, config=pb.TopicConfig(segment_bytes=1 << 20, replication_factor=1)
            ),
            timeout=10,
        )
        placed = leaders(info)
        assert sorted(placed.count(b) for b in (0, 1, 2)) == [2, 2, 3]
        for broker in cluster3.cluster.brokers:
            held = cluster3.call(_log_partitions(broker, "real"))
            assert held == [p for p, b in enumerate(placed) if b == broker.broker_id]
        grown = stub.AddPartitions(pb.AddPartitionsRequest(name="real", partitions=9), timeout=10)
        placed = leaders(grown)
        for broker in cluster3.cluster.brokers:
            held = cluster3.call(_log_partitions(broker, "real"))
            assert held == [p for p, b in enumerate(placed) if b == broker.broker_id]
        stub.DeleteTopic(pb.DeleteTopicRequest(name="real"), timeout=10)
        for broker in cluster3.cluster.brokers:
            assert cluster3.call(_log_partitions(broker, "real")) == []


def test_real_broker_that_stops_expires_and_gets_no_new_partitions(cluster_factory) -> None:  # noqa: ANN001
    cluster = cluster_factory(brokers=3, shared_port=False, broker_session_timeout_ms=600)
    cluster.call(cluster.cluster.stop_broker(1))
    with grpc.insecure_channel(cluster.bootstrap, options=channel_options()) as channel:
        stub = pb_grpc.MetadataStub(channel)
        deadline = time.monotonic() + 10
        while True:
            alive = {b.broker_id: b.alive for b in stub.ListBrokers(pb.ListBrokersRequest(), timeout=5).brokers}
            if not alive[1] or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert alive == {0: True, 1: False, 2: True}
        info = stub.CreateTopic(pb.CreateTopicRequest(name="t", partitions=4), timeout=10)
        assert set(leaders(info)) == {0, 2}
