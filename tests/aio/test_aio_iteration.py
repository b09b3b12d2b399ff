"""``async for record in consumer``: each record handed out once, and commits covering exactly the
records returned, when the loop is left, the consumer stopped or reopened in the middle of a
buffered chunk (the iterator drains a chunk without looking at the consumer between records: these
tests pin down that every way of stopping the hand-out still takes effect at once)."""

from __future__ import annotations

import asyncio
import time

import pytest

from dmq.client.aio import AsyncConsumer, AsyncProducer
from dmq.client.consumer import TopicPartition
from dmq.client.errors import SerializationError
from dmq.client.serializers import json_deserializer, str_deserializer
from tests.aio.conftest import FAST, create, produce

pytestmark = pytest.mark.timeout(60)

WAIT_S = 10.0  # bound on waiting for records that were produced before


async def read(consumer: AsyncConsumer, n: int, seen: list[tuple[int, int]]) -> None:
    """Append the (partition, offset) of the next n records of ``async for``, then leave the loop."""

    async def loop() -> None:
        if n == 0:
            return
        got = 0
        async for r in consumer:
            seen.append((r.partition, r.offset))
            got += 1
            if got == n:
                break

    await asyncio.wait_for(loop(), WAIT_S)


def buffered_left(consumer: AsyncConsumer) -> int:
    """Records fetched for ``async for`` and not handed out: > 0 means the loop was left mid-chunk."""
    return sum(chunk.left() for chunk in consumer._pending)


async def test_each_record_once_across_stops_mid_chunk_commits_and_reopens(server):
    """Rounds of: open, ``async for`` part of the records, break mid-chunk, commit (explicitly, or
    by stop() with auto-commit on), stop. The next round starts exactly after the last record
    returned: together the rounds return every record once."""
    n = 600
    await create(server.bootstrap, "once", 3)
    stored = await produce(server.bootstrap, "once", n)
    seen: list[tuple[int, int]] = []
    kw = dict(FAST, bootstrap_servers=server.bootstrap, group_id="app", max_poll_records=50)
    for take, auto_commit in [(37, False), (1, True), (113, False), (49, True), (251, False)]:
        async with AsyncConsumer("once", enable_auto_commit=auto_commit, **kw) as consumer:
            await read(consumer, take, seen)
            assert buffered_left(consumer) > 0, "the loop was meant to be left in the middle of a chunk"
            if not auto_commit:
                await consumer.commit()
    async with AsyncConsumer("once", enable_auto_commit=False, **kw) as consumer:
        await read(consumer, n - len(seen), seen)
        assert await consumer.getmany(timeout_ms=300) == {}  # nothing left, nothing returned twice
    assert len(seen) == len(set(seen)) == n, f"{len(seen) - len(set(seen))} returned twice"
    assert set(seen) == set(stored)


async def test_commit_after_breaking_out_covers_exactly_the_records_returned(server):
    await create(server.bootstrap, "exact", 3)
    await produce(server.bootstrap, "exact", 300)
    kw = dict(FAST, bootstrap_servers=server.bootstrap, group_id="app", enable_auto_commit=False, max_poll_records=40)
    async with AsyncConsumer("exact", **kw) as consumer:
        seen: list[tuple[int, int]] = []
        await read(consumer, 57, seen)
        assert buffered_left(consumer) > 0
        last = {}
        for p, offset in seen:  # in offset order within a partition
            last[p] = offset
        await consumer.commit()
        assignment = consumer.assignment()
        assert assignment == {TopicPartition("exact", p) for p in range(3)}
        for tp in assignment:
            returned_up_to = last[tp.partition] + 1 if tp.partition in last else 0
            assert await consumer.position(tp) == returned_up_to
            assert (await consumer.committed(tp) or 0) == returned_up_to, tp
        # A new loop over the same consumer goes on right after the last record returned in
        # every partition: the rest of the chunk the first loop left is neither lost nor repeated.
        first_next: dict[int, int] = {}

        async def next_of_each_partition() -> None:
            async for r in consumer:
                first_next.setdefault(r.partition, r.offset)
                if len(first_next) == 3:
                    break

        await asyncio.wait_for(next_of_each_partition(), WAIT_S)
        assert first_next == {p: last.get(p, -1) + 1 for p in range(3)}


async def test_seek_and_stop_inside_the_loop_take_effect_at_the_next_record(server):
    await create(server.bootstrap, "inside", 1)
    await produce(server.bootstrap, "inside", 100)
    tp = TopicPartition("inside", 0)
    kw = dict(FAST, bootstrap_servers=server.bootstrap, group_id="app", max_poll_records=50)
    offsets: list[int] = []
    consumer = AsyncConsumer("inside", **kw)
    await consumer.start()
    try:

        async def loop() -> None:
            async for r in consumer:
                offsets.append(r.offset)
                if r.offset == 10 and len(offsets) == 11:
                    consumer.seek(tp, 70)  # the chunk being drained holds 11..49: none of them comes
                elif r.offset == 80:
                    await consumer.stop()  # ends the loop: 81.. were buffered, none comes

        await asyncio.wait_for(loop(), WAIT_S)
    finally:
        await consumer.stop()
    assert offsets == list(range(11)) + list(range(70, 81))


async def test_async_for_through_a_rebalance_loses_and_repeats_nothing(server):
    """A second member joins while the first is in an ``async for``: the records the first
    returned are committed before it hands partitions over, and the second starts exactly there."""
    n = 1500
    await create(server.bootstrap, "turns", 4)
    await produce(server.bootstrap, "turns", n)
    kw = dict(FAST, bootstrap_servers=server.bootstrap, group_id="app", max_poll_records=30)
    seen1: list[tuple[int, int]] = []
    seen2: list[tuple[int, int]] = []

    async def iterate(consumer: AsyncConsumer, seen: list[tuple[int, int]]) -> None:
        async for r in consumer:
            seen.append((r.partition, r.offset))
            if len(seen) % 10 == 0:
                await asyncio.sleep(0.002)  # both members get turns while the group rebalances

    async def until(done: callable) -> None:
        deadline = time.monotonic() + 20
        while not done() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    async with AsyncConsumer("turns", **kw) as c1:
        t1 = asyncio.create_task(iterate(c1, seen1))
        try:
            await until(lambda: len(seen1) >= 200)
            async with AsyncConsumer("turns", **kw) as c2:
                t2 = asyncio.create_task(iterate(c2, seen2))
                try:
                    await until(lambda: len(seen1) + len(seen2) >= n)
                    await asyncio.sleep(0.3)  # anything returned twice would show up by now
                    assert c1.assignment() and c2.assignment()
                    assert not c1.assignment() & c2.assignment()
                finally:
                    t2.cancel()
        finally:
            t1.cancel()
        await asyncio.gather(t1, t2, return_exceptions=True)
    both = seen1 + seen2
    assert seen2, "the second member got nothing"
    assert len(both) == len(set(both)) == n, f"{len(both) - len(set(both))} duplicates, {n - len(set(both))} never returned"


async def test_deserializers_apply_to_getmany_and_async_for(server):
    """As DMQConsumer: key / value deserializers are applied (they were ignored); a value that
    fails is not skipped: the records before it are returned, then SerializationError names the
    offset, and seek() past it goes on."""
    await create(server.bootstrap, "json", 1)
    async with AsyncProducer(server.bootstrap, linger_ms=1) as producer:
        for i, value in enumerate([b'{"n": 0}', b'{"n": 1}', b"not json", b'{"n": 3}']):
            await producer.send("json", value, key=b"k%d" % i)
    tp = TopicPartition("json", 0)
    kw = dict(FAST, bootstrap_servers=server.bootstrap, group_id="app", key_deserializer=str_deserializer,
              value_deserializer=json_deserializer)
    async with AsyncConsumer("json", **kw) as consumer:
        got = await consumer.getmany(timeout_ms=5_000)
        assert [(r.key, r.value) for r in got[tp]] == [("k0", {"n": 0}), ("k1", {"n": 1})]
        with pytest.raises(SerializationError, match="offset 2"):
            await consumer.getmany(timeout_ms=5_000)
        consumer.seek(tp, 3)
        record = await asyncio.wait_for(anext(aiter(consumer)), WAIT_S)
        assert (record.offset, record.key, record.value) == (3, "k3", {"n": 3})


async def test_async_for_anext_getone_and_getmany_share_one_hand_out(server):
    """Every way of reading, mixed on one consumer (``async for`` left mid-chunk, anext(),
    getone(), getmany()), with a pause / resume mid-chunk: each record is handed out once, and
    each partition's records in offset order, since all of them take from the same chunks."""
    n = 400
    await create(server.bootstrap, "mixed", 2)
    stored = await produce(server.bootstrap, "mixed", n)
    kw = dict(FAST, bootstrap_servers=server.bootstrap, group_id="app", max_poll_records=25)
    seen: list[tuple[int, int]] = []
    async with AsyncConsumer("mixed", **kw) as consumer:
        for round_ in range(200):  # bounded; about 25 rounds read everything
            left = n - len(seen)
            if not left:
                break
            await read(consumer, min(7, left), seen)
            if round_ == 2:
                assert buffered_left(consumer) > 0
                consumer.pause(TopicPartition("mixed", 0))  # its buffered records come again after resume()
                consumer.resume(TopicPartition("mixed", 0))
            for get in (consumer.getone, lambda: anext(consumer)):
                if len(seen) < n:
                    r = await asyncio.wait_for(get(), WAIT_S)
                    seen.append((r.partition, r.offset))
            if len(seen) < n:
                batch = await consumer.getmany(timeout_ms=1_000, max_records=min(5, n - len(seen)))
                seen.extend((r.partition, r.offset) for records in batch.values() for r in records)
        assert await consumer.getmany(timeout_ms=300) == {}
    assert len(seen) == len(set(seen)) == n, f"{len(seen) - len(set(seen))} returned twice"
    assert set(seen) == set(stored)
    for p in (0, 1):
        offsets = [o for q, o in seen if q == p]
        assert offsets == sorted(offsets), f"partition {p} out of order"
