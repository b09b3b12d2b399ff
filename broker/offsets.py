"""Committed consumer-group offsets, durable in the broker's own SQLite file.

Each broker stores the commits for the partitions it leads (the design puts offsets next to the
data). Writes are one transaction per CommitOffsets request with `synchronous=FULL`, so a commit is
on disk before it is acknowledged. Reads are served from an in-memory copy loaded at start.
"""

from __future__ import annotations

import pathlib
import time
from dataclasses import dataclass

import aiosqlite
import structlog

log = structlog.get_logger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS committed_offsets (
    group_id TEXT NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    next_offset INTEGER NOT NULL,
    metadata TEXT NOT NULL DEFAULT '',
    commit_time_ms INTEGER NOT NULL,
    PRIMARY KEY (group_id, topic, partition)
)
"""


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    metadata: str
    commit_time_ms: int


class OffsetStore:
    """Committed offsets keyed by (group, topic, partition); write-through to SQLite."""

    def __init__(self, path: pathlib.Path) -> None:
        self._path = path
        self._db: aiosqlite.Connection | None = None
        self._offsets: dict[tuple[str, str, int], CommittedOffset] = {}

    def __repr__(self) -> str:
        return f"<OffsetStore path={str(self._path)!r} entries={len(self._offsets)}>"

    async def open(self) -> None:
        self._db = await aiosqlite.connect(self._path)
        await self._db.execute("PRAGMA journal_mode=WAL")
        # FULL: the WAL is fsynced at every commit, so an acknowledged offset survives a crash.
        await self._db.execute("PRAGMA synchronous=FULL")
        await self._db.execute(_SCHEMA)
        await self._db.commit()
        async with self._db.execute(
            "SELECT group_id, topic, partition, next_offset, metadata, commit_time_ms FROM committed_offsets"
        ) as cursor:
            async for group_id, topic, partition, offset, metadata, ts in cursor:
                self._offsets[(group_id, topic, partition)] = CommittedOffset(offset, metadata, ts)

    async def close(self) -> None:
        if self._db is not None:
            await self._db.close()
            self._db = None

    def _conn(self) -> aiosqlite.Connection:
        if self._db is None:
            raise RuntimeError("offset store is not open")
        return self._db

    async def commit(self, group_id: str, offsets: list[tuple[str, int, int, str]]) -> None:
        """Store (topic, partition, offset, metadata) rows for a group in one durable transaction."""
        now_ms = int(time.time() * 1000)
        db = self._conn()
        await db.executemany(
            "INSERT INTO committed_offsets (group_id, topic, partition, next_offset, metadata, commit_time_ms)"
            " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (group_id, topic, partition) DO UPDATE SET"
            " next_offset = excluded.next_offset, metadata = excluded.metadata,"
            " commit_time_ms = excluded.commit_time_ms",
            [(group_id, t, p, o, m, now_ms) for t, p, o, m in offsets],
        )
        await db.commit()
        for t, p, o, m in offsets:
            self._offsets[(group_id, t, p)] = CommittedOffset(o, m, now_ms)

    def get(self, group_id: str, topic: str, partition: int) -> CommittedOffset | None:
        return self._offsets.get((group_id, topic, partition))

    def for_group(self, group_id: str) -> dict[tuple[str, int], CommittedOffset]:
        return {(t, p): c for (g, t, p), c in self._offsets.items() if g == group_id}

    async def delete_group(self, group_id: str) -> int:
        db = self._conn()
        await db.execute("DELETE FROM committed_offsets WHERE group_id = ?", (group_id,))
        await db.commit()
        keys = [k for k in self._offsets if k[0] == group_id]
        for k in keys:
            del self._offsets[k]
        return len(keys)

    async def delete_topic(self, topic: str, partitions: set[int] | None = None) -> None:
        db = self._conn()
        if partitions is None:
            await db.execute("DELETE FROM committed_offsets WHERE topic = ?", (topic,))
        else:
            await db.executemany(
                "DELETE FROM committed_offsets WHERE topic = ? AND partition = ?",
                [(topic, p) for p in partitions],
            )
        await db.commit()
        for k in [k for k in self._offsets if k[1] == topic and (partitions is None or k[2] in partitions)]:
            del self._offsets[k]
