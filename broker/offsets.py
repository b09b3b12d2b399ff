"""Committed consumer-group offsets, durable in the broker's own SQLite file.

Each broker stores the commits for the partitions it leads (the design puts offsets next to the
data). Reads are served from an in-memory copy loaded at start.

Writes: one aiosqlite connection is one SQLite connection on one thread, and a transaction on it
belongs to whoever issued the statements. Requests used to interleave their statements on it
(one request's COMMIT ending another's half-written transaction, cursors used concurrently: "bad
parameter or other API misuse"). Now every write goes through `_write()`:
  - it queues the operation and makes sure the single writer task runs;
  - the writer runs every queued operation in ONE transaction (group commit: one fsync for many
    concurrent commits), each inside its own SAVEPOINT so that a failing operation fails only its
    own request, and loops until the queue is empty;
  - the transaction is committed with `synchronous=FULL` before any caller is answered, so a
    commit is on disk before it is acknowledged; the in-memory copy changes only after that.
The writer is a task of its own, so a caller cancelled mid-write (its client gave up) never cuts a
transaction short; its operation is still written, the same outcome as a commit whose answer was
lost, and the in-memory copy stays consistent because the writer, not the caller, applies it.
"""

from __future__ import annotations

import asyncio
import pathlib
import time
from collections.abc import Awaitable, Callable
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

_UPSERT = (
    "INSERT INTO committed_offsets (group_id, topic, partition, next_offset, metadata, commit_time_ms)"
    " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (group_id, topic, partition) DO UPDATE SET"
    " next_offset = excluded.next_offset, metadata = excluded.metadata,"
    " commit_time_ms = excluded.commit_time_ms"
)

# Bounds one group-commit transaction: a batch stops taking operations past this many, the rest
# go to the next batch (keeps one transaction's WAL growth and lock hold time bounded).
MAX_OPS_PER_TRANSACTION = 1_000


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    metadata: str
    commit_time_ms: int


@dataclass(slots=True)
class _WriteOp:
    """Statements to run in the shared transaction, and what to change in memory once durable."""

    run: Callable[[aiosqlite.Connection], Awaitable[None]]
    apply: Callable[[], object]
    done: asyncio.Future[object]


class OffsetStore:
    """Committed offsets keyed by (group, topic, partition); write-through to SQLite."""

    def __init__(self, path: pathlib.Path) -> None:
        self._path = path
        self._db: aiosqlite.Connection | None = None
        self._offsets: dict[tuple[str, str, int], CommittedOffset] = {}
        self._queued: list[_WriteOp] = []
        self._writer: asyncio.Task[None] | None = None  # owned here; ends when the queue is empty

    def __repr__(self) -> str:
        return f"<OffsetStore path={str(self._path)!r} entries={len(self._offsets)} queued={len(self._queued)}>"

    async def open(self) -> None:
        # isolation_level=None: no implicit transactions; _write_batch says BEGIN and COMMIT itself.
        self._db = await aiosqlite.connect(self._path, isolation_level=None)
        await self._db.execute("PRAGMA journal_mode=WAL")
        # FULL: the WAL is fsynced at every commit, so an acknowledged offset survives a crash.
        await self._db.execute("PRAGMA synchronous=FULL")
        await self._db.execute(_SCHEMA)
        async with self._db.execute(
            "SELECT group_id, topic, partition, next_offset, metadata, commit_time_ms FROM committed_offsets"
        ) as cursor:
            async for group_id, topic, partition, offset, metadata, ts in cursor:
                self._offsets[(group_id, topic, partition)] = CommittedOffset(offset, metadata, ts)

    async def close(self) -> None:
        if self._writer is not None:
            await asyncio.shield(self._writer)  # let queued commits finish: they were promised durability
        if self._db is not None:
            db, self._db = self._db, None
            await db.close()

    def _conn(self) -> aiosqlite.Connection:
        if self._db is None:
            raise RuntimeError("offset store is not open")
        return self._db

    # -- the single writer -------------------------------------------------------------------------

    async def _write(self, run: Callable[[aiosqlite.Connection], Awaitable[None]], apply: Callable[[], object]) -> object:
        """Queue one operation and wait until the writer has made it durable (or failed it)."""
        self._conn()
        op = _WriteOp(run, apply, asyncio.get_running_loop().create_future())
        self._queued.append(op)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._drain(), name="offset-store-writer")
        return await asyncio.shield(op.done)

    async def _drain(self) -> None:
        while self._queued:
            batch = self._queued[:MAX_OPS_PER_TRANSACTION]
            del self._queued[:MAX_OPS_PER_TRANSACTION]
            try:
                await self._write_batch(batch)
            finally:
                # Only a cancelled writer (the loop is being torn down) leaves futures unresolved.
                for op in batch:
                    if not op.done.done():
                        op.done.set_exception(RuntimeError("offset store writer stopped; the commit may not be durable"))

    async def _write_batch(self, batch: list[_WriteOp]) -> None:
        db = self._db
        if db is None:
            for op in batch:
                op.done.set_exception(RuntimeError("offset store is closed"))
            return
        ok: list[_WriteOp] = []
        try:
            await db.execute("BEGIN IMMEDIATE")
            for op in batch:
                await db.execute("SAVEPOINT op")
                try:
                    await op.run(db)
                except Exception as e:  # noqa: BLE001 - this operation fails alone
                    await db.execute("ROLLBACK TO op")
                    await db.execute("RELEASE op")
                    op.done.set_exception(e)
                else:
                    await db.execute("RELEASE op")
                    ok.append(op)
            await db.execute("COMMIT")
        except Exception as e:  # noqa: BLE001 - e.g. disk full at COMMIT: nothing of the batch is durable
            if db.in_transaction:
                try:
                    await db.execute("ROLLBACK")
                except Exception:  # noqa: BLE001 - the rollback error adds nothing to the first one
                    log.exception("offset store rollback failed")
            for op in ok:
                op.done.set_exception(e)
            for op in batch:
                if not op.done.done():
                    op.done.set_exception(e)
            return
        for op in ok:
            op.done.set_result(op.apply())

    # -- commands ----------------------------------------------------------------------------------

    async def commit(self, group_id: str, offsets: list[tuple[str, int, int, str]]) -> None:
        """Store (topic, partition, offset, metadata) rows for a group; durable when this returns."""
        now_ms = int(time.time() * 1000)
        rows = [(group_id, t, p, o, m, now_ms) for t, p, o, m in offsets]

        async def run(db: aiosqlite.Connection) -> None:
            await db.executemany(_UPSERT, rows)

        def apply() -> None:
            for t, p, o, m in offsets:
                self._offsets[(group_id, t, p)] = CommittedOffset(o, m, now_ms)

        await self._write(run, apply)

    def get(self, group_id: str, topic: str, partition: int) -> CommittedOffset | None:
        return self._offsets.get((group_id, topic, partition))

    def items(self) -> list[tuple[tuple[str, str, int], CommittedOffset]]:
        """Every (group, topic, partition) entry: for views kept beside this one (queue mode's)."""
        return list(self._offsets.items())

    def for_group(self, group_id: str) -> dict[tuple[str, int], CommittedOffset]:
        return {(t, p): c for (g, t, p), c in self._offsets.items() if g == group_id}

    async def delete_group(self, group_id: str) -> int:
        async def run(db: aiosqlite.Connection) -> None:
            await db.execute("DELETE FROM committed_offsets WHERE group_id = ?", (group_id,))

        def apply() -> int:
            keys = [k for k in self._offsets if k[0] == group_id]
            for k in keys:
                del self._offsets[k]
            return len(keys)

        removed = await self._write(run, apply)
        assert isinstance(removed, int)
        return removed

    async def delete_topic(self, topic: str, partitions: set[int] | None = None) -> None:
        async def run(db: aiosqlite.Connection) -> None:
            if partitions is None:
                await db.execute("DELETE FROM committed_offsets WHERE topic = ?", (topic,))
            else:
                await db.executemany(
                    "DELETE FROM committed_offsets WHERE topic = ? AND partition = ?",
                    [(topic, p) for p in partitions],
                )

        def apply() -> None:
            for k in [k for k in self._offsets if k[1] == topic and (partitions is None or k[2] in partitions)]:
                del self._offsets[k]

        await self._write(run, apply)
