"""Subscription modes end to end (DESIGN.md "Subscription modes"): where a group with no committed
offset starts, driven through the raw grpc.aio stubs (FindOrCreateGroup, JoinGroup, GetAssignment,
broker Produce / ListOffsets / Fetch) and, once, through the real DMQConsumer.

A member reads a partition the way a client does: from its committed offset if there is one, else
from the StartPosition the coordinator hands out (>= 0 exact, -2 log start, -3 ListOffsets by the
subscription's time).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

import pytest

from dmq.client.cli.runner import ClusterThread
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import records
from dmq.proto.grpc_options import channel_options
from tests import member_secrets

DEBOUNCE_MS = 50
WAIT_MS = 5_000
TIMEOUT_S = 10.0
START_AT_LOG_START = -2
START_BY_TIMESTAMP = -3

ALL, NEW, TIMESTAMP, DEFAULT = (
    pb.SUBSCRIPTION_MODE_ALL, pb.SUBSCRIPTION_MODE_NEW, pb.SUBSCRIPTION_MODE_TIMESTAMP,
    pb.SUBSCRIPTION_MODE_UNSPECIFIED,
)


class Client:
    def __init__(self, bootstrap: str) -> None:
        self.channel = member_secrets.aio_channel(bootstrap, options=channel_options())
        self.groups = pb_grpc.GroupCoordinatorStub(self.channel)
        self.meta = pb_grpc.MetadataStub(self.channel)
        self.broker = pb_grpc.BrokerStub(self.channel)  # one broker sharing the coordinator's port

    async def produce(self, topic: str, partition: int, *values: bytes) -> pb.ProduceResponse:
        return await self.broker.Produce(
            pb.ProduceRequest(topic=topic, partition=partition, batch=records.encode(list(values))), timeout=TIMEOUT_S
        )

    async def subscribe(self, topic: str, app_id: str, mode: int, from_ms: int = 0) -> tuple[str, str, pb.Subscription]:
        found = await self.groups.FindOrCreateGroup(
            pb.FindOrCreateGroupRequest(
                topic=topic, app_id=app_id, subscription_mode=mode, subscription_from_ms=from_ms
            ),
            timeout=TIMEOUT_S,
        )
        joined = await self.groups.JoinGroup(pb.JoinGroupRequest(group_id=found.group_id, client_id=app_id),
                                             timeout=TIMEOUT_S)
        return found.group_id, joined.member_id, found.subscription

    async def assignment(self, group_id: str, member_id: str) -> pb.GetAssignmentResponse:
        answer = await self.groups.GetAssignment(
            pb.GetAssignmentRequest(group_id=group_id, member_id=member_id, wait_ms=WAIT_MS),
            timeout=TIMEOUT_S + WAIT_MS / 1000,
        )
        assert not answer.rebalance_in_progress
        return answer

    async def starts(self, group_id: str, member_id: str, topic: str, sub: pb.Subscription) -> dict[int, int]:
        """partition -> the offset the member starts reading at (nothing is committed here)."""
        answer = await self.assignment(group_id, member_id)
        out = {}
        for sp in answer.start_positions:
            offset = sp.offset
            if offset in (START_AT_LOG_START, START_BY_TIMESTAMP):
                ts = -2 if offset == START_AT_LOG_START else sub.from_ms
                query = pb.OffsetQuery(topic=topic, partition=sp.partition, timestamp_ms=ts)
                response = await self.broker.ListOffsets(pb.ListOffsetsRequest(queries=[query]), timeout=TIMEOUT_S)
                offset = response.answers[0].offset
            out[sp.partition] = offset
        return out

    async def read(self, topic: str, partition: int, offset: int) -> list[bytes]:
        response = await self.broker.Fetch(
            pb.FetchRequest(partitions=[pb.FetchPartition(topic=topic, partition=partition, offset=offset)],
                            max_wait_ms=1_000, min_bytes=1),
            timeout=TIMEOUT_S,
        )
        (result,) = response.partitions
        assert result.error == pb.NONE, result.error_message
        return [r.value for b in records.decode_batches(result.records) for r in b if r.offset >= offset]


@pytest.fixture
def fast(cluster_factory: Callable[..., ClusterThread]) -> ClusterThread:
    return cluster_factory(rebalance_debounce_ms=DEBOUNCE_MS)


async def _client(thread: ClusterThread, topic: str = "t", partitions: int = 1) -> Client:
    c = Client(thread.bootstrap)
    await c.meta.CreateTopic(pb.CreateTopicRequest(name=topic, partitions=partitions), timeout=TIMEOUT_S)
    return c


@pytest.fixture
async def client(fast: ClusterThread) -> AsyncIterator[Client]:
    c = await _client(fast)
    yield c
    await c.channel.close()


async def test_new_on_an_empty_partition_receives_the_first_message_after_subscribing(client: Client) -> None:
    gid, member, sub = await client.subscribe("t", "app", NEW)
    assert sub.mode == NEW
    await client.produce("t", 0, b"first")
    start = (await client.starts(gid, member, "t", sub))[0]
    assert start == 0
    assert await client.read("t", 0, start) == [b"first"]


async def test_new_with_history_skips_it_and_receives_the_next_message(client: Client) -> None:
    await client.produce("t", 0, b"old-1", b"old-2", b"old-3")
    gid, member, sub = await client.subscribe("t", "app", NEW)
    await client.produce("t", 0, b"next")
    start = (await client.starts(gid, member, "t", sub))[0]
    assert start == 3
    assert await client.read("t", 0, start) == [b"next"]


async def test_all_receives_everything(client: Client) -> None:
    await client.produce("t", 0, b"old-1", b"old-2")
    gid, member, sub = await client.subscribe("t", "app", ALL)
    await client.produce("t", 0, b"next")
    answer = await client.assignment(gid, member)
    assert [(s.partition, s.offset) for s in answer.start_positions] == [(0, START_AT_LOG_START)]
    start = (await client.starts(gid, member, "t", sub))[0]
    assert await client.read("t", 0, start) == [b"old-1", b"old-2", b"next"]


async def test_two_groups_with_different_modes_on_one_partition_each_get_their_own_view(client: Client) -> None:
    await client.produce("t", 0, b"history")
    g_all, m_all, s_all = await client.subscribe("t", "archiver", ALL)
    g_new, m_new, s_new = await client.subscribe("t", "alerter", NEW)
    await client.produce("t", 0, b"live")
    assert (s_all.mode, s_new.mode) == (ALL, NEW)
    start_all = (await client.starts(g_all, m_all, "t", s_all))[0]
    start_new = (await client.starts(g_new, m_new, "t", s_new))[0]
    assert await client.read("t", 0, start_all) == [b"history", b"live"]
    assert await client.read("t", 0, start_new) == [b"live"]
    # Their commits are their own too.
    answer = await client.assignment(g_all, m_all)
    await client.broker.CommitOffsets(
        pb.CommitOffsetsRequest(group_id=g_all, member_id=m_all, generation=answer.generation,
                                offsets=[pb.PartitionOffset(topic="t", partition=0, offset=2)]),
        timeout=TIMEOUT_S,
    )
    committed = await client.broker.FetchCommittedOffsets(
        pb.FetchCommittedOffsetsRequest(group_id=g_new, partitions=[pb.TopicPartition(topic="t", partition=0)]),
        timeout=TIMEOUT_S,
    )
    assert committed.offsets[0].offset == -1


async def test_the_server_default_applies_to_a_group_that_names_no_mode(
    cluster_factory: Callable[..., ClusterThread],
) -> None:
    thread = cluster_factory(rebalance_debounce_ms=DEBOUNCE_MS, default_subscription_mode="new")
    client = await _client(thread)
    try:
        await client.produce("t", 0, b"before")
        gid, member, sub = await client.subscribe("t", "app", DEFAULT)
        assert sub.mode == NEW
        await client.produce("t", 0, b"after")
        start = (await client.starts(gid, member, "t", sub))[0]
        assert await client.read("t", 0, start) == [b"after"]
        # A group that names a mode gets that one, whatever the default.
        _, _, explicit = await client.subscribe("t", "other", ALL)
        assert explicit.mode == ALL
    finally:
        await client.channel.close()


async def test_a_partition_added_after_the_group_subscribed_is_read_from_its_start(client: Client) -> None:
    await client.produce("t", 0, b"old")
    gid, member, sub = await client.subscribe("t", "app", NEW)
    assert (await client.starts(gid, member, "t", sub)) == {0: 1}
    await client.meta.AddPartitions(pb.AddPartitionsRequest(name="t", partitions=2), timeout=TIMEOUT_S)
    await client.produce("t", 1, b"on-the-new-partition")
    answer = await client.assignment(gid, member)
    for _ in range(5):
        if len(answer.partitions) == 2:
            break
        answer = await client.assignment(gid, member)
    starts = dict((s.partition, s.offset) for s in answer.start_positions)
    assert starts == {0: 1, 1: 0}  # partition 0 keeps its snapshot; nothing on partition 1 is skipped
    assert await client.read("t", 1, starts[1]) == [b"on-the-new-partition"]


async def test_timestamp_starts_at_the_first_message_at_or_after_the_time(client: Client) -> None:
    early = await client.produce("t", 0, b"early")
    later = await client.produce("t", 0, b"later")
    for _ in range(1_000):  # the append clock has millisecond granularity
        if later.log_append_time_ms > early.log_append_time_ms:
            break
        later = await client.produce("t", 0, b"later")
    gid, member, sub = await client.subscribe("t", "app", TIMESTAMP, from_ms=later.log_append_time_ms)
    assert (sub.mode, sub.from_ms) == (TIMESTAMP, later.log_append_time_ms)
    answer = await client.assignment(gid, member)
    assert [(s.partition, s.offset) for s in answer.start_positions] == [(0, START_BY_TIMESTAMP)]
    start = (await client.starts(gid, member, "t", sub))[0]
    got = await client.read("t", 0, start)
    assert start == later.base_offset and b"early" not in got and got[0] == b"later"


def test_new_mode_through_the_dmq_consumer(fast: ClusterThread) -> None:
    """The real client: it joins, gets its StartPosition and reads only what came after."""
    from dmq.client.consumer import DMQConsumer

    channel = member_secrets.sync_channel(fast.bootstrap, options=channel_options())
    try:
        pb_grpc.MetadataStub(channel).CreateTopic(pb.CreateTopicRequest(name="t", partitions=2), timeout=TIMEOUT_S)
        broker = pb_grpc.BrokerStub(channel)

        def produce(partition: int, value: bytes) -> None:
            broker.Produce(pb.ProduceRequest(topic="t", partition=partition, batch=records.encode([value])),
                           timeout=TIMEOUT_S)

        produce(0, b"history-0")
        produce(1, b"history-1")
        with DMQConsumer(metadata_service_url=fast.bootstrap, group_id="app", subscription_mode="new",
                         heartbeat_interval_ms=200) as consumer:
            consumer.subscribe("t")
            deadline = time.monotonic() + TIMEOUT_S
            while len(consumer.assignment()) < 2 and time.monotonic() < deadline:
                assert list(consumer.poll(200)) == []
            produce(0, b"new-0")
            produce(1, b"new-1")
            got: list[bytes] = []
            while len(got) < 2 and time.monotonic() < deadline:
                got += [r.value for r in consumer.poll(500)]
        assert sorted(got) == [b"new-0", b"new-1"]
    finally:
        channel.close()


async def test_describe_counts_lag_from_where_the_subscription_starts(client: Client) -> None:
    await client.produce("t", 0, b"h1", b"h2", b"h3")
    g_new, _, _ = await client.subscribe("t", "alerter", NEW)
    g_all, _, _ = await client.subscribe("t", "archiver", ALL)
    await client.produce("t", 0, b"n1", b"n2")
    for gid in (g_new, g_all):
        answer = await client.groups.DescribeGroup(pb.DescribeGroupRequest(group_id=gid), timeout=TIMEOUT_S)
        (p,) = answer.partitions
        expected = 2 if gid == g_new else 5  # `new` never reads the history, so it is no lag
        assert (p.committed_offset, p.log_end_offset, p.lag, answer.total_lag) == (-1, 5, expected, expected)
