"""AsyncConsumer answers as aiokafka's AIOKafkaConsumer does where aiokafka has the method (issue
26 item 11): getmany(timeout_ms=, max_records=), getone(), ``async for``, partitions_for_topic(),
topics(), beginning_offsets() / end_offsets() and offsets_for_times() giving OffsetAndTimestamp."""

from __future__ import annotations

import asyncio
import time

import pytest

from dmq.client.aio import AsyncAdminClient, AsyncConsumer
from dmq.client.consumer import OffsetAndTimestamp, TopicPartition
from tests.aio.conftest import FAST, create, produce

pytestmark = pytest.mark.timeout(60)

WAIT_S = 10.0
TP0, TP1 = TopicPartition("t", 0), TopicPartition("t", 1)


async def test_getmany_getone_and_async_for(server):
    await create(server.bootstrap, "t", 1)
    await produce(server.bootstrap, "t", 5)
    async with AsyncConsumer("t", bootstrap_servers=server.bootstrap, group_id="g", **FAST) as c:
        first = await asyncio.wait_for(c.getone(), WAIT_S)
        batch: dict = {}
        deadline = time.monotonic() + WAIT_S
        while not batch and time.monotonic() < deadline:
            batch = await c.getmany(timeout_ms=200, max_records=2)
        assert list(batch) == [TP0] and len(batch[TP0]) == 2
        rest = []
        async for msg in c:
            rest.append(msg.value)
            if len(rest) == 2:
                break
        assert [first.value, *(m.value for m in batch[TP0]), *rest] == [b"0", b"1", b"2", b"3", b"4"]


async def test_partitions_for_topic_topics_and_offset_look_ups(server):
    await create(server.bootstrap, "t", 2)
    await create(server.bootstrap, "other", 3)
    await produce(server.bootstrap, "t", 4, keyed=False)
    async with AsyncConsumer("t", bootstrap_servers=server.bootstrap, group_id="g", **FAST) as c:
        assert await c.topics() == {"t", "other"}
        async with AsyncAdminClient(server.bootstrap) as admin:
            await admin.create_topic("later", 1)
        assert await c.topics() == {"t", "other", "later"}
        assert c.partitions_for_topic("t") == {0, 1}
        assert c.partitions_for_topic("other") == {0, 1, 2}
        assert c.partitions_for_topic("missing") is None
        ends = await c.end_offsets([TP0, TP1])
        assert await c.beginning_offsets([TP0, TP1]) == {TP0: 0, TP1: 0}
        assert sum(ends.values()) == 4
        full = TP0 if ends[TP0] else TP1
        first = None
        deadline = time.monotonic() + WAIT_S
        while first is None and time.monotonic() < deadline:
            batch = await c.getmany(full, timeout_ms=200)
            first = batch[full][0] if batch else None
        assert first is not None and first.offset == 0
        found = await c.offsets_for_times({full: 0})
        assert found == {full: OffsetAndTimestamp(0, first.timestamp)}
        assert isinstance(found[full], OffsetAndTimestamp)
        future = await c.offsets_for_times({full: int(time.time() * 1000) + 3_600_000})
        assert future == {full: None}
