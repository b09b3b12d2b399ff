"""Event-store groups' progress in the offsets log (broker/events/progress.py), in-process over the
real log, offsets store and event store: an ack is applied in the writer and written from the
event loop (store.write_acks); it never undoes a reset made after it, a failed write puts the
groups back to what is durable, and a reopened store finds exactly what was written."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator, Callable
from typing import Any
from dataclasses import dataclass

import pytest

from dmq.broker.events.errors import ClaimNotHeldError
from dmq.broker.events.groups import Claimed, GroupManager
from dmq.broker.events.progress import AckWrite, OffsetProgressStore
from dmq.broker.events.store import EventStore, NewEvent, StoredEvent
from dmq.broker.log import AppendInfo, LogConfig, LogManager, PartitionLog
from dmq.broker.offsets import LocalDurability, OffsetStore

pytestmark = pytest.mark.timeout(30)


@dataclass
class Parts:
    logs: LogManager
    offsets: OffsetStore
    store: EventStore

    async def reopened(self) -> EventStore:
        """The store closed and opened again: its groups as the offsets log has them."""
        await self.store.close()
        loop = asyncio.get_running_loop()
        return EventStore(self.store.plog, progress=lambda: OffsetProgressStore(self.offsets, "es", loop))


@pytest.fixture
async def parts(tmp_path: pathlib.Path) -> AsyncIterator[Parts]:
    logs = LogManager(tmp_path / "logs", LogConfig())
    offsets = OffsetStore(logs, tmp_path)
    await offsets.open()
    config = LogConfig()
    plog = logs.create("es", 0, config)
    offsets.create_log("es", 0, config)
    loop = asyncio.get_running_loop()
    store = EventStore(plog, progress=lambda: OffsetProgressStore(offsets, "es", loop))
    await store.append([NewEvent("t", (f"k:{i}",), b"") for i in range(3)], None)
    await store.groups(lambda g, until, now: g.register("g"))
    p = Parts(logs, offsets, store)
    yield p
    await store.close()
    await offsets.close()
    await asyncio.to_thread(logs.close)


async def claim_and_ack(store: EventStore) -> list[AckWrite]:
    """Claim k:0 and apply its ack in the writer; the write is returned, not made."""
    unwritten: list[AckWrite] = []

    def run(g: GroupManager, until: int, now: int) -> None:
        claimed = g.claim_next("g", ["k"], ["t"], "w", limit=10, timeout_ms=10_000, until=until, now_ms=now)
        assert claimed is not None and claimed.key == "k:0"
        g.ack("g", claimed.key, "w", claimed.last_position, now, until, unwritten=unwritten)

    await store.groups(run)
    return unwritten


async def acked(store: EventStore) -> dict[str, int]:
    record = await store.groups(lambda g, until, now: g.record("g"))
    assert record is not None
    return {k: position for k, (_, position) in record.partitions.items()}


async def test_an_ack_written_after_a_later_reset_is_refused_and_the_reset_stands(parts: Parts) -> None:
    unwritten = await claim_and_ack(parts.store)
    await parts.store.groups(lambda g, until, now: g.reset("g"))
    with pytest.raises(ClaimNotHeldError, match="was reset"):
        await parts.store.write_acks(unwritten)
    reopened = await parts.reopened()
    try:
        assert await acked(reopened) == {}  # the reset's tombstones were not undone
    finally:
        await reopened.close()


async def test_a_written_ack_is_durable_and_a_failed_one_reloads_the_groups(parts: Parts) -> None:
    await parts.store.write_acks(await claim_and_ack(parts.store))
    assert (await acked(parts.store))["k:0"] == 1

    class Failing(LocalDurability):
        async def wait(self, plog: PartitionLog, info: AppendInfo, epoch: int) -> None:
            raise OSError(5, "I/O error")

    # k:1 acknowledged in memory; its write fails: the view goes back to the durable state
    unwritten: list[AckWrite] = []

    def ack_next(g: GroupManager, until: int, now: int) -> None:
        claimed = g.claim_next("g", ["k"], ["t"], "w", limit=10, timeout_ms=10_000, until=until, now_ms=now)
        assert claimed is not None and claimed.key == "k:1"
        g.ack("g", claimed.key, "w", claimed.last_position, now, until, unwritten=unwritten)

    await parts.store.groups(ack_next)
    assert (await acked(parts.store))["k:1"] == 2
    parts.offsets.durability = Failing()
    with pytest.raises(OSError, match="I/O error"):
        await parts.store.write_acks(unwritten)
    parts.offsets.durability = LocalDurability()
    assert await acked(parts.store) == {"k:0": 1, "k:1": 0, "k:2": 0}
    reopened = await parts.reopened()
    try:
        assert await acked(reopened) == {"k:0": 1, "k:1": 0, "k:2": 0}
    finally:
        await reopened.close()


def claim_for(worker: str) -> Callable[[GroupManager, int, int], list[Claimed]]:
    def run(g: GroupManager, until: int, now: int) -> list[Claimed]:
        claimed = g.claim_next("g", ["k"], ["t"], worker, limit=10, timeout_ms=10_000, until=until, now_ms=now)
        return [] if claimed is None else [claimed]

    return run


def riding_ack(key: str, position: int) -> Callable[[GroupManager, int, int], tuple[Exception | None, list[AckWrite]]]:
    def apply(g: GroupManager, until: int, now: int) -> tuple[Exception | None, list[AckWrite]]:
        unwritten: list[AckWrite] = []
        g.ack("g", key, "w", position, now, until, unwritten=unwritten)
        return None, unwritten

    return apply


async def claim(store: EventStore, worker: str, **kwargs: Any) -> tuple[Claimed | None, list[StoredEvent]]:
    """One claim (store.claim_all with a one-claim fn)."""
    claims, loaded = await store.claim_all(claim_for(worker), claimant=("g", worker), **kwargs)
    return (claims[0], loaded[0]) if claims else (None, [])


class Blocked(LocalDurability):
    """Offsets writes wait until `go` is set: the test sees what happens while one is being made."""

    def __init__(self) -> None:
        self.waiting = asyncio.Event()
        self.go = asyncio.Event()

    async def wait(self, plog: PartitionLog, info: AppendInfo, epoch: int) -> None:
        self.waiting.set()
        await self.go.wait()
        await super().wait(plog, info, epoch)


async def test_a_riding_ack_is_durable_before_its_claim_answers_and_the_claim_is_made_meanwhile(parts: Parts) -> None:
    store = parts.store
    first, _ = await claim(store, "w")
    assert first is not None and first.key == "k:0"
    blocked = Blocked()
    parts.offsets.durability = blocked
    task = asyncio.create_task(claim(store, "w", acks=riding_ack("k:0", 1)))
    await blocked.waiting.wait()
    # the claim was computed while the ack's write waits (a later writer job sees it) ...
    claims = await store.groups(lambda g, until, now: g.describe("g", until, now, 10)[1])
    assert {p.key: p.claimed_by for p in claims if p.claimed_by} == {"k:1": "w"}
    assert not task.done()  # ... but it is not answered before the ack is durable
    blocked.go.set()
    claimed, events = await task
    assert claimed is not None and claimed.key == "k:1" and [e.position for e in events] == [2]
    reopened = await parts.reopened()
    try:
        assert (await acked(reopened))["k:0"] == 1
    finally:
        await reopened.close()


async def test_a_riding_ack_whose_write_fails_is_not_done_and_loses_no_claim(parts: Parts) -> None:
    store = parts.store
    first, _ = await claim(store, "w")
    assert first is not None and first.key == "k:0"

    class Failing(LocalDurability):
        async def wait(self, plog: PartitionLog, info: AppendInfo, epoch: int) -> None:
            raise OSError(5, "I/O error")

    parts.offsets.durability = Failing()
    with pytest.raises(OSError, match="I/O error"):
        await claim(store, "w", acks=riding_ack("k:0", 1))
    parts.offsets.durability = LocalDurability()
    # the ack is not stored, and the claim computed beside it is held by nobody: another worker
    # gets every partition, k:0 first (its event is pending again)
    assert await acked(store) == {"k:0": 0, "k:1": 0, "k:2": 0}
    got = []
    while (claimed := (await claim(store, "w2"))[0]) is not None:
        got.append(claimed.key)
    assert got == ["k:0", "k:1", "k:2"]
