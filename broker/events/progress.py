"""Where event-store consumer groups keep their progress: behind one small interface.

`ProgressStore` is all that groups.py needs: load everything at open, then record each change,
durably before the caller is answered. `OffsetProgressStore` is the broker's: records of the
store's internal offsets log (dmq.broker.offsets, `__offsets+<topic>-0`), replicated with the
event log by the same fetch path and written with the same rule (fsynced and, replicated, on every
in-sync replica before the write returns), so a group resumes at its acknowledged positions on a
new leader (DESIGN.md "Replication"). `SqliteProgressStore` is where they were kept before
(`<partition dir>/events.groups.sqlite`, leader only): still read once to import it.

Claims are not progress: they live in the leader's memory and are dropped at a failover (a claim
is a short lease; its worker claims again, as after the claim_timeout_ms reaping of a crashed
worker's claim).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

import structlog

from dmq.broker.log import StorageUnavailableError
from dmq.broker.offsets import CommittedOffset, OffsetStore

__all__ = ["AckWrite", "GroupRecord", "ProgressStore", "SqliteProgressStore", "OffsetProgressStore", "PROGRESS_FILE"]

log = structlog.get_logger(__name__)

T = TypeVar("T")

PROGRESS_FILE = "events.groups.sqlite"


@dataclass
class GroupRecord:
    """A group's durable state. `discovered_end`: the log end offset up to which the events were
    searched for new partitions; `partitions`: key -> (values, acknowledged position)."""

    name: str
    active: bool = True
    partition_by: tuple[str, ...] = ()
    handled_types: tuple[str, ...] = ()
    discovered_end: int = 0
    partitions: dict[str, tuple[dict[str, str], int]] = field(default_factory=dict)
    resets: int = 0  # in memory only: bumped by each reset (an ack written later must not undo it)


@dataclass(frozen=True, slots=True)
class AckWrite:
    """A partition's new acknowledged position, to be written (groups.py `unwritten`); `record`
    and `resets`: the group as it was when the ack was applied (store.write_acks checks them)."""

    group: str
    key: str
    values: dict[str, str]
    position: int
    record: GroupRecord | None = None
    resets: int = 0


class ProgressStore(Protocol):
    def load(self) -> dict[str, GroupRecord]: ...

    def put_group(self, group: GroupRecord) -> None:
        """The group's own fields (not its partitions)."""

    def put_partitions(self, group: GroupRecord, partitions: dict[str, dict[str, str]], discovered_end: int) -> None:
        """New partitions (acknowledged position 0) and how far discovery went, together."""

    def put_ack(self, group: str, key: str, values: dict[str, str], position: int) -> None: ...

    async def put_acks(self, acks: list[AckWrite]) -> None:
        """On the event loop: acknowledged positions, durable when this returns; appended (in
        order with every other write) before it first yields."""

    def reset(self, group: GroupRecord) -> None:
        """Forget the group's partitions and positions (its settings stay)."""

    def close(self) -> None: ...


_SCHEMA = """
CREATE TABLE IF NOT EXISTS groups(name TEXT PRIMARY KEY, active INTEGER NOT NULL, partition_by TEXT NOT NULL,
                                  handled_types TEXT NOT NULL, discovered_end INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS partitions(grp TEXT NOT NULL, key TEXT NOT NULL, vals TEXT NOT NULL,
                                      acked INTEGER NOT NULL, PRIMARY KEY(grp, key)) WITHOUT ROWID;
"""


class SqliteProgressStore:
    """One connection, used by one thread (the event store's writer). Before the offsets log held
    the groups' progress it was kept here; the broker now only imports it once
    (OffsetProgressStore.import_legacy)."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, PROGRESS_FILE)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)

    def __repr__(self) -> str:
        return f"<SqliteProgressStore {self.path}>"

    def load(self) -> dict[str, GroupRecord]:
        groups = {}
        for name, active, partition_by, handled, end in self._db.execute(
            "SELECT name, active, partition_by, handled_types, discovered_end FROM groups"
        ):
            groups[name] = GroupRecord(
                name, bool(active), tuple(json.loads(partition_by)), tuple(json.loads(handled)), int(end)
            )
        for grp, key, vals, acked in self._db.execute("SELECT grp, key, vals, acked FROM partitions"):
            if grp in groups:
                groups[grp].partitions[key] = (json.loads(vals), int(acked))
        return groups

    def _write(self, statements: list[tuple[str, tuple[object, ...]]]) -> None:
        db = self._db
        db.execute("BEGIN")
        try:
            for sql, params in statements:
                db.execute(sql, params)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def put_group(self, group: GroupRecord) -> None:
        self._write([(
            "INSERT OR REPLACE INTO groups(name, active, partition_by, handled_types, discovered_end)"
            " VALUES (?, ?, ?, ?, ?)",
            (group.name, int(group.active), json.dumps(list(group.partition_by)),
             json.dumps(list(group.handled_types)), group.discovered_end),
        )])

    def put_partitions(self, group: GroupRecord, partitions: dict[str, dict[str, str]], discovered_end: int) -> None:
        statements: list[tuple[str, tuple[object, ...]]] = [
            ("INSERT OR IGNORE INTO partitions(grp, key, vals, acked) VALUES (?, ?, ?, 0)",
             (group.name, key, json.dumps(values, sort_keys=True)))
            for key, values in partitions.items()
        ]
        statements.append(("UPDATE groups SET discovered_end = ? WHERE name = ?", (discovered_end, group.name)))
        self._write(statements)

    def put_ack(self, group: str, key: str, values: dict[str, str], position: int) -> None:
        self._write([("UPDATE partitions SET acked = ? WHERE grp = ? AND key = ?", (position, group, key))])

    async def put_acks(self, acks: list[AckWrite]) -> None:
        for a in acks:
            self.put_ack(a.group, a.key, a.values, a.position)

    def reset(self, group: GroupRecord) -> None:
        self._write([
            ("DELETE FROM partitions WHERE grp = ?", (group.name,)),
            ("UPDATE groups SET discovered_end = 0 WHERE name = ?", (group.name,)),
        ])

    def close(self) -> None:
        self._db.close()


# Offsets-store keys: a group's own record, and one per (group, partition). Neither prefix meets a
# consumer group's (``G_<topic>_<app>``) or a queue group's (``queue:``).
GROUP_PREFIX = "events:"
PARTITION_PREFIX = "events-partition:"


def _partition_id(group: str, key: str) -> str:
    return PARTITION_PREFIX + json.dumps([group, key])


class OffsetProgressStore:
    """ProgressStore over the broker's OffsetStore (see the module docstring).

    groups.py runs in the event store's writer thread and expects each change durable when the
    call returns; the OffsetStore lives on the broker's event loop. So each call hands its write
    to the loop and blocks the writer until it is durable (or failed: the exception is raised
    here, and groups.py changes its view only after a write returned). `timeout_s` bounds the
    wait (the write itself is bounded by the replicas' ack timeout)."""

    def __init__(self, offsets: OffsetStore, topic: str, loop: asyncio.AbstractEventLoop, *, timeout_s: float = 60.0) -> None:
        self._offsets = offsets
        self._topic = topic
        self._loop = loop
        self._timeout_s = timeout_s

    def __repr__(self) -> str:
        return f"<OffsetProgressStore {self._topic}>"

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            return asyncio.run_coroutine_threadsafe(coro, self._loop).result(self._timeout_s)
        except TimeoutError as e:  # the write goes on; this caller is told it is not known to be stored
            raise StorageUnavailableError(
                f"{self._topic}: a group progress write did not finish within {self._timeout_s:.0f} s; retry"
            ) from e

    def _put(self, entries: list[tuple[str, CommittedOffset | None]]) -> None:
        self._run(self._offsets.put(self._topic, 0, entries))

    async def _entries(self) -> list[tuple[str, CommittedOffset]]:
        # on the loop: the offsets view changes there
        return [(g, c) for (g, t, p), c in self._offsets.items() if t == self._topic and p == 0
                and g.startswith((GROUP_PREFIX, PARTITION_PREFIX))]

    def load(self) -> dict[str, GroupRecord]:
        groups: dict[str, GroupRecord] = {}
        partitions: list[tuple[str, str, dict[str, str], int]] = []
        for gid, c in self._run(self._entries()):
            try:
                if gid.startswith(GROUP_PREFIX):
                    meta = json.loads(c.metadata)
                    name = gid[len(GROUP_PREFIX):]
                    groups[name] = GroupRecord(name, bool(meta["active"]), tuple(meta["partition_by"]),
                                               tuple(meta["handled_types"]), c.offset)
                else:
                    group, key = json.loads(gid[len(PARTITION_PREFIX):])
                    partitions.append((group, key, dict(json.loads(c.metadata)), c.offset))
            except (ValueError, KeyError, TypeError) as e:  # not written by this module: skipped, said
                log.warning("event group progress entry unreadable; skipped", topic=self._topic, key=gid, error=str(e))
        for group, key, values, acked in partitions:
            if group in groups:
                groups[group].partitions[key] = (values, acked)
        return groups

    @staticmethod
    def _entry(offset: int, metadata: object) -> CommittedOffset:
        return CommittedOffset(offset, json.dumps(metadata, sort_keys=True), time.time_ns() // 1_000_000)

    def _group_entry(self, group: GroupRecord) -> tuple[str, CommittedOffset]:
        meta = {"active": group.active, "partition_by": list(group.partition_by),
                "handled_types": list(group.handled_types)}
        return GROUP_PREFIX + group.name, self._entry(group.discovered_end, meta)

    def put_group(self, group: GroupRecord) -> None:
        self._put([self._group_entry(group)])

    def put_partitions(self, group: GroupRecord, partitions: dict[str, dict[str, str]], discovered_end: int) -> None:
        # the group's entry carries discovered_end: written in the same batch as the partitions
        g = replace(group, partitions={}, discovered_end=discovered_end)
        self._put([*((_partition_id(group.name, k), self._entry(0, v)) for k, v in partitions.items()),
                   self._group_entry(g)])

    def put_ack(self, group: str, key: str, values: dict[str, str], position: int) -> None:
        self._run(self.put_acks([AckWrite(group, key, values, position)]))

    async def put_acks(self, acks: list[AckWrite]) -> None:
        await self._offsets.put(self._topic, 0, [(_partition_id(a.group, a.key), self._entry(a.position, a.values))
                                                 for a in acks])

    def reset(self, group: GroupRecord) -> None:
        g = replace(group, partitions={}, discovered_end=0)
        self._put([*((_partition_id(group.name, k), None) for k in group.partitions), self._group_entry(g)])

    def import_legacy(self, directory: str) -> int:
        """Move the progress an older broker kept in SQLite (leader only) into the offsets log,
        once (then the file is renamed *.migrated); the groups imported."""
        path = os.path.join(directory, PROGRESS_FILE)
        if not os.path.exists(path):
            return 0
        legacy = SqliteProgressStore(directory)
        try:
            groups = legacy.load()
        finally:
            legacy.close()
        entries: list[tuple[str, CommittedOffset | None]] = []
        for g in groups.values():
            entries.append(self._group_entry(g))
            entries += [(_partition_id(g.name, k), self._entry(acked, values)) for k, (values, acked) in g.partitions.items()]
        if entries:
            self._put(entries)
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path + suffix)
        os.replace(path, path + ".migrated")
        log.info("event group progress imported from SQLite into the offsets log", groups=len(groups), path=path)
        return len(groups)

    def close(self) -> None:
        pass
