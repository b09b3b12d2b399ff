"""The committed-offsets store on its internal logs: concurrent commits, a failing one fails alone, a
cancelled caller's commit is still written, everything durable when answered and replayed after a
restart; compaction keeps the logs small without changing the view; a legacy SQLite file is
imported once."""

from __future__ import annotations

import asyncio
import pathlib
import sqlite3

import pytest

import dmq.broker.offsets as offsets_module
from dmq.broker.log import LogConfig, LogManager
from dmq.broker.offsets import OffsetStore, offsets_log_topic

CONFIG = LogConfig()


def _open(data_dir: pathlib.Path, partitions: int = 3) -> tuple[LogManager, OffsetStore]:
    logs = LogManager(data_dir / "logs", CONFIG)
    logs.open_existing()
    store = OffsetStore(logs, data_dir)
    for p in range(partitions):
        logs.create("t", p, CONFIG)
        store.create_log("t", p, CONFIG)
    return logs, store


def _reopened_view(data_dir: pathlib.Path) -> dict[tuple[str, str, int], int]:
    async def run() -> dict[tuple[str, str, int], int]:
        logs = LogManager(data_dir / "logs", CONFIG)
        logs.open_existing()
        store = OffsetStore(logs, data_dir)
        await store.open()
        view = {k: c.offset for k, c in store.items()}
        await store.close()
        logs.close()
        return view

    return asyncio.run(run())


def test_concurrent_commits_one_bad_one_cancelled_all_replayed(tmp_path: pathlib.Path) -> None:
    async def run() -> None:
        logs, store = _open(tmp_path)
        await store.open()
        good = [store.commit(f"g{i}", [("t", i % 3, i, "")]) for i in range(200)]
        bad = store.commit("bad", [("t", 0, object(), "")])  # type: ignore[list-item]  # not storable
        results = await asyncio.gather(*good, bad, return_exceptions=True)
        assert all(r is None for r in results[:-1]), [r for r in results if r is not None][:3]
        assert isinstance(results[-1], TypeError)
        assert store.get("bad", "t", 0) is None
        # a caller cancelled while its commit waits for the fsync: written anyway
        task = asyncio.ensure_future(store.commit("late", [("t", 1, 7, "m")]))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.2)
        assert store.get("late", "t", 1) is not None
        # later commits of one group win, in memory and after replay
        await store.commit("g0", [("t", 0, 1000, "newer")])
        assert store.get("g0", "t", 0) is not None and store.get("g0", "t", 0).metadata == "newer"  # type: ignore[union-attr]
        await store.close()
        logs.close()

    asyncio.run(run())
    view = _reopened_view(tmp_path)
    expected = {(f"g{i}", "t", i % 3): i for i in range(1, 200)}
    expected[("g0", "t", 0)] = 1000
    expected[("late", "t", 1)] = 7
    assert view == expected


def test_delete_group_and_topic_survive_a_restart(tmp_path: pathlib.Path) -> None:
    async def run() -> None:
        logs, store = _open(tmp_path)
        await store.open()
        await store.commit("a", [("t", 0, 5, ""), ("t", 1, 6, "")])
        await store.commit("b", [("t", 0, 9, "")])
        assert await store.delete_group("a") == 2
        assert store.for_group("a") == {}
        await store.delete_topic("t", {1})
        assert not logs.partitions() or (offsets_log_topic("t"), 1) not in logs.partitions()
        await store.close()
        logs.close()

    asyncio.run(run())
    assert _reopened_view(tmp_path) == {("b", "t", 0): 9}


def test_compaction_keeps_the_log_small_and_the_view_the_same(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(offsets_module, "COMPACT_MIN_RECORDS", 50)
    monkeypatch.setattr(offsets_module, "SEGMENT_BYTES", 1024)

    async def run() -> tuple[int, int]:
        logs, store = _open(tmp_path, partitions=1)
        await store.open()
        for i in range(400):
            await store.commit(f"g{i % 5}", [("t", 0, i, "x" * 20)])
        await asyncio.sleep(0.1)
        plog = logs.get(offsets_log_topic("t"), 0)
        start, end = plog.log_start_offset, plog.log_end_offset
        await store.close()
        logs.close()
        return start, end

    start, end = asyncio.run(run())
    assert end >= 400 and start > 0, (start, end)  # old segments went
    assert end - start < 200, (start, end)
    assert _reopened_view(tmp_path) == {(f"g{k}", "t", 0): 395 + k for k in range(5)}


def test_a_legacy_sqlite_file_is_imported_once(tmp_path: pathlib.Path) -> None:
    legacy = tmp_path / "offsets.sqlite"
    with sqlite3.connect(legacy) as db:
        db.execute(
            "CREATE TABLE committed_offsets (group_id TEXT, topic TEXT, partition INTEGER, next_offset INTEGER,"
            " metadata TEXT, commit_time_ms INTEGER)"
        )
        db.executemany(
            "INSERT INTO committed_offsets VALUES (?, ?, ?, ?, ?, ?)",
            [("g", "t", 0, 11, "m", 1), ("g", "t", 2, 12, "", 2), ("g", "gone", 0, 13, "", 3)],
        )

    async def run() -> None:
        logs = LogManager(tmp_path / "logs", CONFIG)
        logs.open_existing()
        for p in range(3):
            logs.create("t", p, CONFIG)  # a data dir from before the internal logs: none exist yet
        store = OffsetStore(logs, tmp_path)
        await store.open()
        assert store.get("g", "t", 0) is not None
        await store.close()
        logs.close()

    asyncio.run(run())
    assert not legacy.exists() and (tmp_path / "offsets.sqlite.migrated").exists()
    assert _reopened_view(tmp_path) == {("g", "t", 0): 11, ("g", "t", 2): 12}
