"""The GroupCoordinator service (coordinator/group_service.py) over real gRPC, with real brokers,
real SQLite files in tmp_path, driven through the raw grpc.aio stubs.

The servers run on their own loop in a background thread (ClusterThread); each test talks to them
from its own loop. Rebalances are debounced DEBOUNCE_MS here instead of 500 ms, to keep the file
fast; nothing waits on a clock except through long-polls and streams with timeouts.
"""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator, Callable, Sequence

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dmq.client.cli.runner import ClusterOptions, ClusterThread
from dmq.coordinator import group as machine
from dmq.coordinator.node import CoordinatorNode
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import records
from dmq.proto.grpc_options import channel_options
from dmq.proto.server.grpc_options import server_options
from tests import member_secrets

DEBOUNCE_MS = 50
WAIT_MS = 5_000  # GetAssignment long-poll in tests: returns as soon as the group is stable
TIMEOUT_S = 10.0

Code = grpc.StatusCode


class Client:
    """Raw async stubs: the coordinator, and each partition's leading broker."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self._channels: dict[str, grpc.aio.Channel] = {}
        self.groups = pb_grpc.GroupCoordinatorStub(self._channel(bootstrap))
        self.meta = pb_grpc.MetadataStub(self._channel(bootstrap))
        self._leaders: dict[tuple[str, int], str] = {}

    def _channel(self, address: str) -> grpc.aio.Channel:
        if address not in self._channels:
            self._channels[address] = member_secrets.aio_channel(address, options=channel_options())
        return self._channels[address]

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()

    async def create_topic(self, name: str, partitions: int) -> None:
        info = await self.meta.CreateTopic(pb.CreateTopicRequest(name=name, partitions=partitions), timeout=TIMEOUT_S)
        for p in info.partitions:
            self._leaders[(name, p.partition)] = p.leader_address

    async def refresh(self, topic: str) -> None:
        info = await self.meta.DescribeTopic(pb.DescribeTopicRequest(name=topic), timeout=TIMEOUT_S)
        for p in info.partitions:
            self._leaders[(topic, p.partition)] = p.leader_address

    def broker(self, topic: str, partition: int) -> pb_grpc.BrokerStub:
        return pb_grpc.BrokerStub(self._channel(self._leaders[(topic, partition)]))

    async def produce(self, topic: str, partition: int, values: Sequence[bytes]) -> pb.ProduceResponse:
        return await self.broker(topic, partition).Produce(
            pb.ProduceRequest(topic=topic, partition=partition, batch=records.encode(list(values))), timeout=TIMEOUT_S
        )

    async def fetch(self, topic: str, partition: int, offset: int) -> list[tuple[int, bytes]]:
        response = await self.broker(topic, partition).Fetch(
            pb.FetchRequest(partitions=[pb.FetchPartition(topic=topic, partition=partition, offset=offset)]),
            timeout=TIMEOUT_S,
        )
        (result,) = response.partitions
        assert result.error == pb.NONE, result.error_message
        return [(r.offset, r.value) for b in records.decode_batches(result.records) for r in b if r.offset >= offset]

    async def commit(self, group_id: str, member_id: str, generation: int, topic: str, offsets: dict[int, int]) -> None:
        for p, offset in offsets.items():
            await self.broker(topic, p).CommitOffsets(
                pb.CommitOffsetsRequest(
                    group_id=group_id, member_id=member_id, generation=generation,
                    offsets=[pb.PartitionOffset(topic=topic, partition=p, offset=offset)],
                ),
                timeout=TIMEOUT_S,
            )

    async def committed(self, group_id: str, topic: str, partition: int) -> int:
        response = await self.broker(topic, partition).FetchCommittedOffsets(
            pb.FetchCommittedOffsetsRequest(
                group_id=group_id, partitions=[pb.TopicPartition(topic=topic, partition=partition)]
            ),
            timeout=TIMEOUT_S,
        )
        return response.offsets[0].offset

    # -- group calls -----------------------------------------------------------------------------

    async def find(self, topic: str, app_id: str, mode: int = pb.SUBSCRIPTION_MODE_UNSPECIFIED,
                   from_ms: int = 0) -> pb.FindOrCreateGroupResponse:
        return await self.groups.FindOrCreateGroup(
            pb.FindOrCreateGroupRequest(
                topic=topic, app_id=app_id, subscription_mode=mode, subscription_from_ms=from_ms
            ),
            timeout=TIMEOUT_S,
        )

    async def join(self, group_id: str, client_id: str = "c", **kw: int | str) -> str:
        response = await self.groups.JoinGroup(
            pb.JoinGroupRequest(group_id=group_id, client_id=client_id, **kw), timeout=TIMEOUT_S
        )
        return response.member_id

    async def assignment(self, group_id: str, member_id: str, wait_ms: int = 0) -> pb.GetAssignmentResponse:
        return await self.groups.GetAssignment(
            pb.GetAssignmentRequest(group_id=group_id, member_id=member_id, wait_ms=wait_ms),
            timeout=TIMEOUT_S + wait_ms / 1000,
        )

    async def settle(self, group_id: str, members: Sequence[str]) -> list[pb.GetAssignmentResponse]:
        """Every member asks for its assignment at once, long-polling until the group is stable."""
        answers = await asyncio.gather(*(self.assignment(group_id, m, WAIT_MS) for m in members))
        for answer in answers:
            assert not answer.rebalance_in_progress, answers
        return list(answers)

    async def heartbeat(self, group_id: str, member_id: str, generation: int = -1) -> pb.HeartbeatResponse:
        return await self.groups.Heartbeat(
            pb.HeartbeatRequest(group_id=group_id, member_id=member_id, generation=generation), timeout=TIMEOUT_S
        )

    async def leave(self, group_id: str, member_id: str) -> None:
        await self.groups.LeaveGroup(pb.LeaveGroupRequest(group_id=group_id, member_id=member_id), timeout=TIMEOUT_S)

    async def describe(self, group_id: str) -> pb.DescribeGroupResponse:
        return await self.groups.DescribeGroup(pb.DescribeGroupRequest(group_id=group_id), timeout=TIMEOUT_S)

    async def generation_started(self, group_id: str, member_id: str, generation: int) -> None:
        """Wait (through WatchGroup) until the group's generation reaches ``generation``."""
        call = self.groups.WatchGroup(pb.WatchGroupRequest(group_id=group_id, member_id=member_id), timeout=TIMEOUT_S)
        try:
            while (event := await call.read()).generation < generation:
                assert event is not grpc.aio.EOF
        finally:
            call.cancel()


async def status_of(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    return info.value.code(), info.value.details() or ""


@pytest.fixture
def fast(cluster_factory: Callable[..., ClusterThread]) -> ClusterThread:
    return cluster_factory(rebalance_debounce_ms=DEBOUNCE_MS)


@pytest.fixture
async def client(fast: ClusterThread) -> AsyncIterator[Client]:
    c = Client(fast.bootstrap)
    yield c
    await c.close()


# -- FindOrCreateGroup ---------------------------------------------------------------------------


async def test_find_or_create_records_the_group_once_and_the_first_mode_wins(
    client: Client, fast: ClusterThread
) -> None:
    await client.create_topic("orders", 2)
    first = await client.find("orders", "billing", pb.SUBSCRIPTION_MODE_ALL)
    assert (first.group_id, first.created) == ("G_orders_billing", True)
    assert first.subscription.mode == pb.SUBSCRIPTION_MODE_ALL
    assert first.coordinator_address == fast.bootstrap
    assert first.subscription.created_ms > 0
    second = await client.find("orders", "billing", pb.SUBSCRIPTION_MODE_NEW)
    assert (second.group_id, second.created) == ("G_orders_billing", False)
    assert second.subscription == first.subscription  # recorded, not the request's
    rows = fast.call(fast.cluster.coordinator.store.load_groups())
    assert [(r.group_id, r.topic, r.app_id, r.subscription_mode) for r in rows] == [
        ("G_orders_billing", "orders", "billing", "all")
    ]


async def test_concurrent_find_or_create_creates_one_group(client: Client) -> None:
    await client.create_topic("t", 3)
    answers = await asyncio.gather(*(client.find("t", "app", pb.SUBSCRIPTION_MODE_NEW) for _ in range(8)))
    assert sum(a.created for a in answers) == 1
    assert len({a.subscription.SerializeToString() for a in answers}) == 1


async def test_find_or_create_refuses_bad_requests(client: Client) -> None:
    await client.create_topic("t", 1)
    cases = [
        (client.find("missing", "app"), Code.NOT_FOUND, "'missing' not found"),
        (client.find("", "app"), Code.INVALID_ARGUMENT, "topic"),
        (client.find("bad/topic", "app"), Code.INVALID_ARGUMENT, "topic"),
        (client.find("t", ""), Code.INVALID_ARGUMENT, "app_id"),
        (client.find("t", "a" * 250), Code.INVALID_ARGUMENT, "app_id"),
        (client.find("t", "sp ace"), Code.INVALID_ARGUMENT, "app_id"),
        (client.find("t", "app", 99), Code.INVALID_ARGUMENT, "subscription_mode"),
        (client.find("t", "app", pb.SUBSCRIPTION_MODE_ALL, from_ms=5), Code.INVALID_ARGUMENT, "subscription_from_ms"),
        (client.find("t", "app", pb.SUBSCRIPTION_MODE_TIMESTAMP), Code.INVALID_ARGUMENT, "subscription_from_ms"),
        (client.find("t", "app", pb.SUBSCRIPTION_MODE_TIMESTAMP, from_ms=-1), Code.INVALID_ARGUMENT,
         "subscription_from_ms"),
    ]
    for call, code, words in cases:
        got_code, details = await status_of(call)
        assert got_code == code and words in details, (code, words, got_code, details)
    assert (await client.groups.ListGroups(pb.ListGroupsRequest(), timeout=TIMEOUT_S)).groups == []


# -- membership and assignment -------------------------------------------------------------------


async def test_members_split_the_partitions_by_range_and_the_group_becomes_stable(client: Client) -> None:
    await client.create_topic("t", 5)
    gid = (await client.find("t", "app")).group_id
    a = await client.join(gid, "alpha", session_timeout_ms=10_000)
    b = await client.join(gid, "beta")
    answers = await client.settle(gid, [a, b])
    by_member = dict(zip([a, b], answers, strict=True))
    first, second = sorted([a, b])
    assert list(by_member[first].partitions) == [0, 1, 2]  # range: the first member gets the extra one
    assert list(by_member[second].partitions) == [3, 4]
    assert {x.generation for x in answers} == {1}
    assert all(x.topic == "t" for x in answers)
    assert [(s.partition, s.offset) for s in by_member[first].start_positions] == [(0, -2), (1, -2), (2, -2)]

    d = await client.describe(gid)
    assert (d.state, d.generation, d.topic) == (pb.GROUP_STATE_STABLE, 1, "t")
    members = {m.member_id: m for m in d.members}
    assert {m.client_id for m in d.members} == {"alpha", "beta"}
    assert list(members[first].partitions) == list(members[first].target_partitions) == [0, 1, 2]
    assert members[a].host == "127.0.0.1"
    assert [(p.partition, p.owner_member_id) for p in d.partitions] == [
        (0, first), (1, first), (2, first), (3, second), (4, second)
    ]
    (summary,) = (await client.groups.ListGroups(pb.ListGroupsRequest(), timeout=TIMEOUT_S)).groups
    assert (summary.group_id, summary.topic, summary.state, summary.generation, summary.member_count) == (
        gid, "t", pb.GROUP_STATE_STABLE, 1, 2
    )


async def test_a_retried_join_with_the_same_consumer_id_returns_the_same_member(client: Client) -> None:
    await client.create_topic("t", 1)
    gid = (await client.find("t", "app")).group_id
    first = await client.join(gid, consumer_id="instance-1")
    again = await client.join(gid, consumer_id="instance-1")
    assert first == again
    assert len((await client.describe(gid)).members) == 1


async def test_heartbeat_tells_a_member_of_a_new_generation(client: Client) -> None:
    await client.create_topic("t", 2)
    gid = (await client.find("t", "app")).group_id
    a = await client.join(gid)
    (answer,) = await client.settle(gid, [a])
    hb = await client.heartbeat(gid, a, answer.generation)
    assert (hb.generation, hb.assignment_changed) == (1, False)
    b = await client.join(gid)
    await client.generation_started(gid, b, 2)
    hb = await client.heartbeat(gid, a, answer.generation)
    assert (hb.generation, hb.assignment_changed) == (2, True)
    answers = await client.settle(gid, [a, b])
    hb = await client.heartbeat(gid, a, answers[0].generation)
    assert (hb.generation, hb.assignment_changed) == (2, False)


async def test_get_assignment_without_wait_answers_at_once_during_a_rebalance(client: Client) -> None:
    await client.create_topic("t", 2)
    gid = (await client.find("t", "app")).group_id
    a = await client.join(gid)
    answer = await client.assignment(gid, a)  # the debounce has not fired yet
    assert answer.rebalance_in_progress and list(answer.partitions) == []
    answer = await client.assignment(gid, a, WAIT_MS)
    assert not answer.rebalance_in_progress and list(answer.partitions) == [0, 1]


async def test_watch_group_streams_generations_and_ends_when_the_member_leaves(client: Client) -> None:
    await client.create_topic("t", 2)
    gid = (await client.find("t", "app")).group_id
    a = await client.join(gid)
    await client.settle(gid, [a])
    call = client.groups.WatchGroup(pb.WatchGroupRequest(group_id=gid, member_id=a), timeout=TIMEOUT_S)
    try:
        first = await call.read()
        assert (first.generation, first.assignment_changed) == (1, False)  # the state on opening
        b = await client.join(gid)
        event = await call.read()
        assert (event.generation, event.assignment_changed) == (2, True)  # a must hand a partition over
        await client.settle(gid, [a, b])
        await client.leave(gid, a)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            while True:
                event = await call.read()
                assert event is not grpc.aio.EOF
        assert info.value.code() == Code.NOT_FOUND
    finally:
        call.cancel()


async def test_watch_group_limits_streams_per_member(client: Client) -> None:
    await client.create_topic("t", 1)
    gid = (await client.find("t", "app")).group_id
    a = await client.join(gid)
    calls = [client.groups.WatchGroup(pb.WatchGroupRequest(group_id=gid, member_id=a), timeout=TIMEOUT_S)
             for _ in range(4)]
    try:
        for call in calls:
            await call.read()  # each one is open (first event)
        extra = client.groups.WatchGroup(pb.WatchGroupRequest(group_id=gid, member_id=a), timeout=TIMEOUT_S)
        code, details = await status_of(extra.read())
        assert code == Code.RESOURCE_EXHAUSTED and "watch streams" in details
    finally:
        for call in calls:
            call.cancel()


async def test_leave_releases_partitions_and_the_survivor_takes_them(client: Client) -> None:
    await client.create_topic("t", 4)
    gid = (await client.find("t", "app")).group_id
    a, b = await client.join(gid), await client.join(gid)
    await client.settle(gid, [a, b])
    await client.leave(gid, b)
    (answer,) = await client.settle(gid, [a])
    assert list(answer.partitions) == [0, 1, 2, 3] and answer.generation == 2
    assert [p.owner_member_id for p in (await client.describe(gid)).partitions] == [a] * 4
    code, _ = await status_of(client.heartbeat(gid, b))
    assert code == Code.NOT_FOUND


async def test_a_silent_member_expires_after_its_session_timeout(client: Client) -> None:
    await client.create_topic("t", 2)
    gid = (await client.find("t", "app")).group_id
    quiet = await client.join(gid, session_timeout_ms=1_000)  # the coordinator's minimum
    alive = await client.join(gid, session_timeout_ms=10_000)
    await client.settle(gid, [quiet, alive])
    # Only `alive` talks from now on (its watch stream); the expiry starts generation 2.
    await client.generation_started(gid, alive, 2)
    (answer,) = await client.settle(gid, [alive])
    assert answer.generation == 2 and list(answer.partitions) == [0, 1]
    code, details = await status_of(client.heartbeat(gid, quiet))
    assert code == Code.NOT_FOUND and "join the group again" in details


async def test_the_session_timer_expires_no_member_while_the_coordinator_is_not_acting(
    client: Client, fast: ClusterThread
) -> None:
    """The group timer checks leadership first: a coordinator whose lease may have lapsed (acting()
    false: deposed, not yet stepped down, or etcd unreachable) expires no member and writes
    nothing; the active coordinator's timers decide. Acting again, the silent member expires."""
    await client.create_topic("t", 2)
    gid = (await client.find("t", "app")).group_id
    quiet = await client.join(gid, session_timeout_ms=1_000)  # the coordinator's minimum
    alive = await client.join(gid, session_timeout_ms=60_000)
    await client.settle(gid, [quiet, alive])
    node = fast.cluster.coordinator
    assert node is not None
    service, acting = node.groups, node.metadata.acting

    async def stop_acting() -> int:
        node.metadata.acting = lambda: False
        return int(service.clock.now_ms())

    async def now_and_ticks() -> tuple[int, int]:
        return int(service.clock.now_ms()), int(service.ticks)

    async def members_and_row() -> tuple[list[str], str]:
        rows = {r.group_id: r for r in await node.store.load_groups()}
        return sorted(service.registry.get(gid).members), rows[gid].state_json

    before = fast.call(members_and_row())
    stopped_ms = fast.call(stop_acting())
    try:
        # The ticker's passes, not a sleep: three of them after the quiet member's session ended.
        deadline = asyncio.get_running_loop().time() + TIMEOUT_S
        expired_at_tick = None
        while True:
            now_ms, ticks = fast.call(now_and_ticks())
            if expired_at_tick is None and now_ms > stopped_ms + 1_000:
                expired_at_tick = ticks
            if expired_at_tick is not None and ticks >= expired_at_tick + 3:
                break
            assert asyncio.get_running_loop().time() < deadline, "the group ticker stopped"
            await asyncio.sleep(0.02)
        assert fast.call(members_and_row()) == before == (sorted([quiet, alive]), before[1])
    finally:
        node.metadata.acting = acting
    await client.generation_started(gid, alive, 2)  # acting again: the silent member expires
    assert fast.call(members_and_row())[0] == [alive]


async def test_membership_rpcs_refuse_bad_requests(client: Client) -> None:
    await client.create_topic("t", 1)
    gid = (await client.find("t", "app")).group_id
    a = await client.join(gid)
    g = client.groups
    cases = [
        (g.JoinGroup(pb.JoinGroupRequest(group_id="")), Code.INVALID_ARGUMENT, "group_id"),
        (g.JoinGroup(pb.JoinGroupRequest(group_id="x" * 600)), Code.INVALID_ARGUMENT, "group_id"),
        (g.JoinGroup(pb.JoinGroupRequest(group_id="G_none_x")), Code.NOT_FOUND, "a group appears when a consumer"),
        (g.JoinGroup(pb.JoinGroupRequest(group_id=gid, session_timeout_ms=10)), Code.INVALID_ARGUMENT,
         "session_timeout_ms"),
        (g.JoinGroup(pb.JoinGroupRequest(group_id=gid, max_poll_interval_ms=-5)), Code.INVALID_ARGUMENT,
         "max_poll_interval_ms"),
        (g.JoinGroup(pb.JoinGroupRequest(group_id=gid, client_id="c" * 300)), Code.INVALID_ARGUMENT, "client_id"),
        (g.GetAssignment(pb.GetAssignmentRequest(group_id=gid)), Code.INVALID_ARGUMENT, "member_id"),
        (g.GetAssignment(pb.GetAssignmentRequest(group_id=gid, member_id="nobody")), Code.NOT_FOUND, "nobody"),
        (g.GetAssignment(pb.GetAssignmentRequest(group_id=gid, member_id=a, wait_ms=-1)), Code.INVALID_ARGUMENT,
         "wait_ms"),
        (g.GetAssignment(pb.GetAssignmentRequest(group_id=gid, member_id=a, wait_ms=600_000)),
         Code.INVALID_ARGUMENT, "wait_ms"),
        (g.Heartbeat(pb.HeartbeatRequest(group_id=gid, member_id=a, generation=-2)), Code.INVALID_ARGUMENT,
         "generation"),
        (g.Heartbeat(pb.HeartbeatRequest(group_id=gid, member_id="")), Code.INVALID_ARGUMENT, "member_id"),
        (g.Heartbeat(pb.HeartbeatRequest(group_id=gid, member_id="nobody")), Code.NOT_FOUND, "join the group again"),
        (g.LeaveGroup(pb.LeaveGroupRequest(group_id=gid, member_id="nobody")), Code.NOT_FOUND, "nobody"),
        (g.LeaveGroup(pb.LeaveGroupRequest(group_id="", member_id=a)), Code.INVALID_ARGUMENT, "group_id"),
        (g.DescribeGroup(pb.DescribeGroupRequest(group_id="G_none_x")), Code.NOT_FOUND, "G_none_x"),
        (g.DescribeGroup(pb.DescribeGroupRequest()), Code.INVALID_ARGUMENT, "group_id"),
        (g.DeleteGroup(pb.DeleteGroupRequest(group_id="G_none_x")), Code.NOT_FOUND, "G_none_x"),
        (g.WatchGroup(pb.WatchGroupRequest(group_id=gid, member_id="nobody")).read(), Code.NOT_FOUND, "nobody"),
        (g.WatchGroup(pb.WatchGroupRequest(group_id=gid)).read(), Code.INVALID_ARGUMENT, "member_id"),
        (g.CheckOwnership(pb.CheckOwnershipRequest(group_id=gid, member_id="", generation=3)),
         Code.INVALID_ARGUMENT, "member_id"),
        (g.CheckOwnership(pb.CheckOwnershipRequest(group_id=gid, member_id=a, generation=-7)),
         Code.INVALID_ARGUMENT, "generation"),
        (g.CheckOwnership(pb.CheckOwnershipRequest(group_id=gid, member_id=a, generation=1, partitions=[-1])),
         Code.INVALID_ARGUMENT, "partitions[0]"),
        (g.CheckOwnership(pb.CheckOwnershipRequest(group_id=gid, member_id=a, partitions=[0], topic="other")),
         Code.INVALID_ARGUMENT, "topic"),
    ]
    for call, code, words in cases:
        got_code, details = await status_of(call)
        assert got_code == code and words in details, (code, words, got_code, details)
    assert len((await client.describe(gid)).members) == 1  # nothing above changed the group


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    group_id=st.text(max_size=40),
    member_id=st.text(max_size=40),
    number=st.integers(min_value=-(2**31), max_value=2**31 - 1),
    partitions=st.lists(st.integers(min_value=-(2**31), max_value=2**31 - 1), max_size=5),
)
def test_no_request_makes_the_service_fail(
    fuzz_stub: pb_grpc.GroupCoordinatorStub, group_id: str, member_id: str, number: int, partitions: list[int]
) -> None:
    calls = [
        lambda: fuzz_stub.FindOrCreateGroup(pb.FindOrCreateGroupRequest(
            topic=group_id, app_id=member_id, subscription_mode=number % 5, subscription_from_ms=number)),
        lambda: fuzz_stub.JoinGroup(pb.JoinGroupRequest(group_id=group_id, client_id=member_id,
                                                        session_timeout_ms=number, max_poll_interval_ms=number)),
        lambda: fuzz_stub.GetAssignment(pb.GetAssignmentRequest(group_id=group_id, member_id=member_id,
                                                                wait_ms=min(number, 0))),
        lambda: fuzz_stub.Heartbeat(pb.HeartbeatRequest(group_id=group_id, member_id=member_id, generation=number)),
        lambda: fuzz_stub.LeaveGroup(pb.LeaveGroupRequest(group_id=group_id, member_id=member_id)),
        lambda: fuzz_stub.DescribeGroup(pb.DescribeGroupRequest(group_id=group_id)),
        lambda: fuzz_stub.CheckOwnership(pb.CheckOwnershipRequest(
            group_id=group_id, member_id=member_id, generation=number, partitions=partitions, topic=member_id)),
    ]
    for call in calls:
        try:
            call()
        except grpc.RpcError as e:
            assert e.code() not in (Code.INTERNAL, Code.UNKNOWN), e.details()


@pytest.fixture
def fuzz_stub(fast: ClusterThread):
    channel = member_secrets.sync_channel(fast.bootstrap, options=channel_options())
    meta = pb_grpc.MetadataStub(channel)
    meta.CreateTopic(pb.CreateTopicRequest(name="t", partitions=2), timeout=TIMEOUT_S)
    stub = pb_grpc.GroupCoordinatorStub(channel)
    # A real group with a real member, so ids that happen to exist take the deeper paths too.
    gid = stub.FindOrCreateGroup(pb.FindOrCreateGroupRequest(topic="t", app_id="a"), timeout=TIMEOUT_S).group_id
    stub.JoinGroup(pb.JoinGroupRequest(group_id=gid, client_id="c"), timeout=TIMEOUT_S)
    yield _WithTimeout(stub)
    channel.close()


class _WithTimeout:
    """Every call of the wrapped sync stub gets a timeout."""

    def __init__(self, stub: pb_grpc.GroupCoordinatorStub) -> None:
        self._stub = stub

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        method = getattr(self._stub, name)
        return lambda request: method(request, timeout=TIMEOUT_S)


# -- commits through the broker ------------------------------------------------------------------


async def test_commits_are_accepted_from_owners_and_refused_from_everyone_else(client: Client) -> None:
    await client.create_topic("t", 2)
    gid = (await client.find("t", "app")).group_id
    a, b = await client.join(gid), await client.join(gid)
    answers = await client.settle(gid, [a, b])
    await client.produce("t", 0, [b"x"] * 5)
    await client.produce("t", 1, [b"y"] * 5)
    mine = {a: answers[0].partitions[0], b: answers[1].partitions[0]}
    generation = answers[0].generation

    await client.commit(gid, a, generation, "t", {mine[a]: 3})
    assert await client.committed(gid, "t", mine[a]) == 3

    code, details = await status_of(client.commit(gid, a, generation, "t", {mine[b]: 2}))
    assert code == Code.FAILED_PRECONDITION and "fetch your assignment" in details
    code, _ = await status_of(client.commit(gid, a, generation + 1, "t", {mine[a]: 4}))
    assert code == Code.FAILED_PRECONDITION  # a generation from the future
    code, _ = await status_of(client.commit(gid, "ghost", generation, "t", {mine[a]: 4}))
    assert code == Code.NOT_FOUND
    code, details = await status_of(client.commit(gid, "", -1, "t", {mine[a]: 0}))  # operator reset
    assert code == Code.FAILED_PRECONDITION and "2 active member(s)" in details
    assert await client.committed(gid, "t", mine[b]) == -1
    assert await client.committed(gid, "t", mine[a]) == 3

    await client.leave(gid, a)
    await client.leave(gid, b)
    await client.commit(gid, "", -1, "t", {0: 1, 1: 2})  # an empty group's offsets can be reset
    assert [await client.committed(gid, "t", p) for p in (0, 1)] == [1, 2]


async def test_a_partition_moves_only_after_its_old_owner_fetched_its_assignment(client: Client) -> None:
    await client.create_topic("t", 2)
    gid = (await client.find("t", "app")).group_id
    old = await client.join(gid, "old")
    (answer,) = await client.settle(gid, [old])
    assert list(answer.partitions) == [0, 1]
    await client.produce("t", 0, [b"m"] * 10)
    await client.produce("t", 1, [b"m"] * 10)
    new = await client.join(gid, "new")
    # Generation 2 gives the new member a partition that `old` still owns: it gets nothing yet,
    # however long it waits for it.
    watch = client.groups.WatchGroup(pb.WatchGroupRequest(group_id=gid, member_id=new), timeout=TIMEOUT_S)
    try:
        while (event := await watch.read()).generation < 2:
            pass
        assert event.assignment_changed
        pending = await client.assignment(gid, new, 100)
        assert pending.generation == 2 and list(pending.partitions) == [] and pending.rebalance_in_progress
        d = await client.describe(gid)
        (moving,) = next(m for m in d.members if m.member_id == new).target_partitions
        code, _ = await status_of(client.commit(gid, new, 2, "t", {moving: 1}))
        assert code == Code.FAILED_PRECONDITION  # not its partition yet
        # The old owner's final commit, under its old generation, is still accepted...
        await client.commit(gid, old, answer.generation, "t", {moving: 7})
        d = await client.describe(gid)
        assert [p.owner_member_id for p in d.partitions] == [old, old]
        # ...and only its GetAssignment hands the partition over; the new owner hears of it at once.
        released = await client.assignment(gid, old)
        assert moving not in released.partitions
        event = await watch.read()
        assert (event.generation, event.assignment_changed) == (2, True)
    finally:
        watch.cancel()
    answers = await client.settle(gid, [old, new])
    assert list(answers[1].partitions) == [moving]
    assert await client.committed(gid, "t", moving) == 7  # the new owner starts from the final commit
    code, _ = await status_of(client.commit(gid, old, answer.generation, "t", {moving: 8}))
    assert code == Code.FAILED_PRECONDITION
    await client.commit(gid, new, 2, "t", {moving: 9})
    assert await client.committed(gid, "t", moving) == 9


async def test_commits_at_every_leader_of_a_three_broker_cluster(cluster_factory: Callable[..., ClusterThread]) -> None:
    c3 = cluster_factory(brokers=3, shared_port=False, rebalance_debounce_ms=DEBOUNCE_MS)
    client = Client(c3.bootstrap)
    try:
        await client.create_topic("t", 6)
        assert len({client._leaders[("t", p)] for p in range(6)}) == 3
        gid = (await client.find("t", "app")).group_id
        a, b = await client.join(gid), await client.join(gid)
        answers = await client.settle(gid, [a, b])
        for p in range(6):
            await client.produce("t", p, [b"v"] * (p + 2))
        for member, answer in zip([a, b], answers, strict=True):
            for p in answer.partitions:
                await client.commit(gid, member, answer.generation, "t", {p: 1})
            other = next(x for x in answers if x is not answer).partitions[0]
            code, _ = await status_of(client.commit(gid, member, answer.generation, "t", {other: 1}))
            assert code == Code.FAILED_PRECONDITION
        d = await client.describe(gid)
        assert [(p.committed_offset, p.log_end_offset, p.lag) for p in d.partitions] == [
            (1, p + 2, p + 1) for p in range(6)
        ]
        assert d.total_lag == sum(p + 1 for p in range(6))
    finally:
        await client.close()


# -- describe, delete ----------------------------------------------------------------------------


async def test_describe_reports_committed_offsets_log_ends_and_lag(client: Client) -> None:
    await client.create_topic("t", 3)
    await client.produce("t", 0, [b"a"] * 10)
    await client.produce("t", 1, [b"b"] * 4)
    gid = (await client.find("t", "app", pb.SUBSCRIPTION_MODE_ALL)).group_id
    a = await client.join(gid, "worker")
    (answer,) = await client.settle(gid, [a])
    await client.commit(gid, a, answer.generation, "t", {0: 6})
    d = await client.describe(gid)
    assert d.subscription.mode == pb.SUBSCRIPTION_MODE_ALL
    rows = [(p.partition, p.committed_offset, p.log_end_offset, p.lag, p.owner_member_id) for p in d.partitions]
    # Partition 1 has nothing committed: the group would read it all (mode `all`), so its lag is 4.
    assert rows == [(0, 6, 10, 4, a), (1, -1, 4, 4, a), (2, -1, 0, 0, a)]
    assert d.total_lag == 8


async def test_delete_group_only_when_empty_and_it_takes_the_offsets(client: Client, fast: ClusterThread) -> None:
    await client.create_topic("t", 1)
    await client.produce("t", 0, [b"a"] * 3)
    gid = (await client.find("t", "app")).group_id
    a = await client.join(gid)
    (answer,) = await client.settle(gid, [a])
    await client.commit(gid, a, answer.generation, "t", {0: 2})
    code, details = await status_of(client.groups.DeleteGroup(pb.DeleteGroupRequest(group_id=gid), timeout=TIMEOUT_S))
    assert code == Code.FAILED_PRECONDITION and "1 active member(s)" in details
    await client.leave(gid, a)
    await client.groups.DeleteGroup(pb.DeleteGroupRequest(group_id=gid), timeout=TIMEOUT_S)
    assert await client.committed(gid, "t", 0) == -1
    assert (await client.groups.ListGroups(pb.ListGroupsRequest(), timeout=TIMEOUT_S)).groups == []
    assert fast.call(fast.cluster.coordinator.store.load_groups()) == []
    code, _ = await status_of(client.describe(gid))
    assert code == Code.NOT_FOUND
    assert (await client.find("t", "app")).created  # a new group, starting over


# -- topics change underneath --------------------------------------------------------------------


async def test_added_partitions_are_assigned_by_a_rebalance(client: Client) -> None:
    await client.create_topic("t", 2)
    gid = (await client.find("t", "app")).group_id
    a = await client.join(gid)
    await client.settle(gid, [a])
    await client.meta.AddPartitions(pb.AddPartitionsRequest(name="t", partitions=4), timeout=TIMEOUT_S)
    answer = await client.assignment(gid, a, WAIT_MS)
    for _ in range(5):
        if not answer.rebalance_in_progress and len(answer.partitions) == 4:
            break
        answer = await client.assignment(gid, a, WAIT_MS)
    assert list(answer.partitions) == [0, 1, 2, 3] and answer.generation == 2


async def test_deleting_the_topic_deletes_its_groups(client: Client, fast: ClusterThread) -> None:
    await client.create_topic("t", 1)
    gid = (await client.find("t", "app")).group_id
    a = await client.join(gid)
    await client.meta.DeleteTopic(pb.DeleteTopicRequest(name="t"), timeout=TIMEOUT_S)
    code, _ = await status_of(client.heartbeat(gid, a))
    assert code == Code.NOT_FOUND
    assert (await client.groups.ListGroups(pb.ListGroupsRequest(), timeout=TIMEOUT_S)).groups == []
    assert fast.call(fast.cluster.coordinator.store.load_groups()) == []


# -- failures ------------------------------------------------------------------------------------


async def test_a_group_that_cannot_be_saved_is_not_created(
    client: Client, fast: ClusterThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    await client.create_topic("t", 1)
    store = fast.cluster.coordinator.store

    async def broken_save(record: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(store, "save_group", broken_save)
    code, details = await status_of(client.find("t", "app"))
    assert code == Code.UNAVAILABLE and "disk full" in details
    assert (await client.groups.ListGroups(pb.ListGroupsRequest(), timeout=TIMEOUT_S)).groups == []
    code, _ = await status_of(client.groups.JoinGroup(pb.JoinGroupRequest(group_id="G_t_app"), timeout=TIMEOUT_S))
    assert code == Code.NOT_FOUND
    monkeypatch.undo()
    assert (await client.find("t", "app")).created


async def test_an_unexpected_error_is_internal_and_the_service_keeps_serving(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    await client.create_topic("t", 1)
    gid = (await client.find("t", "app")).group_id
    a = await client.join(gid)

    def broken(*args: object) -> None:
        raise ZeroDivisionError("bug")

    monkeypatch.setattr(machine, "handle_heartbeat", broken)
    code, details = await status_of(client.heartbeat(gid, a))
    assert code == Code.INTERNAL and "ZeroDivisionError" in details
    monkeypatch.undo()
    await client.heartbeat(gid, a)  # the member is still there and the service still serves


# -- lifecycle -----------------------------------------------------------------------------------


async def test_coordinator_restart_keeps_groups_and_their_members(
    cluster_factory: Callable[..., ClusterThread], tmp_path: pathlib.Path
) -> None:
    data_dir = tmp_path / "restart"
    first = ClusterThread(ClusterOptions(data_dir=data_dir, rebalance_debounce_ms=DEBOUNCE_MS)).start()
    client = Client(first.bootstrap)
    try:
        await client.create_topic("t", 2)
        await client.produce("t", 0, [b"a"] * 5)
        await client.produce("t", 1, [b"b"] * 5)
        gid = (await client.find("t", "old", pb.SUBSCRIPTION_MODE_ALL)).group_id
        new_gid = (await client.find("t", "fresh", pb.SUBSCRIPTION_MODE_NEW)).group_id
        a = await client.join(gid)
        (answer,) = await client.settle(gid, [a])
        await client.commit(gid, a, answer.generation, "t", {0: 3, 1: 4})
    finally:
        await client.close()
        first.stop()

    second = cluster_factory(data_dir=data_dir, rebalance_debounce_ms=DEBOUNCE_MS)
    client = Client(second.bootstrap)
    try:
        await client.refresh("t")
        groups = (await client.groups.ListGroups(pb.ListGroupsRequest(), timeout=TIMEOUT_S)).groups
        # The group resumed with its member (issue 28): same id and secret, same generation, same
        # ownership, so its commits go on; a new member continues the generation count.
        assert sorted((g.group_id, g.state, g.member_count) for g in groups) == [
            (new_gid, pb.GROUP_STATE_EMPTY, 0), (gid, pb.GROUP_STATE_STABLE, 1)
        ]
        found = await client.find("t", "fresh", pb.SUBSCRIPTION_MODE_ALL)
        assert not found.created and found.subscription.mode == pb.SUBSCRIPTION_MODE_NEW
        assert (await client.heartbeat(gid, a, answer.generation)).generation == answer.generation
        assert [await client.committed(gid, "t", p) for p in (0, 1)] == [3, 4]
        await client.commit(gid, a, answer.generation, "t", {0: 4})
        assert await client.committed(gid, "t", 0) == 4
        code, _ = await status_of(client.commit(gid, a, answer.generation + 1, "t", {0: 5}))
        assert code == Code.FAILED_PRECONDITION  # a generation it never had is fenced, as before
        again = await client.join(gid)
        answers = await client.settle(gid, [a, again])
        assert {r.generation for r in answers} == {answer.generation + 1}
        assert sorted(p for r in answers for p in r.partitions) == [0, 1]
        assert await client.fetch("t", 0, 3) == [(3, b"a"), (4, b"a")]
        fresh_member = await client.join(new_gid)
        (fresh,) = await client.settle(new_gid, [fresh_member])
        assert [(s.partition, s.offset) for s in fresh.start_positions] == [(0, 5), (1, 5)]  # the snapshot survived
    finally:
        await client.close()


async def test_rpcs_before_start_are_unavailable_and_stop_without_start_is_safe(tmp_path: pathlib.Path) -> None:
    node = CoordinatorNode(tmp_path / "c", advertised_address="127.0.0.1:1")
    server = grpc.aio.server(options=server_options())
    port = server.add_insecure_port("127.0.0.1:0")
    node.add_to_server(server)
    await server.start()
    try:
        async with member_secrets.aio_channel(f"127.0.0.1:{port}", options=channel_options()) as channel:
            stub = pb_grpc.GroupCoordinatorStub(channel)
            code, details = await status_of(stub.ListGroups(pb.ListGroupsRequest(), timeout=TIMEOUT_S))
            assert code == Code.UNAVAILABLE and "retry" in details
    finally:
        await server.stop(0)
    assert "serving=False" in repr(node.groups)
    await asyncio.wait_for(node.groups.stop(), TIMEOUT_S)
    await asyncio.wait_for(node.groups.stop(), TIMEOUT_S)


async def test_stopping_the_service_ends_watch_streams_and_long_polls(client: Client, fast: ClusterThread) -> None:
    await client.create_topic("t", 1)
    gid = (await client.find("t", "app")).group_id
    a, b = await client.join(gid), await client.join(gid)
    await client.settle(gid, [a, b])
    watch = client.groups.WatchGroup(pb.WatchGroupRequest(group_id=gid, member_id=a), timeout=TIMEOUT_S)
    await watch.read()
    c = await client.join(gid)  # owns nothing until a rebalance: its long poll waits
    poll = asyncio.ensure_future(client.assignment(gid, c, WAIT_MS))
    await client.generation_started(gid, a, 2)
    fast.call(fast.cluster.coordinator.groups.stop())
    for _ in range(3):  # events sent before the stop, then the end
        if await watch.read() is grpc.aio.EOF:
            break
    assert await watch.code() == Code.OK
    assert (await asyncio.wait_for(poll, TIMEOUT_S)).rebalance_in_progress
    code, details = await status_of(client.heartbeat(gid, a))
    assert code == Code.UNAVAILABLE and "stopping" in details



async def test_a_member_whose_poll_age_passes_max_poll_interval_is_removed(client: Client) -> None:
    """The heartbeat thread alone does not keep a stuck application in the group."""
    await client.create_topic("t", 2)
    gid = (await client.find("t", "app")).group_id
    stuck = await client.join(gid, max_poll_interval_ms=1_000)
    alive = await client.join(gid)
    await client.settle(gid, [stuck, alive])
    await client.groups.Heartbeat(
        pb.HeartbeatRequest(group_id=gid, member_id=stuck, generation=1, poll_age_ms=5_000), timeout=TIMEOUT_S
    )
    await client.generation_started(gid, alive, 2)
    (answer,) = await client.settle(gid, [alive])
    assert list(answer.partitions) == [0, 1]
    code, _ = await status_of(client.heartbeat(gid, stuck))
    assert code == Code.NOT_FOUND
    code, details = await status_of(
        client.groups.Heartbeat(
            pb.HeartbeatRequest(group_id=gid, member_id=alive, generation=2, poll_age_ms=-1), timeout=TIMEOUT_S
        )
    )
    assert code == Code.INVALID_ARGUMENT and "poll_age_ms" in details
