"""The controller side of replication (issue 15) on a real Metadata gRPC server: replicated topic
creation, elections on session expiry and clean shutdown, AlterIsr, preferred leaders and
reassignment. Brokers are recording fakes on their own real servers (test_metadata's harness, with
UpdatePartitionStates), so each broker's view of the protocol is checked call by call and the
clock is injected; the last tests run a real 3-broker cluster.
"""

from __future__ import annotations

import asyncio
import pathlib
import time
from collections.abc import AsyncIterator

import grpc
import pytest

from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto.grpc_options import channel_options
from tests.integration.test_metadata import SESSION_MS, FakeBroker, Harness, expect_error, running_harness


class ReplicaBroker(FakeBroker):
    """Also records the controller's UpdatePartitionStates pushes."""

    def __init__(self) -> None:
        super().__init__()
        self.pushed: list[pb.PartitionState] = []
        self.refuse: list[grpc.StatusCode] = []  # the next pushes' answers, before any is applied

    async def UpdatePartitionStates(self, request, context):  # noqa: N802
        if self.refuse:
            await context.abort(self.refuse.pop(0), "refused by the test")
        self.pushed.extend(request.states)
        return pb.UpdatePartitionStatesResponse()

    def latest(self, topic: str, partition: int) -> pb.PartitionState | None:
        return next((s for s in reversed(self.pushed) if (s.topic, s.partition) == (topic, partition)), None)


@pytest.fixture
async def h(tmp_path: pathlib.Path) -> AsyncIterator[Harness]:
    async with running_harness(tmp_path / "coordinator") as harness:
        yield harness


async def add(h: Harness, broker_id: int, rack: str = "") -> ReplicaBroker:
    broker = ReplicaBroker()
    await broker.start()
    h.brokers[broker_id] = broker
    await register(h, broker_id, rack)
    return broker


async def register(h: Harness, broker_id: int, rack: str = "") -> pb.RegisterBrokerResponse:
    return await h.stub.RegisterBroker(
        pb.RegisterBrokerRequest(broker_id=broker_id, host="127.0.0.1", port=h.brokers[broker_id].port, rack=rack),
        timeout=5,
    )


async def beat(h: Harness, *broker_ids: int) -> None:
    for b in broker_ids:
        assert not (await h.stub.BrokerHeartbeat(pb.BrokerHeartbeatRequest(broker_id=b), timeout=5)).reregister


def view(info: pb.TopicInfo, p: int = 0) -> tuple[int, list[int], list[int], int]:
    part = info.partitions[p]
    return part.leader_id, list(part.replicas), list(part.isr), part.leader_epoch


async def alter_isr(h: Harness, state: pb.PartitionState, isr: list[int], **over: int) -> pb.AlterIsrResponse:
    fields = dict(broker_id=state.leader_id, topic=state.topic, partition=state.partition,
                  leader_epoch=state.leader_epoch, partition_epoch=state.partition_epoch) | over
    return await h.stub.AlterIsr(pb.AlterIsrRequest(isr=isr, **fields), timeout=5)


async def until(check, timeout_s: float = 10.0):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            return result
        await asyncio.sleep(0.02)


# -- creation ----------------------------------------------------------------------------------------


async def test_replicated_topic_goes_to_every_replica_with_states(h: Harness) -> None:
    brokers = {b: await add(h, b) for b in (1, 2, 3)}
    info = await h.create("r", 3)  # default: min(3, live) replicas, min_insync 2
    assert (info.config.replication_factor, info.config.min_insync_replicas) == (3, 2)
    assert info.config.HasField("unclean_leader_election") and not info.config.unclean_leader_election
    for p in range(3):
        leader, replicas, isr, epoch = view(info, p)
        assert sorted(replicas) == [1, 2, 3] and isr == replicas and leader == replicas[0] and epoch == 0
    for broker in brokers.values():
        (request,) = [r for r in broker.created if r.topic == "r"]
        assert list(request.partitions) == [0, 1, 2]  # every replica, leading or following
        assert [s.partition for s in request.states] == [0, 1, 2]
        for s in request.states:
            assert list(s.replicas) == view(info, s.partition)[1] and s.leader_address.startswith("127.0.0.1:")
    listed = (await h.stub.ListBrokers(pb.ListBrokersRequest(), timeout=5)).brokers
    assert [(b.partitions_led, b.partitions_followed, b.partitions_under_replicated) for b in listed] == [(1, 2, 0)] * 3
    # a re-registration hands a broker all its replicas and their states
    again = await register(h, 2)
    (request,) = [r for r in again.partitions if r.topic == "r"]
    assert list(request.partitions) == [0, 1, 2] and len(request.states) == 3


async def test_unreplicated_topic_keeps_empty_states(h: Harness) -> None:
    b1 = await add(h, 1)
    await add(h, 2)
    await h.create("one", 2, replication_factor=1)
    assert all(len(r.states) == 0 for r in b1.created)


@pytest.mark.parametrize(
    ("config", "fragments"),
    [
        (dict(replication_factor=3), ("config.replication_factor", "3 replicas need 3 live brokers, there are 2")),
        (dict(replication_factor=2, min_insync_replicas=3), ("config.min_insync_replicas", "at most replication_factor (2)")),
        (dict(min_insync_replicas=3), ("config.min_insync_replicas", "at most replication_factor (2)")),  # the default RF
        (dict(replication_factor=17), ("config.replication_factor", "between 1 and 16")),
    ],
)
async def test_replication_settings_are_validated(h: Harness, config, fragments) -> None:  # noqa: ANN001
    await add(h, 1)
    await add(h, 2)
    await expect_error(h.create("bad", 1, **config), grpc.StatusCode.INVALID_ARGUMENT, *fragments)
    assert h.node.metadata.topic("bad") is None


async def test_an_operators_default_factor_waits_for_its_brokers(tmp_path: pathlib.Path) -> None:
    h = Harness(tmp_path / "coordinator", node_kwargs={"default_replication_factor": 3})
    await h.start_coordinator()
    try:
        for b in (1, 2):
            await add(h, b)
        await expect_error(h.create("d", 1), grpc.StatusCode.UNAVAILABLE,
                           "new topics get 3 replicas (default_replication_factor) and 2 brokers are live")
        assert (await h.create("named", 1, replication_factor=2)).config.replication_factor == 2
        await add(h, 3)
        info = await h.create("d", 1)
        assert (info.config.replication_factor, info.config.min_insync_replicas) == (3, 2)
    finally:
        await h.close()


async def test_racks_spread_replicas(h: Harness) -> None:
    racks = {1: "a", 2: "a", 3: "b", 4: "b"}
    for b, rack in racks.items():
        await add(h, b, rack)
    info = await h.create("racked", 8, replication_factor=2)
    for part in info.partitions:
        assert {racks[b] for b in part.replicas} == {"a", "b"}
    listed = (await h.stub.ListBrokers(pb.ListBrokersRequest(), timeout=5)).brokers
    assert [b.rack for b in listed] == ["a", "a", "b", "b"]
    await expect_error(
        h.stub.RegisterBroker(pb.RegisterBrokerRequest(broker_id=9, host="h", port=1, rack="a b"), timeout=5),
        grpc.StatusCode.INVALID_ARGUMENT, "rack:",
    )


# -- elections -------------------------------------------------------------------------------------


async def test_expired_leader_is_replaced_from_the_isr_and_told(h: Harness) -> None:
    brokers = {b: await add(h, b) for b in (1, 2, 3)}
    info = await h.create("e", 1)
    leader, replicas, _, _ = view(info)
    others = [b for b in replicas if b != leader]
    h.clock.advance(SESSION_MS // 2)
    await beat(h, *others)
    h.clock.advance(SESSION_MS // 2 + 1)  # the leader's session is over, the others' not
    assert await h.node.metadata.controller.check_brokers() == [leader]
    after = await h.describe("e")
    assert view(after) == (others[0], replicas, others, 1)
    assert after.partitions[0].leader_alive
    for b in others:  # both live replicas get the new state (the push runs in the background)
        state = await until(lambda b=b: brokers[b].latest("e", 0))
        assert (state.leader_id, list(state.isr), state.leader_epoch, state.partition_epoch) == (others[0], others, 1, 1)
    assert brokers[leader].latest("e", 0) is None  # not to the dead one
    listed = {b.broker_id: b for b in (await h.stub.ListBrokers(pb.ListBrokersRequest(), timeout=5)).brokers}
    assert listed[others[0]].partitions_under_replicated == 1
    # the state survives a coordinator restart
    await h.restart_coordinator()
    assert view(await h.describe("e")) == (others[0], replicas, others, 1)


async def test_no_live_isr_means_offline_until_it_returns(h: Harness) -> None:
    for b in (1, 2):
        await add(h, b)
    info = await h.create("o", 1, replication_factor=2)
    leader, _, _, _ = view(info)
    state = (await h.stub.GetMetadata(pb.GetMetadataRequest(topics=["o"]), timeout=5)).topics[0].partitions[0]
    ps = pb.PartitionState(topic="o", partition=0, leader_id=leader, leader_epoch=state.leader_epoch, partition_epoch=0)
    await alter_isr(h, ps, [leader])  # the follower fell behind
    h.clock.advance(SESSION_MS + 1)  # both brokers die
    await h.node.metadata.controller.check_brokers()
    after = await h.describe("o")
    assert view(after)[0] == -1 and not after.partitions[0].leader_address  # offline: no clean leader
    await register(h, leader)  # the in-sync replica returns: it leads again
    assert view(await h.describe("o"))[0] == leader


async def test_unclean_election_when_allowed(h: Harness) -> None:
    for b in (1, 2):
        await add(h, b)
    info = await h.create("u", 1, replication_factor=2, unclean_leader_election=True)
    leader, replicas, _, _ = view(info)
    follower = next(b for b in replicas if b != leader)
    ps = pb.PartitionState(topic="u", partition=0, leader_id=leader, leader_epoch=0, partition_epoch=0)
    await alter_isr(h, ps, [leader])
    h.clock.advance(SESSION_MS // 2)
    await beat(h, follower)
    h.clock.advance(SESSION_MS // 2 + 1)
    await h.node.metadata.controller.check_brokers()
    assert view(await h.describe("u")) == (follower, replicas, [follower], 1)


async def test_shutting_down_moves_leadership_before_answering(h: Harness) -> None:
    brokers = {b: await add(h, b) for b in (1, 2, 3)}
    await h.create("s", 3)
    answer = await h.stub.BrokerHeartbeat(pb.BrokerHeartbeatRequest(broker_id=2, shutting_down=True), timeout=5)
    assert not answer.reregister
    info = await h.describe("s")
    for p in range(3):
        leader, replicas, isr, epoch = view(info, p)
        assert leader != 2 and 2 not in isr and sorted(replicas) == [1, 2, 3]
        # answered after the pushes: the shutting-down broker already knows too
        assert brokers[2].latest("s", p).leader_id == leader
    led_before = [p for p in range(3) if info.partitions[p].replicas[0] == 2]
    assert all(view(info, p)[3] == 1 for p in led_before)
    # it gets no new replicas while shutting down
    created = await h.create("later", 2, replication_factor=2)
    assert all(2 not in p.replicas for p in created.partitions)


def test_election_reaches_a_real_broker_cluster(cluster_factory) -> None:  # noqa: ANN001
    # replication_factor None: the coordinator's default, min(3, live brokers)
    cluster = cluster_factory(brokers=3, shared_port=False, broker_session_timeout_ms=1000, replication_factor=None)
    with grpc.insecure_channel(cluster.bootstrap, options=channel_options()) as channel:
        stub = pb_grpc.MetadataStub(channel)
        info = stub.CreateTopic(pb.CreateTopicRequest(name="real", partitions=1), timeout=10)
        leader, replicas, _, epoch = view(info)
        assert sorted(replicas) == [0, 1, 2] and epoch == 0
        cluster.call(cluster.cluster.stop_broker(leader))
        stopped_at = time.monotonic()
        deadline = stopped_at + 10
        while True:
            after = stub.GetMetadata(pb.GetMetadataRequest(topics=["real"]), timeout=5).topics[0]
            if after.partitions[0].leader_id not in (leader, -1) or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        elapsed_s = time.monotonic() - stopped_at
        new_leader, _, new_isr, new_epoch = view(after)
        assert new_leader == next(b for b in replicas if b != leader), "no new leader within 10 s"
        assert new_epoch == 1 and leader not in new_isr and after.partitions[0].leader_alive
        # session 1 s, expiry checked every 100 ms (test_broker_session_default): the election follows
        # within about 1.1 s of the last heartbeat. A figure, not an assertion (the machine is shared).
        print(f"new leader in metadata {elapsed_s:.2f} s after the leader's broker stopped (session 1 s)")


# -- AlterIsr, preferred leader, reassignment ---------------------------------------------------------


async def current_state(h: Harness, topic: str, p: int = 0) -> pb.PartitionState:
    from dmq.coordinator.controller.pushes import partition_state

    state = h.node.metadata.partition_state(topic, p)
    return partition_state(topic, p, state, h.node.metadata.broker_address)


async def test_alter_isr_is_checked_recorded_and_pushed(h: Harness) -> None:
    brokers = {b: await add(h, b) for b in (1, 2, 3)}
    await h.create("i", 1)
    s = await current_state(h, "i")
    follower = s.replicas[2]
    # refused: stale epochs, not the leader, the leader missing, a non-replica
    await expect_error(alter_isr(h, s, list(s.isr), partition_epoch=s.partition_epoch - 1),
                       grpc.StatusCode.FAILED_PRECONDITION, "stale epochs", f"partition_epoch {s.partition_epoch}")
    await expect_error(alter_isr(h, s, list(s.isr), leader_epoch=s.leader_epoch + 1),
                       grpc.StatusCode.FAILED_PRECONDITION, "stale epochs")
    await expect_error(alter_isr(h, s, list(s.isr), broker_id=follower), grpc.StatusCode.FAILED_PRECONDITION,
                       f"broker {follower} is not the leader")
    await expect_error(alter_isr(h, s, [b for b in s.isr if b != s.leader_id]), grpc.StatusCode.INVALID_ARGUMENT,
                       f"must include the leader {s.leader_id}")
    await expect_error(alter_isr(h, s, [s.leader_id, 9]), grpc.StatusCode.INVALID_ARGUMENT, "brokers [9] are not replicas")
    await expect_error(h.stub.AlterIsr(pb.AlterIsrRequest(broker_id=1, topic="nope", partition=0, isr=[1]), timeout=5),
                       grpc.StatusCode.NOT_FOUND, "'nope'")
    await expect_error(h.stub.AlterIsr(pb.AlterIsrRequest(broker_id=1, topic="i", partition=5, isr=[1]), timeout=5),
                       grpc.StatusCode.NOT_FOUND, "partition")
    assert await current_state(h, "i") == s  # nothing changed
    # a refused stale request gets the leader the current state again
    assert await until(lambda: brokers[s.leader_id].latest("i", 0) is not None)
    # accepted: the follower leaves the ISR; the answer and the other replicas have the new state
    shrunk = (await alter_isr(h, s, [b for b in s.isr if b != follower])).state
    assert follower not in shrunk.isr and shrunk.partition_epoch == s.partition_epoch + 1
    assert shrunk.leader_epoch == s.leader_epoch
    for b in s.replicas:
        if b != s.leader_id:
            assert await until(lambda b=b: (brokers[b].latest("i", 0) or pb.PartitionState()).partition_epoch
                               == shrunk.partition_epoch)
    info = await h.describe("i")
    assert list(info.partitions[0].isr) == list(shrunk.isr)
    # the same request again is stale now; the up-to-date one is idempotent
    await expect_error(alter_isr(h, s, list(shrunk.isr)), grpc.StatusCode.FAILED_PRECONDITION, "stale epochs")
    assert (await alter_isr(h, shrunk, list(shrunk.isr))).state == shrunk


async def test_preferred_leader_returns_once_back_in_sync(h: Harness) -> None:
    for b in (1, 2, 3):
        await add(h, b)
    await h.create("pref", 1)
    s = await current_state(h, "pref")
    preferred = s.replicas[0]
    await h.stub.BrokerHeartbeat(pb.BrokerHeartbeatRequest(broker_id=preferred, shutting_down=True), timeout=5)
    await register(h, preferred)  # restarted: a follower, out of sync
    moved = await current_state(h, "pref")
    assert moved.leader_id != preferred and preferred not in moved.isr
    assert await h.node.metadata.controller.rebalance_preferred_leaders() == 0  # not in sync yet
    synced = (await alter_isr(h, moved, [*moved.isr, preferred])).state
    assert await h.node.metadata.controller.rebalance_preferred_leaders() == 1
    back = await current_state(h, "pref")
    assert (back.leader_id, back.leader_epoch) == (preferred, synced.leader_epoch + 1)
    assert await h.node.metadata.controller.rebalance_preferred_leaders() == 0


@pytest.mark.parametrize(
    ("replicas", "code", "fragment"),
    [
        ([], grpc.StatusCode.INVALID_ARGUMENT, "replicas: name at least one broker"),
        ([1, 1], grpc.StatusCode.INVALID_ARGUMENT, "replicas: brokers [1] are named twice"),
        ([1, 7], grpc.StatusCode.INVALID_ARGUMENT, "replicas: brokers [7] are not live brokers"),
    ],
)
async def test_reassign_validation(h: Harness, replicas, code, fragment) -> None:  # noqa: ANN001
    for b in (1, 2):
        await add(h, b)
    await h.create("v", 1, replication_factor=1)
    await expect_error(h.stub.ReassignPartition(pb.ReassignPartitionRequest(topic="v", partition=0, replicas=replicas),
                                                timeout=5), code, fragment)
    await expect_error(h.stub.ReassignPartition(pb.ReassignPartitionRequest(topic="v", partition=3, replicas=[1]),
                                                timeout=5), grpc.StatusCode.NOT_FOUND, "partition")


async def test_reassign_adds_waits_for_sync_then_drops(h: Harness) -> None:
    brokers = {b: await add(h, b) for b in (1, 2, 3)}
    info = await h.create("m", 1, replication_factor=2)
    leader, replicas, _, _ = view(info)
    newcomer = next(b for b in (1, 2, 3) if b not in replicas)
    target = [newcomer, next(b for b in replicas if b != leader)]  # the leader leaves
    started = (await h.stub.ReassignPartition(pb.ReassignPartitionRequest(topic="m", partition=0, replicas=target),
                                              timeout=5)).state
    assert list(started.replicas) == [*target, leader] and started.leader_id == leader
    (created,) = [r for r in brokers[newcomer].created if r.topic == "m"]
    assert list(created.partitions) == [0] and list(created.states[0].replicas) == [*target, leader]
    await expect_error(h.stub.ReassignPartition(pb.ReassignPartitionRequest(topic="m", partition=0, replicas=target),
                                                timeout=5), grpc.StatusCode.FAILED_PRECONDITION, "being reassigned")
    # the leader's AlterIsr shows the newcomer in sync: the old leader is dropped and hands over
    await alter_isr(h, started, [*started.isr, newcomer])
    done = await until(lambda: list(h.node.metadata.partition_state("m", 0).replicas) == target, 10)
    assert done
    final = await current_state(h, "m")
    assert final.leader_id == target[0] and final.leader_epoch == started.leader_epoch + 1
    assert sorted(final.isr) == sorted(target)
    assert await until(lambda: any(r.topic == "m" and list(r.partitions) == [0] for r in brokers[leader].deleted))
    for b in target:
        assert await until(lambda b=b: (brokers[b].latest("m", 0) or pb.PartitionState()).partition_epoch
                           == final.partition_epoch)


async def test_reassign_elects_the_preferred_replica_once_in_sync(tmp_path: pathlib.Path) -> None:
    # The periodic preferred-leader check would move the leader too; an hour keeps it out of the
    # way, so the election seen here is the reassignment's.
    h = Harness(tmp_path / "coordinator", node_kwargs={"preferred_leader_check_interval_ms": 3_600_000})
    await h.start_coordinator()
    try:
        brokers = {b: await add(h, b) for b in (1, 2, 3)}
        await h.create("o", 1)
        s = await current_state(h, "o")
        leader, second, third = s.replicas
        # the broker to lead is out of sync: the new order is recorded, the leader stays for now
        shrunk = (await alter_isr(h, s, [leader, third])).state
        target = [second, leader, third]
        started = (await h.stub.ReassignPartition(
            pb.ReassignPartitionRequest(topic="o", partition=0, replicas=target), timeout=5)).state
        assert list(started.replicas) == target and started.leader_id == leader
        assert started.leader_epoch == shrunk.leader_epoch
        # it joins the in-sync set: it leads at the next leader epoch, and every replica is told
        await alter_isr(h, started, [leader, third, second])
        assert await until(lambda: h.node.metadata.partition_state("o", 0).leader == second)
        final = await current_state(h, "o")
        assert final.leader_epoch == started.leader_epoch + 1 and list(final.replicas) == target
        for b in target:
            assert await until(lambda b=b: (brokers[b].latest("o", 0) or pb.PartitionState()).leader_id == second)
    finally:
        await h.close()


async def test_a_lost_push_is_sent_again_at_the_next_heartbeat(h: Harness) -> None:
    brokers = {b: await add(h, b) for b in (1, 2, 3)}
    await h.create("lost", 1)
    s = await current_state(h, "lost")
    unreachable, old_version = s.replicas[1], s.replicas[2]
    brokers[unreachable].refuse = [grpc.StatusCode.UNAVAILABLE]
    brokers[old_version].refuse = [grpc.StatusCode.UNIMPLEMENTED]  # a broker without replication
    shrunk = (await alter_isr(h, s, [s.leader_id])).state
    pusher = h.node.metadata.pusher
    assert await until(lambda: unreachable in pusher.pending)
    assert old_version not in pusher.pending  # dropped: retrying cannot help until it restarts
    assert brokers[unreachable].latest("lost", 0) is None
    await beat(h, unreachable, old_version)
    got = await until(lambda: brokers[unreachable].latest("lost", 0))
    assert got.partition_epoch == shrunk.partition_epoch and unreachable not in pusher.pending
    assert brokers[old_version].latest("lost", 0) is None
    # a registration answer carries every state: nothing stays pending for that broker
    brokers[unreachable].refuse = [grpc.StatusCode.UNAVAILABLE]
    await alter_isr(h, shrunk, [shrunk.leader_id, unreachable])
    assert await until(lambda: unreachable in pusher.pending)
    (request,) = [r for r in (await register(h, unreachable)).partitions if r.topic == "lost"]
    assert list(request.states[0].isr) == sorted([shrunk.leader_id, unreachable], key=list(s.replicas).index)
    assert unreachable not in pusher.pending
