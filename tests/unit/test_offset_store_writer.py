"""The offset store's single writer: concurrent commits share transactions, a failing one fails alone,
a cancelled caller's commit is still written consistently, everything is on disk when answered."""

from __future__ import annotations

import asyncio
import pathlib
import sqlite3

import pytest

from dmq.broker.offsets import OffsetStore


def _on_disk(path: pathlib.Path) -> dict[tuple[str, str, int], int]:
    with sqlite3.connect(path) as db:
        return {(g, t, p): o for g, t, p, o in db.execute("SELECT group_id, topic, partition, next_offset FROM committed_offsets")}


def test_concurrent_commits_one_bad_one_cancelled(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "offsets.sqlite"

    async def run() -> None:
        store = OffsetStore(path)
        await store.open()
        good = [store.commit(f"g{i}", [("t", i % 3, i, "")]) for i in range(200)]
        bad = store.commit("bad", [("t", 0, object(), "")])  # type: ignore[list-item]  # not storable
        results = await asyncio.gather(*good, bad, return_exceptions=True)
        assert all(r is None for r in results[:-1]), [r for r in results if r is not None][:3]
        assert isinstance(results[-1], Exception)
        assert store.get("bad", "t", 0) is None
        # a caller cancelled while its commit is queued: written anyway, memory and disk agree
        task = asyncio.ensure_future(store.commit("late", [("t", 1, 7, "m")]))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await store.close()  # waits for queued writes
        assert store.get("late", "t", 1) is not None

    asyncio.run(run())
    stored = _on_disk(path)
    assert {k: v for k, v in stored.items() if k[0].startswith("g")} == {(f"g{i}", "t", i % 3): i for i in range(200)}
    assert ("bad", "t", 0) not in stored
    assert stored[("late", "t", 1)] == 7
