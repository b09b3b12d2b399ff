"""The types-and-tags index of an event store: in memory, persisted as one append-only file.

What conditions and reads need is kept in memory, so checking a condition costs microseconds:

  per tag, per type   the positions carrying it, ascending (array('q'): positions only grow);
                      the last one answers "nothing after P" at once
  per event           position, batch offset, type, tags (joined by "\\n"; a tag has no control
                      characters) and where its read answer lies in the file (fragments.py)

File `<partition dir>/events.index`, beside the segments: MAGIC, then one record per append (per
batch, and per catch-up read of the log), never per event. A record, little-endian:

  body_len u32 | crc32 u32 | first_position i64 | end_offset i64 | count u32 | meta_len u32   (HEAD)
  positions  i64 x count
  batches    i64 x count      the offset of the record batch holding each event
  lengths    u32 x count      each event's fragment length
  meta       meta_len bytes   UTF-8: type "\\x01" tags-joined, per event, "\\x00" between events
  fragments  each event's read answer, encoded (fragments.answer_fragments), in position order

The crc covers the header after it and the body. `end_offset` is the log end indexed once the
record is in; the last record's is the index's `end`. A record whose crc or length does not hold
(a torn write, a damaged file) ends the file: it and everything after it is cut off and indexed
again from the log.

The log is the truth: every field is derived from the log (catch_up() writes the same records as
the appends), so an index rebuilt from the log answers as the one the appends wrote. A record is
written (no fsync) before its append is acknowledged, which waits for the log's group commit
only; the writer fsyncs the file at the end of a job at most once per SYNC_INTERVAL_S, and at
close (that bounds what a restart indexes again, nothing more): after a crash the index may lag the
log (catch_up() indexes the rest) or, when the log lost a torn or rolled-back tail, run ahead of
it (catch_up() cuts it back). A cut (truncate_to) is fsynced at once: a cut a crash undid could
leave events the log no longer has at positions it then fills with others.

One EventIndex is used by one thread at a time: the store's writer, or the event loop while the
writer has no job (store.py, _idle_index).
"""

from __future__ import annotations

import contextlib
import heapq
import mmap
import operator
import os
import struct
import time
import zlib
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import accumulate, islice, repeat
from typing import NamedTuple, cast

import structlog

from dmq.broker.events.fragments import answer_fragments
from dmq.broker.events.query import QueryItem
from dmq.broker.log import PartitionLog
from dmq.proto import dmq_pb2 as pb
from dmq.proto import records
from dmq.proto.event_headers import parse_event_headers

__all__ = ["EventIndex", "INDEX_FILE", "EventColumns", "PackedEvents", "columns_of", "split_tags"]

log = structlog.get_logger(__name__)

INDEX_FILE = "events.index"
# Files of the SQLite index this one replaced: removed at open (the new file is rebuilt from the log).
OLD_FILES = ("events.index.sqlite", "events.index.sqlite-wal", "events.index.sqlite-shm", "events.fragments")
MAGIC = b"DMQEIX01"
HEAD = struct.Struct("<IIqqII")
# How much of the log one catch-up read takes (one record each).
CATCH_UP_READ_BYTES = 8 * 1024 * 1024
# The file is fsynced at most this often (the log is the truth; this bounds what a restart re-reads).
SYNC_INTERVAL_S = 1.0
# One read answer holds at most this many bytes of payloads, metadata, types and tags (and at
# least one event): with the per-event framing it stays well under the gRPC message limit
# (dmq.proto.grpc_options.MAX_MESSAGE_BYTES, 64 MiB; one event is at most a batch, <= 60 MiB).
READ_ANSWER_BYTES = 32 * 1024 * 1024
# What stage() takes: (position, type, tags, batch offset, payload, metadata, record timestamp ms)
EventRow = tuple[int, str, Sequence[str], int, bytes, bytes, int]


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


def _range(arr: array[int], after: int, until: int) -> tuple[int, int]:
    """The slice of an ascending array holding the values in (after, until]."""
    if not arr or arr[-1] <= after:  # the last position: nothing after `after`, no search
        return 0, 0
    return bisect_right(arr, after), bisect_right(arr, until)


def _values(arr: array[int], lo: int, hi: int) -> Iterator[int]:
    return islice(arr, lo, hi) if lo == 0 else (arr[i] for i in range(lo, hi))


def _contains(arr: array[int], value: int) -> bool:
    i = bisect_left(arr, value)
    return i < len(arr) and arr[i] == value


def _distinct(merged: Iterable[int]) -> Iterator[int]:
    last = -1
    for p in merged:
        if p != last:
            yield p
            last = p


def _top(by_name: dict[str, array[int]], until: int, limit: int) -> tuple[list[tuple[str, int]], int]:
    """(name, positions <= until) of the `limit` names with the most, ties by name; and how many
    names have any. A bisection per name: O(names log events), nothing read from the file."""
    counted = ((name, bisect_right(arr, until)) for name, arr in by_name.items())
    present = [(name, n) for name, n in counted if n]
    return heapq.nsmallest(limit, present, key=lambda item: (-item[1], item[0])), len(present)


class IndexCorruptError(Exception):
    """A record of the index file does not hold (its crc, its length): see the module docstring."""


class EventIndex:
    def __init__(self, directory: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = os.path.join(directory, INDEX_FILE)
        self._clock = clock
        for name in OLD_FILES:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, name))
                log.info("old event index file removed; the index is rebuilt from the log", path=name)
        self._reset_memory()
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        self._map: mmap.mmap | None = None
        self._view = memoryview(b"")
        try:
            self._load()
        except BaseException:
            os.close(self._fd)
            raise
        self._synced_at = clock()
        self._dirty = False

    def _reset_memory(self) -> None:
        self.end = 0  # the log end indexed: positions <= end are in
        self._positions = array("q")
        self._batches = array("q")
        self._starts = array("Q")  # each event's fragment in the file: [start, end)
        self._ends = array("Q")
        self._type_of = array("I")  # the event's type, as an index into _type_names
        self._tags: list[str] = []  # joined by "\n"
        self._type_names: list[str] = []
        self._type_ids: dict[str, int] = {}
        self._by_type: dict[str, array[int]] = {}
        self._by_tag: dict[str, array[int]] = {}
        self._attr_tags: dict[str, set[str]] = {}  # attribute name -> its tags 'name:value'
        self._records = array("Q")  # each record's offset in the file
        self._record_first = array("q")  # each record's first event, as an index into the columns
        self._file_end = len(MAGIC)

    def __repr__(self) -> str:
        return (f"<EventIndex {self.path} end={self.end} events={len(self._positions)} tags={len(self._by_tag)} "
                f"types={len(self._by_type)} file_bytes={self._file_end}>")

    # -- the file -----------------------------------------------------------------------------------

    def _load(self) -> None:
        """Read the file into memory; a bad record ends it (cut off, durably)."""
        size = os.fstat(self._fd).st_size
        if size < len(MAGIC) or os.pread(self._fd, len(MAGIC), 0) != MAGIC:
            if size:
                log.warning("event index file has no valid header; rebuilding it from the log", path=self.path)
            self._cut_file(0)
            self._write_all(MAGIC, 0)
            self._file_end = len(MAGIC)
            return
        at = len(MAGIC)
        try:
            # mapped, not read: a record at a time is copied out (the file holds every event's payload)
            with mmap.mmap(self._fd, 0, access=mmap.ACCESS_READ) as data:
                while at < size:
                    at = self._load_record(data, at)
        except IndexCorruptError as e:
            log.warning("event index file damaged; cut at the bad record and indexed again from the log",
                        path=self.path, at=at, error=str(e), events_kept=len(self._positions))
            self._cut_file(at)
        self._file_end = at

    def _load_record(self, data: mmap.mmap, at: int) -> int:
        if len(data) - at < HEAD.size:
            raise IndexCorruptError(f"a record header at {at} is cut short")
        # struct's unpack is typed as a tuple of Any; HEAD's six fields are all integers
        body_len, crc, first, end, count, meta_len = cast("tuple[int, int, int, int, int, int]", HEAD.unpack_from(data, at))
        body_at = at + HEAD.size
        if body_at + body_len > len(data):
            raise IndexCorruptError(f"the record at {at} claims {body_len} bytes; the file ends before")
        if zlib.crc32(data[body_at : body_at + body_len], zlib.crc32(data[at + 8 : body_at])) != crc:
            raise IndexCorruptError(f"the record at {at} fails its crc")
        fixed = 20 * count
        if fixed + meta_len > body_len:
            raise IndexCorruptError(f"the record at {at} is inconsistent ({count} events, {body_len} bytes)")
        positions = array("q", data[body_at : body_at + 8 * count])
        batches = array("q", data[body_at + 8 * count : body_at + 16 * count])
        lengths = array("I", data[body_at + 16 * count : body_at + fixed])
        meta_at = body_at + fixed
        meta = data[meta_at : meta_at + meta_len].decode()
        entries = meta.split("\x00") if count else []
        frag_at = meta_at + meta_len
        if len(entries) != count or frag_at + sum(lengths) != body_at + body_len or (count and positions[0] != first):
            raise IndexCorruptError(f"the record at {at} is inconsistent")
        types, tags = [], []
        for entry in entries:
            t, _, j = entry.partition("\x01")
            types.append(t)
            tags.append(j)
        self._remember(at, positions, batches, types, tags, frag_at, lengths, end)
        return body_at + body_len

    def _write_all(self, data: bytes | memoryview, at: int) -> None:
        view = memoryview(data)
        while view:
            written = os.pwrite(self._fd, view, at)
            view, at = view[written:], at + written

    def _cut_file(self, at: int) -> None:
        self._unmap()  # a map past the new end would fault on access
        os.ftruncate(self._fd, at)
        os.fsync(self._fd)

    def _write_record(self, positions: array[int], batches: array[int], types: Sequence[str],
                      tags: Sequence[str], fragments: Sequence[bytes], end_offset: int,
                      tag_lists: Sequence[Sequence[str]] | None = None) -> None:
        """Append one record and take it into memory (after the write: a failed write changes
        nothing; its bytes past the old end are cut off)."""
        count = len(positions)
        if len(types) != count or len(tags) != count:
            raise ValueError(f"_write_record: {count} positions, {len(types)} types, {len(tags)} tags")
        meta = "\x00".join(map("\x01".join, zip(types, tags))).encode()
        lengths = array("I", map(len, fragments))
        body = b"".join([positions.tobytes(), batches.tobytes(), lengths.tobytes(), meta, *fragments])
        rest = HEAD.pack(len(body), 0, positions[0] if count else end_offset, end_offset, count, len(meta))[8:]
        head = HEAD.pack(len(body), zlib.crc32(body, zlib.crc32(rest)), positions[0] if count else end_offset,
                         end_offset, count, len(meta))
        at = self._file_end
        try:
            self._write_all(head + body, at)
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, at)
            raise
        self._file_end = at + HEAD.size + len(body)
        self._dirty = True
        self._remember(at, positions, batches, types, tags, at + HEAD.size + 20 * count + len(meta), lengths,
                       end_offset, tag_lists)

    def sync(self) -> None:
        if self._dirty:
            os.fdatasync(self._fd)
            self._dirty = False
        self._synced_at = self._clock()

    def commit(self) -> None:
        """Make what is written durable (an alias the store calls at the end of a job)."""
        self.sync()

    # -- memory --------------------------------------------------------------------------------------

    def _remember(self, record_at: int, positions: array[int], batches: array[int], types: Sequence[str],
                  tags: Sequence[str], fragments_at: int, lengths: array[int], end_offset: int,
                  tag_lists: Sequence[Sequence[str]] | None = None) -> None:
        """Take a record into memory; `tag_lists`: each event's tags (`tags` joined), when the
        caller has them."""
        self._records.append(record_at)
        self._record_first.append(len(self._positions))
        bounds = array("Q", accumulate(lengths, initial=fragments_at))
        self._starts.extend(bounds[:-1])
        self._ends.extend(bounds[1:])
        self._positions.extend(positions)
        self._batches.extend(batches)
        self._tags.extend(tags)
        type_ids, by_type, by_tag = self._type_ids, self._by_type, self._by_tag
        type_of = self._type_of
        count = len(positions)
        if count and len(types) == count and types.count(types[0]) == count:
            # one type for the whole record (an append's usual batch): its columns in one step each
            t = types[0]
            tid = type_ids.get(t)
            if tid is None:  # type ids stay when their events are cut (a few names)
                tid = type_ids[t] = len(self._type_names)
                self._type_names.append(t)
            type_of.extend(repeat(tid, count))
            by_type.setdefault(t, array("q")).extend(positions)
        else:
            for p, t in zip(positions, types, strict=True):
                try:
                    tid = type_ids[t]
                except KeyError:
                    tid = type_ids[t] = len(self._type_names)
                    self._type_names.append(t)
                type_of.append(tid)
                try:
                    by_type[t].append(p)
                except KeyError:
                    by_type[t] = array("q", [p])
        # an append passes its events' tags as it has them; a record read back splits its joined ones
        split = tag_lists if tag_lists is not None else [j.split("\n") if j else () for j in tags]
        # one dict lookup per tag in the common case (a known tag): the KeyError path is the rarer one
        for p, event_tags in zip(positions, split, strict=True):
            for tag in event_tags:
                try:
                    by_tag[tag].append(p)
                except KeyError:
                    self._new_tag(tag, p)
        self.end = end_offset

    def _new_tag(self, tag: str, p: int) -> None:
        self._by_tag[tag] = array("q", (p,))
        name, sep, _ = tag.partition(":")
        if sep:
            tags = self._attr_tags.get(name)
            if tags is None:
                self._attr_tags[name] = {tag}
            else:
                tags.add(tag)

    def _forget_from(self, k: int, record: int) -> None:
        """Forget the events from column index k on (they are the last ones of every array) and
        the records from `record` on (the records holding them)."""
        for i in range(len(self._positions) - 1, k - 1, -1):
            t = self._type_names[self._type_of[i]]
            self._pop(self._by_type, t)
            if self._tags[i]:
                for tag in self._tags[i].split("\n"):
                    if self._pop(self._by_tag, tag):
                        name, sep, _ = tag.partition(":")
                        if sep:
                            tags = self._attr_tags[name]
                            tags.discard(tag)
                            if not tags:
                                del self._attr_tags[name]
        for column in (self._positions, self._batches, self._starts, self._ends, self._type_of):
            del column[k:]
        del self._tags[k:]
        del self._records[record:]
        del self._record_first[record:]

    @staticmethod
    def _pop(arrays: dict[str, array[int]], key: str) -> bool:
        """Drop the last position of arrays[key]; whether the array went empty (and was removed)."""
        arr = arrays[key]
        arr.pop()
        if not arr:
            del arrays[key]
            return True
        return False

    def _slot(self, position: int) -> int:
        """The column index of an indexed position (positions are dense unless the log had a gap)."""
        positions = self._positions
        first = positions[0]
        if positions[-1] - first == len(positions) - 1:
            return position - first
        return bisect_left(positions, position)

    def _slots(self, positions: Sequence[int]) -> list[int]:
        """_slot() of each position: one subtraction in C per position while positions are dense
        (a 10,000-event read spent ~3 ms calling _slot per event)."""
        columns = self._positions
        if columns and columns[-1] - columns[0] == len(columns) - 1:
            return list(map(operator.sub, positions, repeat(columns[0], len(positions))))
        return list(map(self._slot, positions))

    # -- writing ---------------------------------------------------------------------------------

    def close(self) -> None:
        try:
            self.sync()
        finally:
            self._unmap()
            os.close(self._fd)

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
        self.sync()
        if indexed:
            log.info("event index caught up with the log", path=self.path, events=indexed, end=self.end)
        return indexed

    def truncate_to(self, end_offset: int) -> None:
        """Forget events at positions above `end_offset` (the log lost them, or is about to: a
        replica cut to its new leader's history), durably (see the module docstring). The file is
        cut at the record holding the first event dropped; that record's events that stay are
        written again as a record of their own."""
        was = self.end
        k = bisect_right(self._positions, end_offset)
        r = bisect_right(self._record_first, k) - 1 if k < len(self._positions) else len(self._records)
        if r < len(self._records):
            keep_from = self._record_first[r]
            kept = self._kept(keep_from, k)
            cut_at = self._records[r]
            self._forget_from(keep_from, r)
            self._cut_file(cut_at)
            self._file_end = cut_at
            self._write_record(*kept, end_offset)
        else:
            self._write_record(array("q"), array("q"), [], [], [], end_offset)  # `end` moves back
        self.sync()
        log.warning("event index cut back to the log end", path=self.path, was=was, end=end_offset)

    def _kept(self, lo: int, hi: int) -> tuple[array[int], array[int], list[str], list[str], list[bytes]]:
        """The columns of events lo..hi-1, as _write_record takes them (fragments read back)."""
        view = self._mapped(self._ends[hi - 1]) if hi > lo else memoryview(b"")
        return (self._positions[lo:hi], self._batches[lo:hi], [self._type_names[t] for t in self._type_of[lo:hi]],
                self._tags[lo:hi], [bytes(view[self._starts[i] : self._ends[i]]) for i in range(lo, hi)])

    def sync_due(self) -> bool:
        """Whether written records wait for their periodic fsync (SYNC_INTERVAL_S since the last)."""
        return self._dirty and self._clock() - self._synced_at >= SYNC_INTERVAL_S

    @contextlib.contextmanager
    def transaction(self, *, sync: bool = True) -> Iterator[None]:
        """Stage records; on an error what was staged inside is forgotten and cut from the file
        (catch_up() indexes those events again from the log). With `sync` the file is fsynced
        here, at most once per SYNC_INTERVAL_S (without, the caller runs sync() when sync_due())."""
        events, records, file_end, end = len(self._positions), len(self._records), self._file_end, self.end
        try:
            yield
        except BaseException:
            if len(self._positions) != events or self._file_end != file_end:
                self._forget_from(events, records)
                with contextlib.suppress(OSError):
                    self._cut_file(file_end)
                self._file_end = file_end
            self.end = end
            raise
        if sync and self.sync_due():
            self.sync()

    def stage(self, rows: Sequence[EventRow], end_offset: int) -> None:
        """Index events (position, type, tags, batch offset, payload, metadata, record timestamp)
        and move `end` to end_offset: one record, written, seen by queries at once."""
        if rows:
            positions, types, tags, batches, payloads, metadata, times_ms = zip(*rows)
            self.stage_columns(positions, types, list(map("\n".join, tags)), batches, payloads, metadata, times_ms,
                               end_offset)
        else:
            self._write_record(array("q"), array("q"), [], [], [], end_offset)

    def stage_columns(self, positions: Sequence[int], types: Sequence[str], tags: Sequence[str], batches: Sequence[int],
                      payloads: Sequence[bytes], metadata: Sequence[bytes], times_ms: Sequence[int],
                      end_offset: int, tag_lists: Sequence[Sequence[str]] | None = None) -> None:
        """stage() of the events as parallel columns, tags joined by "\n" (an append's batch);
        `tag_lists`, each event's tags unjoined, spares splitting them again."""
        fragments = answer_fragments(positions, types, tags, payloads, metadata, times_ms)
        self._write_record(array("q", positions), array("q", batches), types, tags, fragments, end_offset, tag_lists)

    def add(self, rows: Sequence[EventRow], end_offset: int) -> None:
        """stage() in a transaction of its own."""
        with self.transaction():
            self.stage(rows, end_offset)

    # -- queries -----------------------------------------------------------------------------------

    def _item_positions(self, item: QueryItem, after: int, until: int) -> Iterator[int]:
        """The positions in (after, until] of the events matching one item, ascending."""
        if item.tags:
            ranges = []
            for tag in item.tags:
                arr = self._by_tag.get(tag)
                if arr is None:
                    return iter(())
                lo, hi = _range(arr, after, until)
                if lo >= hi:
                    return iter(())
                ranges.append((hi - lo, lo, hi, arr))
            ranges.sort(key=lambda r: r[0])
            _, lo, hi, driver = ranges[0]
            candidates = _values(driver, lo, hi)
            others = [r[3] for r in ranges[1:]]
            if others:
                candidates = (p for p in candidates if all(_contains(a, p) for a in others))
            if item.types:
                type_ids = {self._type_ids[t] for t in item.types if t in self._type_ids}
                type_of, slot = self._type_of, self._slot
                candidates = (p for p in candidates if type_of[slot(p)] in type_ids)
            return candidates
        if item.types:
            sources = []
            for t in item.types:
                arr = self._by_type.get(t)
                if arr is not None:
                    lo, hi = _range(arr, after, until)
                    if lo < hi:
                        sources.append(_values(arr, lo, hi))
            return sources[0] if len(sources) == 1 else _distinct(heapq.merge(*sources))
        lo, hi = _range(self._positions, after, until)
        return _values(self._positions, lo, hi)

    def _query_positions(self, query: Sequence[QueryItem], after: int, until: int) -> Iterator[int]:
        items = list(query) or [QueryItem()]
        if len(items) == 1:
            return self._item_positions(items[0], after, until)
        return _distinct(heapq.merge(*(self._item_positions(item, after, until) for item in items)))

    def matching(self, query: Sequence[QueryItem], after: int, until: int, limit: int) -> list[int]:
        """The positions of the first `limit` events in (after, until] that match."""
        items = list(query)
        if len(items) == 1 and len(items[0].tags) == 1 and not items[0].types:
            # one tag: a slice of its array (C speed, the reads' common case)
            arr = self._by_tag.get(items[0].tags[0])
            if arr is None:
                return []
            lo, hi = _range(arr, after, until)
            return arr[lo : min(hi, lo + limit)].tolist()
        return list(islice(self._query_positions(query, after, until), limit))

    def first_match(self, query: Sequence[QueryItem], after: int, until: int) -> int | None:
        return next(self._query_positions(query, after, until), None)

    def read(self, query: Sequence[QueryItem], after: int, until: int, limit: int,
             max_bytes: int = READ_ANSWER_BYTES) -> EventColumns:
        """read_packed(), as columns (subscriptions, and clients that ask for one message per event)."""
        return columns_of(self.read_packed(query, after, until, limit, max_bytes).answer)

    def _spans(self, positions: Sequence[int]) -> tuple[Sequence[int], Sequence[int]]:
        """The starts and the ends of these events' fragments in the file (one C call each)."""
        slots = self._slots(positions)
        if len(slots) < 2:  # itemgetter of one item answers the item, not a tuple
            return [self._starts[i] for i in slots], [self._ends[i] for i in slots]
        get = operator.itemgetter(*slots)
        return get(self._starts), get(self._ends)

    def read_packed(self, query: Sequence[QueryItem], after: int, until: int, limit: int,
                    max_bytes: int = READ_ANSWER_BYTES) -> PackedEvents:
        """read() as its encoded columnar answer, head `until`: the fragments (fragments.py) of
        the first `limit` matches, concatenated, cut before the fragment that would take them past
        `max_bytes` (never before the first)."""
        positions = self.matching(query, after, until, limit)
        count = len(positions)
        if count == 0:
            return PackedEvents(_answer_head(until, until), 0, until)
        starts, ends = self._spans(positions)
        if sum(ends) - sum(starts) > max_bytes:
            sizes = list(accumulate(map(int.__sub__, ends, starts)))
            count = max(1, bisect_right(sizes, max_bytes))
            starts, ends = starts[:count], ends[:count]
            read_to = 0  # not known past the last event kept
        elif count < limit or self.first_match(query, positions[-1], until) is None:
            # no match lies beyond the last event: the client needs no further call to learn
            # that the read is complete
            read_to = until
        else:
            read_to = positions[-1]
        return PackedEvents(self._gather(starts, ends, prefix=_answer_head(until, read_to)), count, read_to)

    def events_at(self, positions: Sequence[int]) -> EventColumns:
        """The events at these positions (ascending, indexed), whole, from the index alone: what a
        claim returns (its positions come from the group's fetch)."""
        return columns_of(self._gather(*self._spans(positions)))

    def _mapped(self, needed: int) -> memoryview:
        if self._map is None or len(self._map) < needed:
            self._unmap()
            self._map = mmap.mmap(self._fd, 0, access=mmap.ACCESS_READ)
            self._view = memoryview(self._map)
            if len(self._map) < needed:
                raise OSError(f"{self.path} holds {len(self._map)} bytes, a fragment ends at {needed}")
        return self._view

    def _gather(self, starts: Sequence[int], ends: Sequence[int], prefix: bytes = b"") -> bytes:
        """`prefix`, then the fragments at these (start, end) spans, concatenated: protobuf
        appends repeated fields of concatenated messages, so this is the columnar answer."""
        if not starts:
            return prefix
        self._mapped(max(ends))
        data = self._map
        assert data is not None  # mapped just now
        # slices of the map itself (bytes), not of a memoryview of it: a fragment is ~100s of
        # bytes, and a memoryview object per fragment cost twice the copy (10,000-event reads)
        return b"".join([prefix, *[data[a:b] for a, b in zip(starts, ends)]])

    def _unmap(self) -> None:
        if self._map is not None:
            self._view.release()
            self._map.close()
            self._map = None

    # -- consumer groups -------------------------------------------------------------------------

    def _tags_positions(self, tags: Iterable[str], after: int, until: int) -> Iterator[int]:
        """The positions in (after, until] of the events carrying any of `tags`, each once, ascending."""
        sources = []
        for tag in tags:
            arr = self._by_tag.get(tag)
            if arr is not None:
                lo, hi = _range(arr, after, until)
                if lo < hi:
                    sources.append(_values(arr, lo, hi))
        return sources[0] if len(sources) == 1 else _distinct(heapq.merge(*sources))

    def type_counts(self, until: int, limit: int) -> tuple[list[tuple[str, int]], int]:
        """The `limit` most frequent types with their events up to `until`, and how many types there are."""
        return _top(self._by_type, until, limit)

    def tag_counts(self, until: int, limit: int) -> tuple[list[tuple[str, int]], int]:
        """The `limit` most frequent tags with their events up to `until`, and how many tags there are."""
        return _top(self._by_tag, until, limit)

    def with_attribute(self, name: str, after: int, until: int) -> Iterator[tuple[int, str]]:
        """(position, tags) of the events in (after, until] carrying attribute `name`, in
        position order (the caller checks the other attributes on `tags`)."""
        tags, slot = self._tags, self._slot
        return ((p, tags[slot(p)]) for p in self._tags_positions(sorted(self._attr_tags.get(name, ())), after, until))

    def of_types(self, types: Sequence[str], after: int, until: int, limit: int) -> list[tuple[int, str]]:
        """(position, tags) of the next `limit` events of `types` in (after, until]."""
        tags, slot = self._tags, self._slot
        return [(p, tags[slot(p)]) for p in islice(self._item_positions(QueryItem(tuple(types)), after, until), limit)]

    def with_any_tag(
        self, tags: Sequence[str], types: Sequence[str], after: int, until: int
    ) -> Iterator[tuple[int, str, int]]:
        """(position, tags, batch) of the events of `types` in (after, until] carrying at least
        one of `tags`, each once, in position order (the candidates of a partition's fetch)."""
        type_ids = {self._type_ids[t] for t in types if t in self._type_ids}
        for p in self._tags_positions(tags, after, until):
            i = self._slot(p)
            if self._type_of[i] in type_ids:
                yield p, self._tags[i], self._batches[i]
