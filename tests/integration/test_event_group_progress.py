"""Event-store groups' progress in the offsets log (broker/events/progress.py), in-process over the
real log, offsets store and event store: an ack is applied in the writer and written from the
event loop (store.write_acks); it never undoes a reset made after it, a failed write puts the
groups back to what is durable, and a reopened store finds exactly what was written."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest

from dmq.broker.events.errors import EventClaimNotHeldError
from dmq.broker.events.groups import Claimed, GroupManager
from dmq.broker.events.progress import AckWrite, OffsetProgressStore
from dmq.broker.events.store import EventStore, NewEvent
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
    with pytest.raises(EventClaimNotHeldError, match="was reset"):
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



def claim_for(worker: str) -> Callable[[GroupManager, int, int], tuple[None, list[Claimed]]]:
    def run(g: GroupManager, until: int, now: int) -> tuple[None, list[Claimed]]:
        claimed = g.claim_next("g", ["k"], ["t"], worker, limit=10, timeout_ms=10_000, until=until, now_ms=now)
        return None, [] if claimed is None else [claimed]

    return run


async def claim(store: EventStore, worker: str) -> Claimed | None:
    (_, claims), _ = await store.claim_all(claim_for(worker))
    return claims[0] if claims else None


async def test_a_riding_ack_whose_write_fails_is_not_done_and_loses_no_claim(parts: Parts) -> None:
    """EventClaimNext's shape: the ack applied and the next claim made in one writer job, then the
    ack written; the write fails: the ack is not stored, and the claim made beside it is held by
    nobody (the groups are reloaded from what is durable), so no event waits for a worker that
    was never told of it."""
    store = parts.store
    first = await claim(store, "w")
    assert first is not None and first.key == "k:0"
    unwritten: list[AckWrite] = []

    def ack_and_claim(g: GroupManager, until: int, now: int) -> tuple[None, list[Claimed]]:
        g.ack("g", "k:0", "w", 1, now, until, unwritten=unwritten)
        return claim_for("w")(g, until, now)

    (_, claims), _ = await store.claim_all(ack_and_claim)
    assert [c.key for c in claims] == ["k:1"]

    class Failing(LocalDurability):
        async def wait(self, plog: PartitionLog, info: AppendInfo, epoch: int) -> None:
            raise OSError(5, "I/O error")

    parts.offsets.durability = Failing()
    with pytest.raises(OSError, match="I/O error"):
        await store.write_acks(unwritten)
    parts.offsets.durability = LocalDurability()
    assert await acked(store) == {"k:0": 0, "k:1": 0, "k:2": 0}
    got = []
    while (claimed := await claim(store, "w2")) is not None:
        got.append(claimed.key)
    assert got == ["k:0", "k:1", "k:2"]
