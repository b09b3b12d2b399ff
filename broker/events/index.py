"""The types-and-tags index of an event store: SQLite beside the partition log.

File `<partition dir>/events.index.sqlite`:

  meta(key, value)           'end': the log end offset indexed so far (positions <= end are in);
                             'fragments_end': the fragments file's length the rows point into
  events(position PK, type, tags, batch, at)
                             tags joined by "\\n" (a tag has no control characters); batch = the
                             offset of the record batch holding the event
  events_by_type(type, position)
  tags(tag, position) PK, type, at
                             one row per (tag, event); a prefix range over 'name:' finds the
                             events carrying an attribute
  at (events, tags)          where the event's encoded read answer lies in the fragments file
                             (fragments.py): the whole event (payload, metadata and the record's
                             timestamp too, copies of the log's), so a read or a claim's events
                             need no record parsed: a read is one query whose matches' `at`
                             SQLite concatenates, and the answer those fragments joined
                             (read_packed)
  PRAGMA user_version        LAYOUT: an index of another layout is rebuilt from the log

The log is the truth: every column and fragment is derived from the log (catch_up() writes the
same rows as an append), so an index rebuilt from the log equals the one written by the appends.
The index is written before an append is acknowledged (same writer thread and connection, see
store.py, so every later query sees it) and committed in groups, without fsync (WAL,
synchronous=NORMAL; see COMMIT_ROWS): after a crash it may lag the log or, when the
log lost a torn or rolled-back tail, run ahead of it. `catch_up()` deletes what lies beyond the log
end and indexes the log from `end` to the log end, so an open index always equals the log. A file
SQLite cannot read is deleted and rebuilt from the log.

One EventIndex is one connection, used by one thread only (the store's writer): it alone sees
the staged, not yet committed rows.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from itertools import accumulate
from typing import NamedTuple

import structlog

from dmq.broker.events.query import QueryItem
from dmq.broker.log import PartitionLog
from dmq.broker.events.fragments import AT, FragmentsFile, FragmentsLostError, answer_fragment
from dmq.proto import dmq_pb2 as pb
from dmq.proto import records
from dmq.proto.event_headers import parse_event_headers

__all__ = ["EventIndex", "INDEX_FILE", "IndexedEvent"]

log = structlog.get_logger(__name__)

INDEX_FILE = "events.index.sqlite"
# How much of the log one catch-up read takes.
CATCH_UP_READ_BYTES = 8 * 1024 * 1024
# The index commits after this many staged rows (events + tags) or this long after the last commit,
# not per append: an append of 100 random tags dirties ~100 pages of the (tag, position) tree, and
# committing each wrote them all to the WAL again (5 ms a commit at 1M events, under load).
# Uncommitted rows are as safe as committed ones: the log holds the events and catch_up() indexes
# whatever a crash took from the index.
COMMIT_ROWS = 200_000
COMMIT_INTERVAL_S = 1.0
INDEX_CACHE_KIB = 64 * 1024
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS events(position INTEGER PRIMARY KEY, type TEXT NOT NULL, tags TEXT NOT NULL,
                                  batch INTEGER NOT NULL, at BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS events_by_type ON events(type, position);
CREATE TABLE IF NOT EXISTS tags(tag TEXT NOT NULL, position INTEGER NOT NULL, type TEXT NOT NULL,
                                at BLOB NOT NULL, PRIMARY KEY(tag, position)) WITHOUT ROWID;
"""
# The index's layout (PRAGMA user_version); 0 was the layout before it was recorded.
LAYOUT = 3
# (position, type, tags, batch offset)
IndexedEvent = tuple[int, str, str, int]
# What stage() takes: (position, type, tags, batch offset, payload, metadata, record timestamp ms)
EventRow = tuple[int, str, Sequence[str], int, bytes, bytes, int]
# One read answer holds at most this many bytes of payloads, metadata, types and tags (and at
# least one event): with the per-event framing it stays well under the gRPC message limit
# (dmq.proto.grpc_options.MAX_MESSAGE_BYTES, 64 MiB; one event is at most a batch, <= 60 MiB).
READ_ANSWER_BYTES = 32 * 1024 * 1024
# events_at() looks positions up this many at a time (SQLite's bound on a statement's parameters).
POSITIONS_PER_QUERY = 500


class EventColumns(NamedTuple):
    """Events in position order, one list per field (the read answer's columnar shape)."""

    positions: list[int]
    types: list[str]
    tags: list[str]  # joined by "\n"
    payloads: list[bytes]
    metadata: list[bytes]
    times_ms: list[int]


class PackedEvents(NamedTuple):
    """Matching events as one encoded columnar answer (read_packed)."""

    answer: bytes  # an encoded EventReadResponse: head, read_to and the columns (positions .. append_times_ms)
    event_count: int
    read_to: int  # the answer holds every matching event in (after, read_to]; 0: not known past its last


def _answer_head(head: int, read_to: int) -> bytes:
    """A read answer's fields other than its columns, encoded (protobuf reads fields in any order)."""
    return pb.EventReadResponse(head=head, read_to=read_to).SerializeToString()


def columns_of(packed: bytes) -> EventColumns:
    """An encoded columnar answer (read_packed) as lists."""
    a = pb.EventReadResponse.FromString(packed)
    return EventColumns(list(a.positions), list(a.types), list(a.tags), list(a.payloads), list(a.metadata),
                        list(a.append_times_ms))


def split_tags(joined: str) -> list[str]:
    return joined.split("\n") if joined else []


def _prefix_range(name: str) -> tuple[str, str]:
    """Tags 'name:...' are exactly those in [name + ':', name + ';') (';' follows ':' in ASCII)."""
    return name + ":", name + ";"


class EventIndex:
    def __init__(self, directory: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = os.path.join(directory, INDEX_FILE)
        self._clock = clock
        self._db = self._connect()
        try:
            self._fragments = FragmentsFile(directory, self._read_meta("fragments_end"))
        except FragmentsLostError as e:
            # rows point at fragments a crash took (never once their commit was fsynced, see
            # commit(); a file lost or cut by hand): rebuilt from the log
            log.warning("event index fragments missing; rebuilding the index from the log", path=self.path, error=str(e))
            self._db.executescript("DELETE FROM tags; DELETE FROM events; DELETE FROM meta;")
            self._fragments = FragmentsFile(directory, 0)
        self.end = self._read_end()
        self._in_transaction = False
        self._staged_rows = 0
        self._committed_at = clock()

    def __repr__(self) -> str:
        return f"<EventIndex {self.path} end={self.end} uncommitted_rows={self._staged_rows}>"

    def _connect(self) -> sqlite3.Connection:
        # isolation_level None: transactions are begun and committed explicitly.
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        # The tag rows of new events land all over the (tag, position) tree: with SQLite's
        # default 2 MB page cache most inserts read pages back from the OS.
        db.execute(f"PRAGMA cache_size=-{INDEX_CACHE_KIB}")
        layout = db.execute("PRAGMA user_version").fetchone()[0]
        if layout != LAYOUT and db.execute("SELECT 1 FROM sqlite_master WHERE name = 'events'").fetchone():
            # An index of another layout: rebuilt from the log (end 0).
            log.info("event index has another layout; rebuilding it from the log", path=self.path, layout=layout)
            db.executescript("DROP TABLE IF EXISTS tags; DROP TABLE IF EXISTS events; DROP TABLE IF EXISTS meta;")
        db.executescript(_SCHEMA)
        db.execute(f"PRAGMA user_version={LAYOUT}")
        return db

    def _read_meta(self, key: str) -> int:
        row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return int(row[0]) if row else 0

    def _read_end(self) -> int:
        return self._read_meta("end")

    def close(self) -> None:
        try:
            self.commit()
        finally:
            self._db.close()
            self._fragments.close()

    # -- writing (the writer's connection) ----------------------------------------------------

    def catch_up(self, plog: PartitionLog) -> int:
        """Make the index equal the log (see the module docstring); the events indexed."""
        if self.end > plog.log_end_offset:
            self.truncate_to(plog.log_end_offset)
        indexed = 0
        offset = max(self.end, plog.log_start_offset)
        while offset < plog.log_end_offset:
            data = plog.read(offset, CATCH_UP_READ_BYTES, max_offset=plog.log_end_offset)
            if not data:
                break
            rows: list[EventRow] = []
            for batch in records.decode_batches(data, max_batch_bytes=plog.config.max_batch_bytes):
                for record in batch.iter_from(offset):
                    try:
                        event_type, tags, metadata = parse_event_headers(record.headers)
                    except ValueError:
                        # not an event: indexed as nothing, never matched by type
                        event_type, tags, metadata = "", [], b""
                    rows.append((record.offset + 1, event_type, tags, batch.base_offset, bytes(record.value),
                                 bytes(metadata), record.timestamp))
                offset = batch.last_offset + 1
            self.add(rows, offset)
            indexed += len(rows)
        self.commit()
        if indexed:
            log.info("event index caught up with the log", path=self.path, events=indexed, end=self.end)
        return indexed

    def truncate_to(self, end_offset: int) -> None:
        """Forget events at positions above `end_offset` (the log lost them, or is about to: a
        replica cut to its new leader's history). Committed with an fsync (synchronous=FULL for
        this commit), unlike additions: a cut that a crash undid could leave rows of events the
        log no longer has, at positions the log then fills with others."""
        was = self.end
        self.commit()  # what is staged first (outside a transaction the setting below applies)
        self._db.execute("PRAGMA synchronous=FULL")
        try:
            with self.transaction():
                # fragments are appended in position order: those of the events cut start at the
                # first one's start; the file is cut there once the rows are gone for good
                row = self._db.execute("SELECT at FROM events WHERE position > ? ORDER BY position LIMIT 1",
                                       (end_offset,)).fetchone()
                fragments_end = AT.unpack(row[0])[0] if row else self._fragments.end
                self._db.execute("DELETE FROM tags WHERE position > ?", (end_offset,))
                self._db.execute("DELETE FROM events WHERE position > ?", (end_offset,))
                self.end = end_offset
                self._fragments.end = fragments_end  # what commit() records
            self.commit()
            self._fragments.cut(fragments_end)
        finally:
            self._db.execute("PRAGMA synchronous=NORMAL")
        log.warning("event index cut back to the log end", path=self.path, was=was, end=end_offset)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Stage changes; on an error everything not yet committed is rolled back (`end` goes back
        to the last commit: catch_up() indexes those events again from the log). Commits are
        grouped (see commit_due)."""
        if not self._in_transaction:
            self._db.execute("BEGIN")
            self._in_transaction = True
        try:
            yield
        except BaseException:
            self._rollback()
            raise
        if self._staged_rows >= COMMIT_ROWS or self._clock() - self._committed_at >= COMMIT_INTERVAL_S:
            self.commit()

    def _rollback(self) -> None:
        if self._in_transaction:
            self._in_transaction = False
            self._staged_rows = 0
            self._db.execute("ROLLBACK")
            self.end = self._read_end()
            self._fragments.cut(self._read_meta("fragments_end"))

    def commit(self) -> None:
        """Commit what is staged (and `end` with it)."""
        if not self._in_transaction:
            return
        try:
            # the fragments the rows point at are durable before the rows can be (once a second
            # or COMMIT_ROWS rows: cheap)
            self._fragments.sync()
            self._db.executemany("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                                 (("end", self.end), ("fragments_end", self._fragments.end)))
            self._db.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise
        self._in_transaction = False
        self._staged_rows = 0
        self._committed_at = self._clock()

    def stage(self, rows: Sequence[EventRow], end_offset: int) -> None:
        """Index events (position, type, tags, batch offset, payload, metadata, record timestamp)
        and move `end` to end_offset, inside a transaction(); queries on this connection see them
        at once."""
        db = self._db
        joined = ["\n".join(row[2]) for row in rows]
        # the fragments first: a row never points at bytes not yet written
        ats = self._fragments.append([answer_fragment(p, t, j, payload, meta, ms)
                                      for (p, t, _, _, payload, meta, ms), j in zip(rows, joined, strict=True)])
        at_of = [ats[i : i + AT.size] for i in range(0, len(ats), AT.size)]
        db.executemany(
            "INSERT OR REPLACE INTO events(position, type, tags, batch, at) VALUES (?, ?, ?, ?, ?)",
            [(p, t, j, b, at) for (p, t, _, b, _, _, _), j, at in zip(rows, joined, at_of, strict=True)],
        )
        db.executemany(
            "INSERT OR IGNORE INTO tags(tag, position, type, at) VALUES (?, ?, ?, ?)",
            [(tag, row[0], row[1], at) for row, at in zip(rows, at_of, strict=True) for tag in row[2]],
        )
        self._staged_rows += len(rows) + sum(len(row[2]) for row in rows)
        self.end = end_offset

    def add(self, rows: Sequence[EventRow], end_offset: int) -> None:
        """stage() in a transaction of its own."""
        with self.transaction():
            self.stage(rows, end_offset)

    # -- queries -----------------------------------------------------------------------------------

    def matching(self, query: Sequence[QueryItem], after: int, until: int, limit: int) -> list[int]:
        """The positions of the first `limit` events in (after, until] that match."""
        params: list[object] = []
        sql = self._matches_sql(list(query) or [QueryItem()], after, until, params)
        return [row[0] for row in self._db.execute(sql, [*params, limit])]

    def read(self, query: Sequence[QueryItem], after: int, until: int, limit: int,
             max_bytes: int = READ_ANSWER_BYTES) -> EventColumns:
        """read_packed(), as columns (subscriptions, and clients that ask for one message per event)."""
        return columns_of(self.read_packed(query, after, until, limit, max_bytes).answer)

    @staticmethod
    def _item_sql(item: QueryItem, after: int, until: int, params: list[object]) -> str:
        """SELECT position, at of the events matching one item in (after, until]: from the tags
        table alone when the item names a tag (no lookup of the events table), else from the
        events table."""
        if not item.tags:
            sql = "SELECT position, at FROM events WHERE position > ? AND position <= ?"
            params += [after, until]
            if item.types:
                sql += f" AND type IN ({','.join('?' * len(item.types))})"
                params += item.types
            return sql
        first, *rest = item.tags
        sql = "SELECT t0.position AS position, t0.at AS at FROM tags t0"
        for i, _ in enumerate(rest, 1):
            sql += f" JOIN tags t{i} ON t{i}.tag = ? AND t{i}.position = t0.position"
        params += rest
        sql += " WHERE t0.tag = ? AND t0.position > ? AND t0.position <= ?"
        params += [first, after, until]
        if item.types:
            sql += f" AND t0.type IN ({','.join('?' * len(item.types))})"
            params += item.types
        return sql

    def read_packed(self, query: Sequence[QueryItem], after: int, until: int, limit: int,
                    max_bytes: int = READ_ANSWER_BYTES) -> PackedEvents:
        """read() as its encoded columnar answer, head `until`: the fragments (fragments.py) of
        the first `limit` matches, concatenated, cut before the fragment that would take them past
        `max_bytes` (never before the first). SQLite concatenates the matches' (start, end)
        pairs, so no row becomes a Python object."""
        items = list(query) or [QueryItem()]
        params: list[object] = []
        inner = self._matches_sql(items, after, until, params)
        # group_concat takes the rows in the order the subquery yields them (position order). The
        # CAST keeps the bytes as they are: the result is a blob, not text to decode.
        sql = f"SELECT CAST(group_concat(at, '') AS BLOB), count(*), max(position) FROM ({inner})"
        ats, count, last = self._db.execute(sql, [*params, limit]).fetchone()
        if count == 0:
            return PackedEvents(_answer_head(until, until), 0, until)
        pairs = array("Q", ats)
        if len(pairs) != 2 * count:
            raise ValueError(f"event index: {count} matches gave {len(ats)} bytes of fragment addresses")
        starts, ends = pairs[0::2], pairs[1::2]
        if sum(ends) - sum(starts) > max_bytes:
            sizes = list(accumulate(map(int.__sub__, ends, starts)))
            count = max(1, bisect_right(sizes, max_bytes))
            del pairs[2 * count :]
            read_to = 0  # not known past the last event kept
        elif count < limit or not self._match_after(items, last, until):
            # no match lies beyond the last event: the client needs no further call to learn
            # that the read is complete
            read_to = until
        else:
            read_to = last
        return PackedEvents(self._fragments.gather(pairs, prefix=_answer_head(until, read_to)), count, read_to)

    def _matches_sql(self, items: Sequence[QueryItem], after: int, until: int, params: list[object]) -> str:
        """SELECT position, at of the first (LIMIT ?, the caller's last parameter) events in
        (after, until] that match one of `items`, in position order."""
        if len(items) == 1:
            # the driving rows are already in position order: SQLite stops at the limit, no sort
            return self._item_sql(items[0], after, until, params) + " ORDER BY position LIMIT ?"
        union = " UNION ".join(self._item_sql(item, after, until, params) for item in items)
        return f"SELECT position, at FROM ({union}) ORDER BY position LIMIT ?"

    def _match_after(self, items: Sequence[QueryItem], after: int, until: int) -> bool:
        """Whether an event in (after, until] matches: the first row found ends the scan."""
        params: list[object] = []
        union = " UNION ALL ".join(self._item_sql(item, after, until, params) for item in items)
        return self._db.execute(f"SELECT 1 FROM ({union}) LIMIT 1", params).fetchone() is not None

    def events_at(self, positions: Sequence[int]) -> EventColumns:
        """The events at these positions (ascending, indexed), whole, from the index alone: what a
        claim returns (its positions come from the group's fetch)."""
        ats = []
        for i in range(0, len(positions), POSITIONS_PER_QUERY):
            chunk = positions[i : i + POSITIONS_PER_QUERY]
            ats.append(self._db.execute(
                "SELECT CAST(group_concat(at, '') AS BLOB) FROM"
                f" (SELECT at FROM events WHERE position IN ({','.join('?' * len(chunk))}) ORDER BY position)",
                chunk,
            ).fetchone()[0] or b"")
        return columns_of(self._fragments.gather(array("Q", b"".join(ats))))

    def first_match(self, query: Sequence[QueryItem], after: int, until: int) -> int | None:
        positions = self.matching(query, after, until, 1)
        return positions[0] if positions else None

    # -- consumer groups -------------------------------------------------------------------------

    def with_attribute(self, name: str, after: int, until: int) -> Iterator[tuple[int, str]]:
        """(position, tags) of the events in (after, until] carrying attribute `name`, in
        position order (the caller checks the other attributes on `tags`)."""
        low, high = _prefix_range(name)
        return iter(self._db.execute(
            "SELECT DISTINCT t.position, e.tags FROM tags t JOIN events e ON e.position = t.position"
            " WHERE t.tag >= ? AND t.tag < ? AND t.position > ? AND t.position <= ? ORDER BY t.position",
            (low, high, after, until),
        ))

    def of_types(self, types: Sequence[str], after: int, until: int, limit: int) -> list[tuple[int, str]]:
        """(position, tags) of the next `limit` events of `types` in (after, until]."""
        sql = (f"SELECT position, tags FROM events WHERE type IN ({','.join('?' * len(types))})"
               " AND position > ? AND position <= ? ORDER BY position LIMIT ?")
        return self._db.execute(sql, [*types, after, until, limit]).fetchall()

    def with_any_tag(
        self, tags: Sequence[str], types: Sequence[str], after: int, until: int
    ) -> Iterator[tuple[int, str, int]]:
        """(position, tags, batch) of the events of `types` in (after, until] carrying at least
        one of `tags`, each once, in position order (the candidates of a partition's fetch)."""
        # driven by the tags' rows ("+e.type", "ORDER BY t.position": see _item_sql)
        sql = (f"SELECT DISTINCT e.position, e.tags, e.batch FROM tags t JOIN events e ON e.position = t.position"
               f" WHERE t.tag IN ({','.join('?' * len(tags))}) AND t.position > ? AND t.position <= ?"
               f" AND +e.type IN ({','.join('?' * len(types))}) ORDER BY t.position")
        return iter(self._db.execute(sql, [*tags, after, until, *types]))

