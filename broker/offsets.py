"""Committed consumer-group offsets, kept as records in an internal key-compacted log beside each
partition (DESIGN.md "Replication": logs all the way down, as Kafka's `__consumer_offsets`).

Where: the commits for partition (T, p) are records of the internal log (`offsets_log_topic(T)`,
p), directory `__offsets+T-p` next to the data's `T-p` (a long T is cut and hashed to fit). '+' is
not a legal topic character, so no user topic can meet it. An internal log whose data partition is
gone is not read. The data partition's leader answers the commits for it, as before;
with replication the internal log has the same replicas, leader and epoch as its data partition
(the replica manager applies one PartitionState to both) and is replicated by the same fetch path,
so a new leader has every acknowledged commit. Kafka keeps one `__consumer_offsets` topic
partitioned by group; keeping the commits beside their partition keeps DMQ's routing (a commit goes
to the partition's leader) and needs no second placement.

Record: key = group id (UTF-8); value = int64 next offset, int64 commit time (ms), then the
metadata (UTF-8) — or empty: a tombstone (the group's offset for the partition was deleted).

The view is an in-memory dict, rebuilt by replaying each internal log from its start (at open, and
by `reload()` when a replica becomes leader); a later record wins.

Writes (commit, delete_group): one batch per partition is appended synchronously — so appends reach
the log and `_appended` (the view as of the log end, which snapshots are taken from) in the same
order — then the store waits until the batch is durable: fsynced (group commit with the other
writers) and, with replication, on every in-sync replica (the node's `durable` hook). Only then
does the readers' view change and the caller get an answer. Each view entry remembers the log
offset of its record, so a durable wait finishing out of order never lets an older record win. A
failed flush rolls the log back (dmq.broker.log.partition): the partition's view is then replayed.

Compaction (Kafka's log cleaner, done the simple way because the live set is small: one entry
per group): once a log holds COMPACT_MIN_RECORDS records more than its last snapshot and more than
twice its live entries, the store rolls it, appends every live entry as a snapshot, waits for it,
and deletes the segments before the snapshot. Replaying from the new log start gives the same view.
A tombstone older than a snapshot disappears with it.

An `offsets.sqlite` left by an older version is imported once at open (then renamed
`offsets.sqlite.migrated`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import pathlib
import re
import sqlite3
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Protocol

import structlog

from dmq.broker.log import AppendInfo, LogConfig, LogManager, PartitionLog, UnknownPartitionError
from dmq.proto import records
from dmq.proto.names import TOPIC_NAME_MAX_BYTES

log = structlog.get_logger(__name__)

INTERNAL_PREFIX = "__offsets+"
# A snapshot is taken past this many records since the last one (and twice the live entries).
COMPACT_MIN_RECORDS = 1_000
# Snapshot batches hold at most this many entries each (bounds one batch's size).
SNAPSHOT_BATCH_RECORDS = 1_000
# Small segments, so a snapshot lets the old ones go soon.
SEGMENT_BYTES = 1024 * 1024
LEGACY_FILE = "offsets.sqlite"
_VALUE = struct.Struct("<qq")
_READ_BYTES = 1024 * 1024

Key = tuple[str, int]  # (topic, partition) of the data


class Durability(Protocol):
    """When a commit counts as stored: checked before the append, awaited after it."""

    def check(self, plog: PartitionLog) -> None:
        """Raise to refuse a write before anything is appended (not the leader, too few replicas)."""

    async def wait(self, plog: PartitionLog, info: AppendInfo, epoch: int) -> None:
        """Return once the batch is durable; raise when it is not (the caller answers an error)."""


def offsets_log_topic(topic: str) -> str:
    """The internal log's name for a data topic. It must fit a directory name as the topic's own
    does (249 bytes + "-<partition>"), so a long topic's is cut and made unique by a hash."""
    name = INTERNAL_PREFIX + topic
    if len(name) <= TOPIC_NAME_MAX_BYTES:  # topic names are ASCII: characters are bytes
        return name
    digest = hashlib.blake2b(topic.encode(), digest_size=8).hexdigest()
    return name[: TOPIC_NAME_MAX_BYTES - len(digest) - 1] + "~" + digest


def is_offsets_log(log_topic: str) -> bool:
    return log_topic.startswith(INTERNAL_PREFIX)


_OFFSETS_LOG_NAME = re.compile(re.escape(INTERNAL_PREFIX) + r"[a-zA-Z0-9._~-]+")


def check_offsets_log_name(name: str) -> str | None:
    """Why `name` cannot be an internal offsets log's (a replica's fetch names them), None if it can."""
    if len(name) > TOPIC_NAME_MAX_BYTES or not _OFFSETS_LOG_NAME.fullmatch(name):
        return (f"an internal offsets log name is {INTERNAL_PREFIX!r} and a topic name (or its hashed "
                f"form), at most {TOPIC_NAME_MAX_BYTES} bytes")
    return None


class LocalDurability:
    """Durable on this broker: fsynced (flush_policy "fsync"). Unreplicated partitions."""

    def check(self, plog: PartitionLog) -> None:
        pass

    async def wait(self, plog: PartitionLog, info: AppendInfo, epoch: int) -> None:
        if plog.config.flush_policy == "fsync":
            await plog.wait_durable(info.last_offset + 1, epoch=epoch)


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    metadata: str
    commit_time_ms: int


def _encode_value(c: CommittedOffset) -> bytes:
    return _VALUE.pack(c.offset, c.commit_time_ms) + c.metadata.encode("utf-8")


def _decode_value(value: bytes) -> CommittedOffset | None:
    if not value:
        return None
    offset, ts = _VALUE.unpack_from(value)
    return CommittedOffset(offset, bytes(value[_VALUE.size:]).decode("utf-8"), ts)


@dataclass(frozen=True, slots=True)
class _Appended:
    """A batch appended by _append, for _finish to wait for."""

    topic: str
    partition: int
    entries: list[tuple[str, CommittedOffset | None]]
    plog: PartitionLog
    part: _Partition
    info: AppendInfo
    epoch: int


@dataclass(slots=True)
class _Partition:
    """One data partition's commits: durable (served) and as of the log end (for snapshots)."""

    served: dict[str, tuple[CommittedOffset | None, int]]  # group -> (entry or tombstone, log offset)
    appended: dict[str, CommittedOffset | None]
    since_snapshot: int = 0
    # entries of `appended` that are not tombstones: kept as it changes, since every write checks
    # it (counting them was O(entries) a write: event-store groups keep one entry per partition)
    live: int = 0
    compacting: bool = False


class OffsetStore:
    """Committed offsets keyed by (group, topic, partition), durable in internal logs."""

    def __init__(self, logs: LogManager, data_dir: pathlib.Path, *, durability: Durability | None = None) -> None:
        self._logs = logs
        self._data_dir = data_dir
        self.durability: Durability = durability or LocalDurability()
        self._parts: dict[Key, _Partition] = {}
        self._data_topics: dict[str, str] = {}  # internal log name -> data topic (names may be hashed)
        self._reload_listeners: list[Callable[[str, int], None]] = []
        self._tasks: set[asyncio.Task[None]] = set()  # compactions: owned here, awaited by close()
        self._closed = False

    def __repr__(self) -> str:
        return f"<OffsetStore partitions={len(self._parts)} entries={sum(len(p.served) for p in self._parts.values())}>"

    # -- open / close ------------------------------------------------------------------------------

    async def open(self) -> None:
        """Replay every internal log (the logs are open), then import a legacy SQLite file."""
        present = self._logs.partitions()
        internal = set(present)
        for topic, partition in present:
            if not is_offsets_log(topic) and (offsets_log_topic(topic), partition) in internal:
                self._data_topics[offsets_log_topic(topic)] = topic
                await asyncio.to_thread(self._replay, topic, partition)
        legacy = self._data_dir / LEGACY_FILE
        if legacy.exists():
            await self._import_legacy(legacy)

    async def close(self) -> None:
        self._closed = True
        if self._tasks:
            await asyncio.wait(list(self._tasks))

    def add_reload_listener(self, callback: Callable[[str, int], None]) -> None:
        """callback(topic, partition) after a partition's commits were replayed (views kept beside
        this one, as queue mode's, rebuild theirs)."""
        self._reload_listeners.append(callback)

    def reload_log(self, log_topic: str, partition: int) -> None:
        """This replica now leads the internal log: replay it (as a follower it only copied
        records; the view is built where it is served)."""
        topic = self._data_topics.get(log_topic)
        if topic is None:
            return
        self._replay(topic, partition)
        for callback in self._reload_listeners:
            callback(topic, partition)

    def _replay(self, topic: str, partition: int) -> None:
        try:
            plog = self._logs.get(offsets_log_topic(topic), partition)
        except UnknownPartitionError:
            self._parts.pop((topic, partition), None)
            return
        served: dict[str, tuple[CommittedOffset | None, int]] = {}
        count = 0
        offset = plog.log_start_offset
        while True:
            raw = plog.read(offset, _READ_BYTES)
            if not raw:
                break
            for batch in records.decode_batches(raw, max_batch_bytes=plog.config.max_batch_bytes):
                for record in batch.iter_from(offset):
                    if record.key is not None:
                        served[bytes(record.key).decode("utf-8")] = (_decode_value(record.value), record.offset)
                        count += 1
                offset = batch.header.base_offset + batch.header.record_count
        part = self._parts.setdefault((topic, partition), _Partition({}, {}))
        # in place: writers in flight hold this object
        part.served = served
        part.appended = {g: c for g, (c, _) in served.items()}
        part.live = sum(1 for c in part.appended.values() if c is not None)
        part.since_snapshot = count

    async def _import_legacy(self, path: pathlib.Path) -> None:
        def rows() -> list[tuple[str, str, int, int, str, int]]:
            with contextlib.closing(sqlite3.connect(path)) as db:
                return list(db.execute(
                    "SELECT group_id, topic, partition, next_offset, metadata, commit_time_ms FROM committed_offsets"
                ))

        by_partition: dict[Key, list[tuple[str, CommittedOffset | None]]] = {}
        for group, topic, partition, offset, metadata, ts in await asyncio.to_thread(rows):
            by_partition.setdefault((topic, partition), []).append((group, CommittedOffset(offset, metadata, ts)))
        imported = 0
        for (topic, partition), entries in by_partition.items():
            try:
                self._logs.get(topic, partition)
            except UnknownPartitionError:
                continue  # the partition is gone: so are its commits
            await self._write(topic, partition, entries)
            imported += len(entries)
        os.replace(path, path.with_name(LEGACY_FILE + ".migrated"))
        log.info("committed offsets imported from SQLite into the internal logs", entries=imported)

    # -- the internal logs -------------------------------------------------------------------------

    def create_log(self, topic: str, partition: int, data_config: LogConfig) -> PartitionLog:
        """The internal log of a data partition (created with it, so every replica has one)."""
        config = replace(
            data_config,
            segment_bytes=min(SEGMENT_BYTES, data_config.segment_bytes),
            retention_ms=-1,
            retention_bytes=-1,
            dedup_window_ms=0,
        )
        self._data_topics[offsets_log_topic(topic)] = topic
        plog = self._logs.create(offsets_log_topic(topic), partition, config)
        self._parts.setdefault((topic, partition), _Partition({}, {}))
        return plog

    def log_for(self, topic: str, partition: int) -> PartitionLog:
        """The internal log of a data partition held here (created if it predates them)."""
        self._data_topics[offsets_log_topic(topic)] = topic
        try:
            return self._logs.get(offsets_log_topic(topic), partition)
        except UnknownPartitionError:
            # a partition created before the internal logs existed: make its log now
            return self.create_log(topic, partition, self._logs.get(topic, partition).config)

    async def _write(self, topic: str, partition: int, entries: list[tuple[str, CommittedOffset | None]]) -> None:
        """Append entries for one partition, wait until durable, then serve them."""
        await self._finish(self._append(topic, partition, entries))

    def _append(self, topic: str, partition: int, entries: list[tuple[str, CommittedOffset | None]]) -> _Appended:
        """The first half of _write, synchronous: the batch is in the log when this returns."""
        if self._closed:
            raise RuntimeError("offset store is closed")
        plog = self.log_for(topic, partition)
        self.durability.check(plog)
        part = self._parts.setdefault((topic, partition), _Partition({}, {}))
        batch = records.encode(
            [b"" if c is None else _encode_value(c) for _, c in entries],
            keys=[g.encode("utf-8") for g, _ in entries],
        )
        info, epoch = plog.append_held(batch)  # synchronous: log order = order of `appended`
        for group, c in entries:
            old = part.appended.get(group)
            part.live += (c is not None) - (old is not None)
            part.appended[group] = c
        part.since_snapshot += len(entries)
        return _Appended(topic, partition, entries, plog, part, info, epoch)

    async def _finish(self, w: _Appended) -> None:
        """The second half of _write: wait until the batch is durable, then serve it."""
        topic, partition, entries, plog, part, info = w.topic, w.partition, w.entries, w.plog, w.part, w.info
        try:
            await self.durability.wait(plog, info, w.epoch)
        except BaseException:
            # a rollback may have removed the batch (or later ones): the log is the truth
            self._replay(topic, partition)
            raise
        for i, (group, c) in enumerate(entries):
            at = info.base_offset + i
            current = part.served.get(group)
            if current is None or current[1] < at:
                part.served[group] = (c, at)
        self._maybe_compact(topic, partition, part)

    # -- compaction --------------------------------------------------------------------------------

    def _maybe_compact(self, topic: str, partition: int, part: _Partition) -> None:
        live = part.live
        if part.compacting or self._closed or part.since_snapshot < max(COMPACT_MIN_RECORDS, 2 * live):
            return
        part.compacting = True
        task = asyncio.create_task(self._compact(topic, partition, part), name=f"offsets-compact-{topic}-{partition}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _compact(self, topic: str, partition: int, part: _Partition) -> None:
        try:
            plog = self.log_for(topic, partition)
            plog.roll()
            start = plog.log_end_offset
            live = [(g, c) for g, c in part.appended.items() if c is not None]
            for group in [g for g, c in part.appended.items() if c is None]:
                del part.appended[group]  # a tombstone older than the snapshot is not needed
            last: tuple[AppendInfo, int] | None = None
            for i in range(0, len(live), SNAPSHOT_BATCH_RECORDS):
                chunk = live[i : i + SNAPSHOT_BATCH_RECORDS]
                batch = records.encode([_encode_value(c) for _, c in chunk], keys=[g.encode("utf-8") for g, _ in chunk])
                last = plog.append_held(batch)
            if last is not None:
                await self.durability.wait(plog, *last)
            # tombstones the snapshot made unnecessary (a newer one still guards its group)
            part.served = {g: v for g, v in part.served.items() if v[0] is not None or v[1] >= start}
            part.since_snapshot = len(live)
            deleted = plog.delete_segments_before(start)
            log.info("committed offsets compacted", topic=topic, partition=partition, live=len(live),
                     segments_deleted=deleted, log_start_offset=plog.log_start_offset)
        except Exception as e:  # noqa: BLE001 - compaction is retried after the next commits
            log.warning("committed offsets compaction failed", topic=topic, partition=partition, error=repr(e))
        finally:
            part.compacting = False

    # -- commands ----------------------------------------------------------------------------------

    async def commit(self, group_id: str, offsets: list[tuple[str, int, int, str]]) -> None:
        """Store (topic, partition, offset, metadata) rows for a group; durable when this returns."""
        now_ms = int(time.time() * 1000)
        by_partition: dict[Key, list[tuple[str, CommittedOffset | None]]] = {}
        for t, p, o, m in offsets:
            if not isinstance(o, int) or not isinstance(m, str):
                raise TypeError(f"offset must be int and metadata str, got {type(o).__name__}, {type(m).__name__}")
            by_partition.setdefault((t, p), []).append((group_id, CommittedOffset(o, m, now_ms)))
        await self._write_all(by_partition)

    async def _write_all(self, by_partition: dict[Key, list[tuple[str, CommittedOffset | None]]]) -> None:
        # Shielded: a caller that gives up does not cut a write short; it is the same outcome as
        # a commit whose answer was lost.
        writes = [asyncio.ensure_future(self._write(t, p, e)) for (t, p), e in by_partition.items()]
        results = await asyncio.shield(asyncio.gather(*writes, return_exceptions=True))
        for r in results:
            if isinstance(r, BaseException):
                raise r

    async def put(self, topic: str, partition: int, entries: list[tuple[str, CommittedOffset | None]]) -> None:
        """Store entries (None: a tombstone) of one partition as one batch: all or nothing, durable
        when this returns (event-store groups keep their progress here, several keys at once; queue
        mode a group's progress and its lease).
        The batch is appended before this first yields, so puts are in the log in call order."""
        pending = self._append(topic, partition, entries)
        # shielded as _write_all: a caller that gives up does not cut the write short
        await asyncio.shield(self._finish(pending))

    def get(self, group_id: str, topic: str, partition: int) -> CommittedOffset | None:
        part = self._parts.get((topic, partition))
        entry = None if part is None else part.served.get(group_id)
        return None if entry is None else entry[0]

    def partition_items(self, topic: str, partition: int) -> dict[str, CommittedOffset]:
        """The live entries of one partition, by key."""
        part = self._parts.get((topic, partition))
        if part is None:
            return {}
        return {g: c for g, (c, _) in part.served.items() if c is not None}

    def items(self) -> list[tuple[tuple[str, str, int], CommittedOffset]]:
        """Every (group, topic, partition) entry: for views kept beside this one (queue mode's)."""
        return [
            ((g, t, p), c) for (t, p), part in self._parts.items() for g, (c, _) in part.served.items() if c is not None
        ]

    def for_group(self, group_id: str) -> dict[tuple[str, int], CommittedOffset]:
        out = {}
        for key, part in self._parts.items():
            entry = part.served.get(group_id)
            if entry is not None and entry[0] is not None:
                out[key] = entry[0]
        return out

    async def delete_group(self, group_id: str) -> int:
        """Tombstones for every partition the group has an offset in; the count of those."""
        by_partition: dict[Key, list[tuple[str, CommittedOffset | None]]] = {
            key: [(group_id, None)] for key in self.for_group(group_id)
        }
        await self._write_all(by_partition)
        return len(by_partition)

    async def delete_topic(self, topic: str, partitions: Iterable[int] | None = None) -> None:
        """Forget the topic's commits with its partitions (the internal logs go too)."""
        wanted = None if partitions is None else set(partitions)
        log_topic = offsets_log_topic(topic)
        for t, p in self._logs.partitions():
            if t == log_topic and (wanted is None or p in wanted):
                with contextlib.suppress(UnknownPartitionError):
                    await asyncio.to_thread(self._logs.delete, t, p)
        for key in [k for k in self._parts if k[0] == topic and (wanted is None or k[1] in wanted)]:
            del self._parts[key]
