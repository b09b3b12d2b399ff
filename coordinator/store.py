"""The SQLite metadata store (the embedded default): the coordinator's durable state in one file
(<data_dir>/coordinator.sqlite), via aiosqlite. It implements dmq.coordinator.metastore.base.MetadataStore
(the records and the compare-and-swap rules are described there); the etcd backend is
dmq.coordinator.metastore.etcd.

Schema (PRAGMA user_version = SCHEMA_VERSION):
  brokers(broker_id INTEGER PRIMARY KEY, host TEXT, port INTEGER, registered_ms INTEGER, rack TEXT NULL)
      every broker that ever registered; liveness is not stored (it is rebuilt by heartbeats).
      rack: its rack / zone label as last registered (NULL: none, or registered before the column).
  topics(name TEXT PRIMARY KEY, partition_count INTEGER, config_json TEXT, created_ms INTEGER,
         creator TEXT NULL)
      config_json holds only the settings that are set (TopicSettings.to_json()); creator is the
      principal that created the topic (NULL: security off, or created before the column existed),
      whose per-principal limits the topic's partitions count against. The column is added to an
      older file at open (ALTER TABLE), without a schema version change: older code reads the
      columns it names and ignores it.
  partitions(topic TEXT, partition INTEGER, broker_id INTEGER, replicas TEXT NULL, isr TEXT NULL,
             leader_epoch INTEGER NULL, partition_epoch INTEGER NULL, PRIMARY KEY (topic, partition))
      each partition's replication state (PartitionRecord): broker_id is its leader (-1: offline),
      replicas and isr JSON lists of broker ids. A row written before replication (NULL replicas)
      is the unreplicated partition it was: replicas = isr = [broker_id], epochs 0.
  groups(group_id TEXT PRIMARY KEY, topic TEXT, app_id TEXT, subscription_mode TEXT,
         subscription_from_ms INTEGER NULL, created_ms INTEGER, start_offsets_json TEXT)
      a consumer group's recorded subscription ("first wins") and the start offsets snapshotted
      for subscription mode `new` ({"<partition>": offset}); owned by the group coordinator.
      state_json (added column, NULL: none): its membership as dmq.coordinator.group.durable
      snapshots it (generation, members with their secrets, targets and owners), rewritten at
      every change of it, so a restarted coordinator resumes the group.
  acls(principal, resource_type, pattern_type, resource_name, operation, permission, PRIMARY KEY all)
      access-control entries (dmq.proto.security.acls), as their words;
  acl_version(id = 1, version INTEGER)
      bumped by every change, so brokers know when their cached copy is stale. Added without a
      schema version change: both tables are created if missing, and an older file has no ACLs.
  controller(id = 1, epoch INTEGER)
      the controller epoch (claim_controller_epoch); absent = 0.
  principal_limits(id = 1, max_topics INTEGER, max_partitions INTEGER, exempt_json TEXT)
  Added later, nullable (NULL = 0): partitions.version and topics.version, the row versions that
  compare-and-swap writes are conditioned on; groups.generation.

Durability: WAL with synchronous=FULL, so a committed topic survives power loss. Each write is one
transaction, rolled back whole when it fails; a full disk (SQLITE_FULL, ENOSPC / EDQUOT) is raised as
StoreFullError, which callers answer with RESOURCE_EXHAUSTED "disk full on the coordinator" (transient:
the same write succeeds once space is freed, nothing was half-written); the asyncio lock keeps two coroutines from interleaving statements inside one
transaction on the shared connection. The store is the only writer; reads at start-up only.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import json
import pathlib
import sqlite3
from collections.abc import Awaitable, Callable, Iterable, Mapping

import aiosqlite
import structlog

from dmq.coordinator.metastore.base import (
    NO_LEADER,
    AclRow,
    BrokerRecord,
    GroupRecord,
    PartitionRecord,
    PrincipalLimitsRecord,
    StoreConflict,
    StoreError,
    StoreFullError,
    TopicExists,
    TopicRecord,
)
from dmq.proto.topic_settings import TopicSettings

__all__ = [
    "NO_LEADER", "BrokerRecord", "CoordinatorStore", "GroupRecord", "PartitionRecord", "PrincipalLimitsRecord",
    "StoreConflict", "StoreError", "StoreFullError", "TopicExists", "TopicRecord",
]

log = structlog.get_logger(__name__)

SCHEMA_VERSION = 1
# sqlite3's default busy timeout is 5 s; a second coordinator on the same file waits, then fails loudly.
BUSY_TIMEOUT_S = 5.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS brokers (
    broker_id INTEGER PRIMARY KEY,
    host TEXT NOT NULL,
    port INTEGER NOT NULL,
    registered_ms INTEGER NOT NULL,
    rack TEXT
);
CREATE TABLE IF NOT EXISTS topics (
    name TEXT PRIMARY KEY,
    partition_count INTEGER NOT NULL,
    config_json TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    creator TEXT,
    version INTEGER
);
CREATE TABLE IF NOT EXISTS partitions (
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    broker_id INTEGER NOT NULL,
    replicas TEXT,
    isr TEXT,
    leader_epoch INTEGER,
    partition_epoch INTEGER,
    version INTEGER,
    PRIMARY KEY (topic, partition)
);
CREATE TABLE IF NOT EXISTS acls (
    principal TEXT NOT NULL,
    resource_type TEXT NOT NULL,
    pattern_type TEXT NOT NULL,
    resource_name TEXT NOT NULL,
    operation TEXT NOT NULL,
    permission TEXT NOT NULL,
    PRIMARY KEY (principal, resource_type, pattern_type, resource_name, operation, permission)
);
CREATE TABLE IF NOT EXISTS acl_version (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS controller (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    epoch INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS principal_limits (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    max_topics INTEGER NOT NULL,
    max_partitions INTEGER NOT NULL,
    exempt_json TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS groups (
    group_id TEXT PRIMARY KEY,
    topic TEXT NOT NULL,
    app_id TEXT NOT NULL,
    subscription_mode TEXT NOT NULL,
    subscription_from_ms INTEGER,
    created_ms INTEGER NOT NULL,
    start_offsets_json TEXT NOT NULL,
    generation INTEGER
);
"""


# Columns added after a table was first released: (table, column, declaration), added by open()
# to a file made before them. Nullable, so existing rows need no value.
_ADDED_COLUMNS = (
    ("topics", "creator", "TEXT"),
    ("brokers", "rack", "TEXT"),
    ("partitions", "replicas", "TEXT"),
    ("partitions", "isr", "TEXT"),
    ("partitions", "leader_epoch", "INTEGER"),
    ("partitions", "partition_epoch", "INTEGER"),
    ("groups", "state_json", "TEXT"),
    ("partitions", "version", "INTEGER"),
    ("topics", "version", "INTEGER"),
    ("groups", "generation", "INTEGER"),
)


async def _add_missing_columns(db: aiosqlite.Connection) -> None:
    for table, column, declaration in _ADDED_COLUMNS:
        async with db.execute(f"PRAGMA table_info({table})") as cur:
            present = {str(row[1]) for row in await cur.fetchall()}
        if column not in present:
            await db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
            log.info("store migrated: column added", table=table, column=column)


# ENOSPC: no space; EDQUOT: over quota. Both are a full disk to whoever retries.
_DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)})


def is_disk_full(e: BaseException) -> bool:
    """Whether `e` (from sqlite3 / aiosqlite or the OS) says the disk is full."""
    if isinstance(e, OSError):
        return e.errno in _DISK_FULL_ERRNOS
    if isinstance(e, sqlite3.Error):
        # sqlite_errorcode is the primary code in its low byte (extended codes keep it there).
        code = getattr(e, "sqlite_errorcode", None)
        return (code is not None and code & 0xFF == sqlite3.SQLITE_FULL) or "disk is full" in str(e)
    return False


def _state_columns(state: PartitionRecord) -> tuple[object, ...]:
    """(broker_id, replicas, isr, leader_epoch, partition_epoch) of a partitions row."""
    return (state.leader, json.dumps(list(state.replicas)), json.dumps(list(state.isr)), state.leader_epoch,
            state.partition_epoch)


def _insert_partitions(name: str, states: Mapping[int, PartitionRecord]) -> list[tuple[str, tuple[object, ...]]]:
    return [
        (
            "INSERT INTO partitions (topic, partition, broker_id, replicas, isr, leader_epoch, partition_epoch) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (name, p, *_state_columns(s)),
        )
        for p, s in sorted(states.items())
    ]


_Check = Callable[[aiosqlite.Connection], Awaitable[None]]


async def _controller_epoch(db: aiosqlite.Connection) -> int:
    async with db.execute("SELECT epoch FROM controller WHERE id = 1") as cur:
        row = await cur.fetchone()
    return int(row[0]) if row else 0


class CoordinatorStore:
    def __init__(self, path: pathlib.Path) -> None:
        self.path = pathlib.Path(path)
        self._db: aiosqlite.Connection | None = None
        self._lock = asyncio.Lock()
        # Row versions as last read or written by this store: its compare-and-swap expectations.
        self._partition_versions: dict[tuple[str, int], int] = {}
        self._topic_versions: dict[str, int] = {}
        self._claimed_epoch: int | None = None

    def __repr__(self) -> str:
        return f"<CoordinatorStore path={str(self.path)!r} open={self._db is not None}>"

    async def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE ... COMMIT) below.
        db = await aiosqlite.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        try:
            await db.execute("PRAGMA journal_mode=WAL")
            await db.execute("PRAGMA synchronous=FULL")
            async with db.execute("PRAGMA user_version") as cur:
                row = await cur.fetchone()
            version = int(row[0]) if row else 0
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} has schema version {version}, this coordinator knows up to "
                    f"{SCHEMA_VERSION}: upgrade dmq"
                )
            await db.executescript(_SCHEMA)
            await _add_missing_columns(db)
            await db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except BaseException:
            await db.close()
            raise
        self._db = db

    async def close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            await db.close()

    def _conn(self) -> aiosqlite.Connection:
        if self._db is None:
            raise StoreError(f"store {self.path} is not open")
        return self._db

    async def _write(self, statements: Iterable[tuple[str, tuple[object, ...]]], check: _Check | None = None) -> list[int]:
        """Run the statements in one transaction; their row counts (one per run of the same statement).
        `check` runs first inside the transaction and raises StoreConflict to write nothing; the
        controller epoch this store claimed (if any) is checked the same way.

        Shielded: once started, a transaction finishes even if the caller is cancelled (a gRPC
        handler is when its client goes away), so the caller never has to guess whether it committed.
        """
        return await asyncio.shield(self._transaction(list(statements), check))

    async def _transaction(self, statements: list[tuple[str, tuple[object, ...]]], check: _Check | None) -> list[int]:
        db = self._conn()
        async with self._lock:
            try:
                await db.execute("BEGIN IMMEDIATE")
                try:
                    if self._claimed_epoch is not None:
                        epoch = await _controller_epoch(db)
                        if epoch != self._claimed_epoch:
                            raise StoreConflict(
                                f"controller epoch is {epoch}, this coordinator claimed {self._claimed_epoch}: "
                                "another coordinator took control"
                            )
                    if check is not None:
                        await check(db)
                    counts = []
                    # Runs of one statement go as one executemany: one trip to SQLite's thread, not
                    # one per row (a 10,000-partition topic is 10,000 rows). Its count is the run's total.
                    for sql, run in itertools.groupby(statements, key=lambda statement: statement[0]):
                        rows = [params for _sql, params in run]
                        if len(rows) == 1:
                            cur = await db.execute(sql, rows[0])
                        else:
                            cur = await db.executemany(sql, rows)
                        counts.append(cur.rowcount)
                        await cur.close()
                    await db.execute("COMMIT")
                except BaseException:
                    # Suppressed: the original error is the one to report (ROLLBACK fails when COMMIT
                    # already ended the transaction, as SQLite does itself on SQLITE_FULL).
                    with contextlib.suppress(sqlite3.Error):
                        await db.execute("ROLLBACK")
                    raise
            except (sqlite3.Error, OSError) as e:
                if is_disk_full(e):
                    raise StoreFullError(f"disk full on the coordinator ({self.path.name}: {e}); retry once space is freed") from e
                raise
        return counts

    # -- brokers ---------------------------------------------------------------------------------

    async def upsert_broker(self, broker: BrokerRecord) -> None:
        await self._write(
            [
                (
                    "INSERT INTO brokers (broker_id, host, port, registered_ms, rack) VALUES (?, ?, ?, ?, ?) "
                    "ON CONFLICT(broker_id) DO UPDATE SET host=excluded.host, port=excluded.port, "
                    "registered_ms=excluded.registered_ms, rack=excluded.rack",
                    (broker.broker_id, broker.host, broker.port, broker.registered_ms, broker.rack or None),
                )
            ]
        )

    async def load_brokers(self) -> list[BrokerRecord]:
        async with self._conn().execute(
            "SELECT broker_id, host, port, registered_ms, rack FROM brokers ORDER BY broker_id"
        ) as cur:
            rows = await cur.fetchall()
        return [BrokerRecord(int(r[0]), str(r[1]), int(r[2]), int(r[3]), str(r[4] or "")) for r in rows]

    # -- topics ----------------------------------------------------------------------------------

    async def create_topic(self, topic: TopicRecord) -> None:
        """Insert the topic and its placement atomically; TopicExists if it exists."""
        statements: list[tuple[str, tuple[object, ...]]] = [
            (
                "INSERT INTO topics (name, partition_count, config_json, created_ms, creator, version) VALUES (?, ?, ?, ?, ?, 0)",
                (topic.name, topic.partition_count, topic.config.to_json(), topic.created_ms, topic.creator),
            )
        ]
        statements += _insert_partitions(topic.name, topic.states)
        try:
            await self._write(statements)
        except sqlite3.IntegrityError as e:
            raise TopicExists(f"topic {topic.name!r} is already stored") from e
        self._topic_versions[topic.name] = 0
        self._partition_versions.update({(topic.name, p): 0 for p in topic.states})

    def _topic_check(self, name: str) -> _Check:
        """Inside the transaction: the topic's row version is still the one this store knows."""
        expected = self._topic_versions.get(name)

        async def check(db: aiosqlite.Connection) -> None:
            async with db.execute("SELECT COALESCE(version, 0) FROM topics WHERE name = ?", (name,)) as cur:
                row = await cur.fetchone()
            if expected is not None and (row is None or int(row[0]) != expected):
                raise StoreConflict(f"topic {name!r} changed since this coordinator read it (version {expected})")

        return check

    async def add_partitions(
        self, name: str, new_count: int, new_placement: Mapping[int, int] | Mapping[int, PartitionRecord]
    ) -> None:
        """`new_placement`: partition -> its state, or partition -> broker (unreplicated)."""
        statements: list[tuple[str, tuple[object, ...]]] = [
            ("UPDATE topics SET partition_count = ?, version = COALESCE(version, 0) + 1 WHERE name = ?", (new_count, name))
        ]
        states = {p: v if isinstance(v, PartitionRecord) else PartitionRecord.unreplicated(v) for p, v in new_placement.items()}
        statements += _insert_partitions(name, states)
        await self._write(statements, self._topic_check(name))
        self._topic_versions[name] = self._topic_versions.get(name, 0) + 1
        self._partition_versions.update({(name, p): 0 for p in states})

    async def update_partitions(self, states: Mapping[tuple[str, int], PartitionRecord]) -> None:
        """Record new states of existing partitions ((topic, partition) -> state) in one transaction:
        an election, an ISR change, a reassignment step. Rows of deleted topics match nothing.
        StoreConflict (nothing written) if any row's version is not the one this store last saw."""
        current: dict[tuple[str, int], int] = {}

        async def check(db: aiosqlite.Connection) -> None:
            for topic in sorted({t for t, _p in states}):
                async with db.execute(
                    "SELECT partition, COALESCE(version, 0) FROM partitions WHERE topic = ?", (topic,)
                ) as cur:
                    current.update({(topic, int(p)): int(v) for p, v in await cur.fetchall()})
            for key in sorted(states):
                expected = self._partition_versions.get(key)
                if key in current and expected is not None and current[key] != expected:
                    raise StoreConflict(
                        f"partition {key[0]}-{key[1]} changed since this coordinator read it "
                        f"(version {expected}, now {current[key]})"
                    )

        await self._write(
            [
                (
                    "UPDATE partitions SET broker_id = ?, replicas = ?, isr = ?, leader_epoch = ?, partition_epoch = ?, "
                    "version = COALESCE(version, 0) + 1 WHERE topic = ? AND partition = ?",
                    (*_state_columns(s), topic, p),
                )
                for (topic, p), s in sorted(states.items())
            ],
            check,
        )
        self._partition_versions.update({key: current[key] + 1 for key in states if key in current})

    async def remove_partitions(self, name: str, count: int) -> None:
        """Shrink the topic back to `count` partitions: undoes an add_partitions no broker could carry out."""
        await self._write(
            [
                ("DELETE FROM partitions WHERE topic = ? AND partition >= ?", (name, count)),
                ("UPDATE topics SET partition_count = ?, version = COALESCE(version, 0) + 1 WHERE name = ?", (count, name)),
            ],
            self._topic_check(name),
        )
        self._topic_versions[name] = self._topic_versions.get(name, 0) + 1
        for key in [k for k in self._partition_versions if k[0] == name and k[1] >= count]:
            del self._partition_versions[key]

    async def delete_topic(self, name: str) -> None:
        await self._write(
            [
                ("DELETE FROM partitions WHERE topic = ?", (name,)),
                ("DELETE FROM topics WHERE name = ?", (name,)),
            ]
        )
        self._topic_versions.pop(name, None)
        for key in [k for k in self._partition_versions if k[0] == name]:
            del self._partition_versions[key]

    async def load_topics(self) -> list[TopicRecord]:
        db = self._conn()
        placements: dict[str, dict[int, PartitionRecord]] = {}
        async with db.execute(
            "SELECT topic, partition, broker_id, replicas, isr, leader_epoch, partition_epoch, COALESCE(version, 0) "
            "FROM partitions"
        ) as cur:
            for topic, partition, broker_id, replicas, isr, leader_epoch, partition_epoch, version in await cur.fetchall():
                self._partition_versions[(str(topic), int(partition))] = int(version)
                if replicas is None:  # written before replication: the unreplicated partition it was
                    state = PartitionRecord.unreplicated(int(broker_id))
                else:
                    state = PartitionRecord(
                        tuple(int(b) for b in json.loads(replicas)),
                        tuple(int(b) for b in json.loads(isr or "[]")),
                        int(broker_id),
                        int(leader_epoch or 0),
                        int(partition_epoch or 0),
                    )
                placements.setdefault(str(topic), {})[int(partition)] = state
        async with db.execute(
            "SELECT name, partition_count, config_json, created_ms, creator, COALESCE(version, 0) FROM topics ORDER BY name"
        ) as cur:
            rows = await cur.fetchall()
        topics = []
        for name, count, config_json, created_ms, creator, version in rows:
            self._topic_versions[str(name)] = int(version)
            placement = placements.get(str(name), {})
            if sorted(placement) != list(range(int(count))):
                # Cannot happen through this store (one transaction per change); say so if it does.
                log.error("topic placement is incomplete", topic=name, partition_count=count, placed=len(placement))
            topics.append(
                TopicRecord(
                    name=str(name),
                    partition_count=int(count),
                    placement={},
                    states=placement,
                    config=TopicSettings.from_json(str(config_json)),
                    created_ms=int(created_ms),
                    creator=None if creator is None else str(creator),
                )
            )
        return topics

    # -- groups (used by the group coordinator) --------------------------------------------------

    async def save_group(self, group: GroupRecord) -> None:
        """Insert or replace the group's row."""
        offsets_json = json.dumps({str(p): o for p, o in sorted(group.start_offsets.items())})
        await self._write(
            [
                (
                    "INSERT OR REPLACE INTO groups (group_id, topic, app_id, subscription_mode, "
                    "subscription_from_ms, created_ms, start_offsets_json, generation, state_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        group.group_id,
                        group.topic,
                        group.app_id,
                        group.subscription_mode,
                        group.subscription_from_ms,
                        group.created_ms,
                        offsets_json,
                        group.generation,
                        group.state_json or None,
                    ),
                )
            ]
        )

    async def load_groups(self) -> list[GroupRecord]:
        async with self._conn().execute(
            "SELECT group_id, topic, app_id, subscription_mode, subscription_from_ms, created_ms, "
            "start_offsets_json, COALESCE(generation, 0), state_json FROM groups ORDER BY group_id"
        ) as cur:
            rows = await cur.fetchall()
        return [
            GroupRecord(
                group_id=str(r[0]),
                topic=str(r[1]),
                app_id=str(r[2]),
                subscription_mode=str(r[3]),
                subscription_from_ms=None if r[4] is None else int(r[4]),
                created_ms=int(r[5]),
                start_offsets={int(p): int(o) for p, o in json.loads(r[6] or "{}").items()},
                generation=int(r[7]),
                state_json=str(r[8] or ""),
            )
            for r in rows
        ]

    # -- ACLs --------------------------------------------------------------------------------------

    _ACL_COLUMNS = "principal, resource_type, pattern_type, resource_name, operation, permission"

    async def change_acls(self, add: Iterable[AclRow], remove: Iterable[AclRow], version: int) -> int:
        """Insert `add` and delete `remove` (rows of the six ACL words) and set the ACL version,
        in one transaction; how many rows were actually added or removed."""
        statements: list[tuple[str, tuple[object, ...]]] = [
            (f"INSERT OR IGNORE INTO acls ({self._ACL_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)", tuple(row)) for row in add
        ]
        statements += [
            ("DELETE FROM acls WHERE principal = ? AND resource_type = ? AND pattern_type = ? AND resource_name = ? "
             "AND operation = ? AND permission = ?", tuple(row))
            for row in remove
        ]
        statements.append(("INSERT OR REPLACE INTO acl_version (id, version) VALUES (1, ?)", (version,)))
        counts = await self._write(statements)
        return sum(max(0, c) for c in counts[:-1])

    async def load_acls(self) -> tuple[int, list[AclRow]]:
        """(version, rows of the six ACL words)."""
        async with self._conn().execute("SELECT version FROM acl_version WHERE id = 1") as cur:
            row = await cur.fetchone()
        async with self._conn().execute(f"SELECT {self._ACL_COLUMNS} FROM acls ORDER BY {self._ACL_COLUMNS}") as cur:
            rows = await cur.fetchall()
        return (int(row[0]) if row else 0), [tuple(str(v) for v in r) for r in rows]

    async def delete_group(self, group_id: str) -> bool:
        """Remove the group's row; False when there was none."""
        (count,) = await self._write([("DELETE FROM groups WHERE group_id = ?", (group_id,))])
        return count > 0

    # -- principal limits --------------------------------------------------------------------------

    async def save_principal_limits(self, limits: PrincipalLimitsRecord) -> None:
        await self._write(
            [
                (
                    "INSERT OR REPLACE INTO principal_limits (id, max_topics, max_partitions, exempt_json) VALUES (1, ?, ?, ?)",
                    (limits.max_topics, limits.max_partitions, json.dumps(list(limits.exempt))),
                )
            ]
        )

    async def load_principal_limits(self) -> PrincipalLimitsRecord | None:
        async with self._conn().execute(
            "SELECT max_topics, max_partitions, exempt_json FROM principal_limits WHERE id = 1"
        ) as cur:
            row = await cur.fetchone()
        if row is None:
            return None
        return PrincipalLimitsRecord(int(row[0]), int(row[1]), tuple(str(p) for p in json.loads(row[2])))

    # -- controller epoch --------------------------------------------------------------------------

    async def load_controller_epoch(self) -> int:
        return await _controller_epoch(self._conn())

    async def claim_controller_epoch(self) -> int:
        """The read and the bump are one IMMEDIATE transaction, so two claims are serialized: each
        gets its own epoch and the earlier claimer is fenced by the later one."""
        claimed: list[int] = []

        async def bump(db: aiosqlite.Connection) -> None:
            epoch = await _controller_epoch(db) + 1
            await db.execute("INSERT OR REPLACE INTO controller (id, epoch) VALUES (1, ?)", (epoch,))
            claimed.append(epoch)

        # Not fenced by an earlier claim of this same store: claiming again is how it takes control back.
        self._claimed_epoch = None
        await self._write([], bump)
        self._claimed_epoch = claimed[0]
        log.info("controller epoch claimed", epoch=claimed[0], store=str(self.path))
        return claimed[0]
