"""Queue leases as records of the partition's offsets log (issue 15 item 6), without servers: a
grant, a renewal and a reject's narrowing are entries; an ack's end is a tombstone in the same
batch as its progress; a store replayed from the log (a restart, or a new leader) gives back the
live leases, and the lease table restores them with the time they had left by the wall clock."""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib

from dmq.broker.log import LogConfig, LogManager
from dmq.broker.offsets import CommittedOffset, OffsetStore, offsets_log_topic
from dmq.broker.queue.leases import LeaseTable, StoredLease
from dmq.broker.queue.progress import LEASE_ENDED, LEASE_KEY_PREFIX, OffsetProgressStore, Progress
from dmq.proto import records

CONFIG = LogConfig()


def _open(data_dir: pathlib.Path) -> tuple[LogManager, OffsetStore, OffsetProgressStore]:
    logs = LogManager(data_dir / "logs", CONFIG)
    logs.open_existing()
    store = OffsetStore(logs, data_dir)
    for p in range(2):
        if ("t", p) not in logs.partitions():
            logs.create("t", p, CONFIG)
            store.create_log("t", p, CONFIG)
    return logs, store, OffsetProgressStore(store)


def _batches(logs: LogManager, partition: int) -> list[list[tuple[bytes, bytes]]]:
    plog = logs.get(offsets_log_topic("t"), partition)
    data = plog.read(0, 1 << 20)
    return [[(bytes(r.key or b""), bytes(r.value)) for r in b] for b in records.decode_batches(data)]


def test_lease_entries_survive_a_replay_and_an_ack_ends_the_lease_in_its_progress_batch(tmp_path: pathlib.Path) -> None:
    async def write() -> None:
        logs, store, progress = _open(tmp_path)
        await store.open()
        table = LeaseTable()
        a = table.grant("t", 0, "g", 0, 5, 30_000, now=100.0, now_ms=1_000_000)
        b = table.grant("t", 0, "other", 3, 4, 2_000, now=100.0, now_ms=1_000_000)
        c = table.grant("t", 1, "g", 7, 9, 30_000, now=100.0, now_ms=1_000_000)
        for lease in (a, b, c):
            await progress.save("t", lease.partition, lease.group, None, lease)
        table.renew(a, 60_000, now=101.0, now_ms=1_001_000)
        await progress.save("t", 0, "g", None, a)  # the renewal's entry replaces the grant's
        # a reject narrows the lease: progress and the narrowed lease in one batch
        await progress.save("t", 0, "other", Progress(4), dataclasses.replace(b, start_offset=4))
        # the ack of c: its progress and the lease's tombstone in one batch
        await progress.save("t", 1, "g", Progress(9), LEASE_ENDED)
        last = _batches(logs, 1)[-1]
        assert [k for k, _ in last] == [b"queue:g", LEASE_KEY_PREFIX.encode() + b"g"] and last[1][1] == b""
        assert progress.stored_leases("t", 1) == {}
        await store.close()
        logs.close()

    asyncio.run(write())

    async def replay() -> None:
        logs, store, progress = _open(tmp_path)
        await store.open()
        progress.load()
        assert progress.lease_partitions() == {("t", 0)}
        stored = progress.stored_leases("t", 0)
        assert set(stored) == {"g", "other"}
        assert (stored["g"].start_offset, stored["g"].end_offset, stored["g"].lease_ms, stored["g"].expiry_ms) == (
            0, 5, 60_000, 1_061_000)
        assert (stored["other"].start_offset, stored["other"].end_offset) == (4, 4)
        assert progress.get("t", 0, "other") == Progress(4) and progress.get("t", 1, "g") == Progress(9)
        await store.close()
        logs.close()

    asyncio.run(replay())


def test_an_unreadable_lease_entry_is_ignored(tmp_path: pathlib.Path) -> None:
    async def run() -> None:
        logs, store, progress = _open(tmp_path)
        await store.open()
        await store.put("t", 0, [(LEASE_KEY_PREFIX + "g", CommittedOffset(0, "not json", 0))])
        assert progress.stored_leases("t", 0) == {}
        await store.close()
        logs.close()

    asyncio.run(run())


def test_restore_keeps_the_id_and_the_wall_clock_time_left_and_replaces_a_stale_lease() -> None:
    table = LeaseTable()
    stale = table.grant("t", 0, "g", 0, 2, 30_000, now=0.0, now_ms=0)
    stored = StoredLease("abc", 2, 6, 10_000, expiry_ms=50_000)
    lease = table.restore("t", 0, "g", stored, now=1_000.0, now_ms=46_000)  # 4 s left
    assert table.held("t", 0, "g") is lease and table.get(stale.lease_id, 1_000.0) is None
    assert (lease.lease_id, lease.start_offset, lease.end_offset, lease.expiry_ms) == ("abc", 2, 6, 50_000)
    assert table.get("abc", 1_003.9) is lease and table.expired(1_003.9) == []
    assert table.expired(1_004.0) == [lease]  # expires by its stored wall-clock expiry
    gone = table.restore("t", 1, "g", StoredLease("old", 0, 1, 1_000, expiry_ms=10), now=5.0, now_ms=20)
    assert table.get(gone.lease_id, 5.0) is None and table.expired(5.0) == [gone]  # already past: the timer's
    assert len(table) == 2
