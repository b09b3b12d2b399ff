"""Where event-store consumer groups keep their progress: behind one small interface.

`ProgressStore` is all that groups.py needs: load everything at open, then record each change.
Today it is SQLite beside the index (`<partition dir>/events.groups.sqlite`, committed with
synchronous=FULL before the caller is answered, as the offsets store does); DESIGN.md's
replication plan moves it into a replicated internal topic, which only has to implement the same
five methods. Claims are not progress: they live in memory and die with the leader (workers claim
again).
"""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["GroupRecord", "ProgressStore", "SqliteProgressStore", "PROGRESS_FILE"]

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


class ProgressStore(Protocol):
    def load(self) -> dict[str, GroupRecord]: ...

    def put_group(self, group: GroupRecord) -> None:
        """The group's own fields (not its partitions)."""

    def put_partitions(self, group: str, partitions: dict[str, dict[str, str]], discovered_end: int) -> None:
        """New partitions (acknowledged position 0) and how far discovery went, together."""

    def put_ack(self, group: str, key: str, position: int) -> None: ...

    def reset(self, group: str) -> None:
        """Forget the group's partitions and positions (its settings stay)."""

    def close(self) -> None: ...


_SCHEMA = """
CREATE TABLE IF NOT EXISTS groups(name TEXT PRIMARY KEY, active INTEGER NOT NULL, partition_by TEXT NOT NULL,
                                  handled_types TEXT NOT NULL, discovered_end INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS partitions(grp TEXT NOT NULL, key TEXT NOT NULL, vals TEXT NOT NULL,
                                      acked INTEGER NOT NULL, PRIMARY KEY(grp, key)) WITHOUT ROWID;
"""


class SqliteProgressStore:
    """One connection, used by one thread (the event store's writer)."""

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

    def put_partitions(self, group: str, partitions: dict[str, dict[str, str]], discovered_end: int) -> None:
        statements: list[tuple[str, tuple[object, ...]]] = [
            ("INSERT OR IGNORE INTO partitions(grp, key, vals, acked) VALUES (?, ?, ?, 0)",
             (group, key, json.dumps(values, sort_keys=True)))
            for key, values in partitions.items()
        ]
        statements.append(("UPDATE groups SET discovered_end = ? WHERE name = ?", (discovered_end, group)))
        self._write(statements)

    def put_ack(self, group: str, key: str, position: int) -> None:
        self._write([("UPDATE partitions SET acked = ? WHERE grp = ? AND key = ?", (position, group, key))])

    def reset(self, group: str) -> None:
        self._write([
            ("DELETE FROM partitions WHERE grp = ?", (group,)),
            ("UPDATE groups SET discovered_end = 0 WHERE name = ?", (group,)),
        ])

    def close(self) -> None:
        self._db.close()
