"""One segment of a partition log: `<base_offset:020d>.log` plus its offset, time and trace indexes.

The .log file is record batches back to back, exactly as produced (base offset patched), nothing
else. The segment tracks its own `size` (bytes of complete, accepted batches) and `next_offset`;
the file may be longer only after a crash, and recovery truncates it back.

A segment owns no file descriptor: it asks the shared FileCache for one by path on each use, so
thousands of segments can exist with a bounded number of open files.

Batch headers are walked with `HEADER.unpack_from` on data whose layout was validated (at append,
by a recovery scan, or by the CRC check of an earlier read); see scan.py for the full validation.

Corruption (damage below the end of the file, found by recovery or by a read):
  - recovery (`scan`) truncates only a torn tail; a damaged batch followed by valid ones is kept
    on disk, recorded in `damaged` and never served;
  - bytes not yet known good (`verified_from`..`verified_bytes` is the one range known good:
    appended by this process, scanned, or already checked by a read) are CRC-checked by `read()`
    before they are returned, once: a read that meets the range grows it; a bad batch raises
    `SegmentCorruptError` (the caller then runs `find_damage()` to locate it exactly);
  - an offset index entry that does not point at a batch with its offset makes `locate()`
    rebuild the index from the file (`IndexRebuilt` is logged).
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import structlog

from dmq.broker.log import writeback
from dmq.broker.log.errors import LogError
from dmq.broker.log.handles import FileCache
from dmq.broker.log.index import OffsetIndex, TimeIndex
from dmq.broker.log.scan import Batch, Damaged, Tail, scan_batches
from dmq.broker.log.trace_index import TRACE_SUFFIX, TraceIndex
from dmq.proto.records import (
    ATTR_HAS_TRACE_IDS,
    CRC_START,
    DEFAULT_MAX_BATCH_BYTES,
    HEADER,
    HEADER_SIZE,
    BatchHeader,
    RecordsError,
    crc32,
    decode,
    read_header,
    trace_ids,
)

__all__ = ["Segment", "ScanResult", "SegmentCorruptError", "LOG_SUFFIX", "segment_name"]

log = structlog.get_logger(__name__)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIMEINDEX_SUFFIX = ".timeindex"

# Header walks read this much at a time: enough for the batches between two index entries at the
# default interval, small enough that walking past one huge batch costs little.
WALK_CHUNK_BYTES = 64 * 1024
# Relative offsets are stored as uint32; a segment must roll before its offsets outgrow them.
MAX_RELATIVE_OFFSET = 2**32 - 1


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


def _write_all(fd: int, parts: list[memoryview] | memoryview) -> int:
    """Write every byte (handles short writes); returns the byte count."""
    if isinstance(parts, memoryview):
        parts = [parts]
    total = sum(len(p) for p in parts)
    n = os.writev(fd, parts) if len(parts) > 1 else os.write(fd, parts[0])
    if n == total:
        return total
    # Short write (disk nearly full, signal): finish the rest piecewise.
    written = n
    for p in parts:
        if n >= len(p):
            n -= len(p)
            continue
        view = p[n:]
        n = 0
        while view:
            k = os.write(fd, view)
            if k <= 0:
                raise OSError(f"write returned {k}")
            view = view[k:]
            written += k
    return written


class _IndexMismatch(Exception):
    """An offset index entry does not point at the batch it names."""


class SegmentCorruptError(LogError):
    """Bytes of a segment below its end failed validation (the partition log turns this into a
    CorruptLogError naming the topic, partition and offset)."""

    def __init__(
        self, message: str, *, segment: str, position: int, offset: int | None = None,
        expected_offset: int | None = None,
    ) -> None:
        super().__init__(message)
        self.segment = segment
        self.position = position
        self.offset = offset  # the offset being read
        self.expected_offset = expected_offset  # the offset a batch at `position` should start with


@dataclass(slots=True)
class ScanResult:
    valid_bytes: int
    next_offset: int
    batches: int
    truncated_bytes: int
    reason: str | None  # why the tail was cut, None if the segment was intact
    damaged: list[Damaged] = field(default_factory=list)  # kept, never served


@dataclass(slots=True)
class VerifyResult:
    """What `Segment.verify()` found (read-only)."""

    batches: int = 0
    damaged: list[Damaged] = field(default_factory=list)
    tail: Tail | None = None  # bytes below the segment's size that are no batch at all
    next_offset: int = 0  # the offset after the last valid batch (where a `tail` starts)
    index_problems: list[str] = field(default_factory=list)


class Segment:
    __slots__ = (
        "base_offset",
        "log_path",
        "index",
        "time_index",
        "trace_index",
        "size",
        "next_offset",
        "indexes_loaded",
        "index_interval_bytes",
        "_cache",
        "_bytes_since_index",
        "verified_from",
        "verified_bytes",
        "damaged",
        "tail_dirty",
        "_located_expected",
        "writeback_bytes",
        "_writeback_from",
    )

    def __init__(
        self, directory: str, base_offset: int, cache: FileCache, index_interval_bytes: int, *, size: int = 0,
        fresh: bool = False,
    ) -> None:
        name = os.path.join(directory, segment_name(base_offset))
        self.base_offset = base_offset
        self.log_path = name + LOG_SUFFIX
        self.index = OffsetIndex(name + INDEX_SUFFIX, cache)
        self.time_index = TimeIndex(name + TIMEINDEX_SUFFIX, cache)
        self.trace_index = TraceIndex(name + TRACE_SUFFIX, cache, fresh=fresh)
        self.size = size
        self.next_offset = base_offset  # only exact for the active segment and after a scan
        self.indexes_loaded = size == 0
        self.index_interval_bytes = index_interval_bytes
        self._cache = cache
        self._bytes_since_index = 0
        # The range [verified_from, verified_bytes) of the file known to hold valid batches
        # (written by this process, scanned, or checked by a read that met the range); bytes
        # outside it are CRC-checked when read. One range, not a set: a consumer reading on from
        # a commit after a restart meets the range of what was appended since and joins it.
        self.verified_from = 0
        self.verified_bytes = 0
        self.damaged: dict[int, Damaged] = {}  # by position: known damage, never served
        # An append failed and cutting its partial bytes off failed too: cut before the next one.
        self.tail_dirty = False
        self._located_expected = base_offset  # set by locate(): the base offset at its answer
        # Write-back pacing (writeback.py): bytes from _writeback_from on were appended but their
        # write-back not started yet; started once writeback_bytes have piled up (0: never).
        self.writeback_bytes = writeback.WRITEBACK_BYTES
        self._writeback_from = size

    def __repr__(self) -> str:
        return (
            f"Segment(base_offset={self.base_offset}, size={self.size}, next_offset={self.next_offset}, "
            f"index_entries={len(self.index)}, time_entries={len(self.time_index)}"
            f"{f', damaged={len(self.damaged)}' if self.damaged else ''})"
        )

    # -- lifecycle -----------------------------------------------------------------------------

    @classmethod
    def create(cls, directory: str, base_offset: int, cache: FileCache, index_interval_bytes: int) -> Segment:
        seg = cls(directory, base_offset, cache, index_interval_bytes, fresh=True)
        cache.create(seg.log_path)
        try:  # a trace index left by a segment a rollback removed would be appended to
            os.unlink(seg.trace_index.path)
        except FileNotFoundError:
            pass
        return seg

    def fd(self) -> int:
        return self._cache.fd(self.log_path)

    def file_size(self) -> int:
        return os.fstat(self.fd()).st_size

    def close(self) -> None:
        self._cache.close(self.log_path)
        self._cache.close(self.time_index.path)
        self._cache.close(self.index.path)
        self._cache.close(self.trace_index.path)

    def delete_files(self) -> None:
        self.close()
        for path in (self.log_path, self.index.path, self.time_index.path, self.trace_index.path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def write_indexes(self) -> None:
        """Append index entries not yet in the files (no fsync); mark the trace index complete."""
        self.index.write_pending()
        self.time_index.write_pending()
        self.trace_index.mark(self.next_offset - self.base_offset)

    # -- trace index ---------------------------------------------------------------------------

    def trace_ready(self) -> TraceIndex:
        """The trace index, checked and complete up to the segment's end (see trace_index.py)."""
        self.trace_index.ensure_loaded(self.next_offset - self.base_offset, self._traced_records)
        return self.trace_index

    def _traced_records(self, from_rel: int) -> Iterator[tuple[str, int]]:
        """(trace id, relative offset) of the records from from_rel on: batch headers walked, only
        the batches flagged with trace ids read and decoded."""
        fd = self._cache.fd(self.log_path)
        for pos, h in self.iter_headers(self.base_offset + from_rel):
            if not h[4] & ATTR_HAS_TRACE_IDS:
                continue
            try:
                ids = trace_ids(decode(os.pread(fd, 12 + h[1], pos)))
            except RecordsError as e:  # damage: the read path reports it; nothing to index
                log.warning("trace index: batch not indexed", segment=self.log_path, position=pos, error=str(e))
                continue
            for i, t in enumerate(ids):
                if t is not None:
                    yield t, h[0] + i - self.base_offset

    def ensure_indexes(self) -> None:
        """Load the index files of a segment opened without them; rebuild them if implausible."""
        if self.indexes_loaded:
            return
        index_ok = self.index.load(self.size)
        rel_end = self.next_offset - self.base_offset if self.next_offset > self.base_offset else None
        time_ok = self.time_index.load(rel_end) and (len(self.time_index) > 0 or self.size == 0)
        if index_ok is False or not time_ok:
            log.warning(
                "rebuilding damaged index files",
                segment=self.log_path,
                offset_index_ok=index_ok,
                time_index_ok=time_ok,
            )
        if not (index_ok and time_ok):
            self._rebuild_indexes(rebuild_times=not time_ok)
        self.indexes_loaded = True

    def _events(
        self, end: int | None = None, max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES, fd: int | None = None,
        *, start_position: int = 0, start_offset: int | None = None,
    ) -> Iterator[object]:
        if fd is None:
            fd = self._cache.fd(self.log_path)
        size = self.size if end is None else end
        return scan_batches(
            lambda n, pos: os.pread(fd, n, pos),
            size,
            self.base_offset,
            max_batch_bytes=max_batch_bytes,
            max_relative_offset=MAX_RELATIVE_OFFSET,
            start_position=start_position,
            start_offset=start_offset,
        )

    def _rebuild_indexes(self, *, rebuild_times: bool) -> None:
        """From the file, validating every batch (scan.py), so damage cannot misplace an entry.
        Append times are not in the batches: a lost time index is approximated by the batches'
        max_timestamp, kept monotonic."""
        self.index.clear()
        if rebuild_times:
            self.time_index.clear()
        since = 0
        current = 0
        nxt = self.base_offset
        for ev in self._events():
            if isinstance(ev, Damaged):
                self.damaged[ev.position] = ev
                since = self.index_interval_bytes  # index the batch after the damage
                nxt = ev.last_offset + 1
                continue
            if isinstance(ev, Tail):
                self.damaged[ev.position] = Damaged(ev.position, self.size, nxt, self.next_offset - 1, ev.reason)
                break
            assert isinstance(ev, Batch)
            pos, h = ev.position, ev.header
            nxt = h.last_offset + 1
            rel = h.base_offset - self.base_offset
            if since >= self.index_interval_bytes and pos > 0:
                self.index.append(rel, pos)
                since = 0
            since += h.total_size
            if rebuild_times:
                current = max(current, h.max_timestamp)
                self.time_index.maybe_append(current, rel)
        self.index.rewrite()
        if rebuild_times:
            self.time_index.rewrite()

    # -- append --------------------------------------------------------------------------------

    def append(
        self,
        parts: list[memoryview],
        nbytes: int,
        base_offset: int,
        last_offset: int,
        append_time_ms: int,
    ) -> None:
        fd = self._cache.fd(self.log_path)
        if self.tail_dirty:
            os.ftruncate(fd, self.size)  # raises again while the cause lasts: nothing is written
            self.tail_dirty = False
        try:
            _write_all(fd, parts)
        except BaseException:
            # Leave no partial batch behind: later appends (O_APPEND) would land after it.
            try:
                os.ftruncate(fd, self.size)
            except OSError:
                self.tail_dirty = True
            raise
        rel = base_offset - self.base_offset
        if self._bytes_since_index >= self.index_interval_bytes and self.size > 0:
            self.index.append(rel, self.size)
            self._bytes_since_index = 0
        if self.time_index.maybe_append(append_time_ms, rel):
            try:
                self.time_index.write_last(self._cache.fd(self.time_index.path, create=True))
            except OSError as e:  # the entry stays pending; flush/close retry it
                log.warning("time index write failed", segment=self.log_path, error=str(e))
        if self.verified_from == self.verified_bytes:  # nothing known yet: the range starts here
            self.verified_from = self.verified_bytes = self.size
        if self.verified_bytes == self.size:
            self.verified_bytes += nbytes  # validated by the caller (header, CRC) before the write
        self.size += nbytes
        self._bytes_since_index += nbytes
        self.next_offset = last_offset + 1
        if self.writeback_bytes and self.size - self._writeback_from >= self.writeback_bytes:
            self._start_writeback(fd)

    def _start_writeback(self, fd: int) -> None:
        """Start the write-back of what was appended since the last start (never past the end)."""
        start, self._writeback_from = self._writeback_from, self.size
        try:
            writeback.start(fd, start, self.size - start)
        except OSError as e:  # advice only: the data stays dirty and the next fsync writes it
            log.debug("write-back start failed", segment=self.log_path, error=str(e))

    def truncate_to(self, position: int, next_offset: int) -> None:
        """Drop everything from `position` (a batch boundary, holding `next_offset`) on: the
        in-memory state first, then the files (an OSError leaves `tail_dirty` for the next append)."""
        self.size = position
        self.next_offset = next_offset
        self.verified_bytes = min(self.verified_bytes, position)
        self.verified_from = min(self.verified_from, self.verified_bytes)
        self._writeback_from = min(self._writeback_from, position)
        for p in [p for p in self.damaged if p >= position]:
            del self.damaged[p]
        rel = next_offset - self.base_offset
        keep = bisect_left(self.index.positions, position)
        del self.index.rel_offsets[keep:]
        del self.index.positions[keep:]
        keep_t = bisect_left(self.time_index.rel_offsets, rel)
        del self.time_index.times[keep_t:]
        del self.time_index.rel_offsets[keep_t:]
        self._bytes_since_index = position - self.index.last_position()
        self.tail_dirty = True
        os.ftruncate(self._cache.fd(self.log_path), position)
        self.tail_dirty = False
        if self.index.persisted > len(self.index):
            self.index.rewrite()
        if self.time_index.persisted > len(self.time_index):
            os.ftruncate(self._cache.fd(self.time_index.path, create=True), len(self.time_index) * 12)
            self.time_index.persisted = len(self.time_index)
        self.trace_index.truncate(rel)

    def set_active_state(self, next_offset: int) -> None:
        """After a clean open: where appends continue."""
        self.next_offset = next_offset
        self._bytes_since_index = self.size - self.index.last_position()

    # -- reads ---------------------------------------------------------------------------------

    def walk(
        self, start: int, end: int, chunk_bytes: int = WALK_CHUNK_BYTES
    ) -> Iterator[tuple[int, tuple[int, ...]]]:
        """Yield (position, raw header tuple) of the batches in [start, end), reading chunk_bytes
        at a time (a header beyond the chunk costs one more small read). Stops before known
        damage; an impossible header raises SegmentCorruptError."""
        pos = start
        buf = b""
        buf_start = start
        damaged = self.damaged
        while pos < end:
            if damaged and pos in damaged:
                return
            if pos + HEADER_SIZE > buf_start + len(buf):
                buf = os.pread(self._cache.fd(self.log_path), max(min(chunk_bytes, end - pos), HEADER_SIZE), pos)
                buf_start = pos
                if len(buf) < HEADER_SIZE:
                    raise SegmentCorruptError(
                        f"{self.log_path}: header at position {pos} beyond the end of the file",
                        segment=self.log_path, position=pos,
                    )
            h = HEADER.unpack_from(buf, pos - buf_start)
            if h[1] < HEADER_SIZE - 12 or pos + 12 + h[1] > self.size:
                raise SegmentCorruptError(
                    f"{self.log_path}: impossible batch_length {h[1]} at position {pos}",
                    segment=self.log_path, position=pos,
                )
            yield pos, h
            pos += 12 + h[1]

    def _damage_at(self, offset: int) -> Damaged | None:
        for d in self.damaged.values():
            if d.first_offset <= offset <= d.last_offset:
                return d
        return None

    def locate(self, offset: int) -> int:
        """Position of the batch containing `offset` (which must be in this segment). An index
        entry that does not point at a batch with its offset is detected here (the first header
        walked from it) and the index is rebuilt from the log."""
        self.ensure_indexes()
        for attempt in (0, 1):
            rel, pos = self.index.floor(offset - self.base_offset)
            first = True
            expected = self.base_offset + rel  # the base offset of the batch at `pos`
            try:
                for p, h in self.walk(pos, self.size, self.index_interval_bytes + HEADER_SIZE):
                    if first and pos and h[0] != self.base_offset + rel:
                        raise _IndexMismatch
                    first = False
                    if h[0] + h[5] - 1 >= offset:
                        self._located_expected = expected
                        return p
                    expected = h[0] + h[5]
            except SegmentCorruptError as e:
                if e.expected_offset is None:
                    e.expected_offset = expected
                if first and pos and not attempt:
                    pass  # maybe the index: rebuilt below
                else:
                    raise
            except _IndexMismatch:
                if attempt:  # still wrong after a rebuild: the bytes are damaged
                    raise SegmentCorruptError(
                        f"{self.log_path}: no valid batch at indexed position {pos}",
                        segment=self.log_path, position=pos, offset=offset,
                    ) from None
            else:
                if not (first and pos):
                    break
            log.warning(
                "offset index inconsistent with the log; rebuilding it",
                segment=self.log_path, entry_offset=self.base_offset + rel, entry_position=pos,
            )
            self._rebuild_indexes(rebuild_times=False)
        d = self._damage_at(offset)
        if d is None and self.damaged:  # the walk ended at damage whose offsets are unknown
            after = [x for x in self.damaged.values() if x.position >= pos]
            d = min(after, key=lambda x: x.position) if after else None
        if d is not None:
            raise SegmentCorruptError(
                f"{self.log_path}: offset {offset} is in damaged bytes at position {d.position}: {d.reason}",
                segment=self.log_path, position=d.position, offset=offset, expected_offset=d.first_offset,
            )
        raise LogError(f"{self.log_path}: offset {offset} not found (segment ends at {self.next_offset})")

    def read(self, offset: int, max_bytes: int, end_position: int | None = None) -> bytes:
        """Whole batches from the one holding `offset`, up to max_bytes (at least one batch),
        not beyond end_position (a batch boundary) nor into known damage. Bytes not yet known
        good are CRC-checked; a bad first batch raises SegmentCorruptError, a later one ends
        the answer before it."""
        try:
            return self._read(offset, max_bytes, end_position)
        except _IndexMismatch:
            log.warning("offset index inconsistent with the log; rebuilding it", segment=self.log_path)
            self._rebuild_indexes(rebuild_times=False)
        try:
            return self._read(offset, max_bytes, end_position)
        except _IndexMismatch:
            raise SegmentCorruptError(
                f"{self.log_path}: no valid batch at an indexed position after a rebuild",
                segment=self.log_path, position=-1, offset=offset,
            ) from None

    def _read(self, offset: int, max_bytes: int, end_position: int | None) -> bytes:
        limit = self.size if end_position is None else end_position
        start = self.locate(offset)
        located_expected = self._located_expected
        if start >= limit:
            return b""
        want = min(start + max_bytes, limit)
        # The indexed boundary nearest below `want` bounds the header walk to ~one index interval.
        rel, end = self.index.floor_by_position(want)
        check = end > start  # a position from the index: its first header must carry its offset
        if not check:
            end = start
        if self.damaged and end > start and any(start < p < end for p in self.damaged):
            end, check = start, False  # walk from the start so the walk stops at the damage
        walked_any = False
        try:
            for p, h in self.walk(end, limit, want - end + HEADER_SIZE):
                if check:
                    if h[0] != self.base_offset + rel:
                        raise _IndexMismatch
                    check = False
                e = p + 12 + h[1]
                if e > want:
                    if end == start and not walked_any:  # the first batch alone exceeds max_bytes
                        end = e
                    break
                end = e
                walked_any = True
        except SegmentCorruptError:
            if check:
                raise _IndexMismatch from None
            raise
        if end <= start:
            if start in self.damaged:
                d = self.damaged[start]
                raise SegmentCorruptError(
                    f"{self.log_path}: damaged bytes at position {start}: {d.reason}",
                    segment=self.log_path, position=start, offset=offset,
                )
            return b""
        data = os.pread(self._cache.fd(self.log_path), end - start, start)
        if len(data) != end - start:
            raise LogError(f"{self.log_path}: short read at {start} ({len(data)} of {end - start} bytes)")
        if start < self.verified_from or end > self.verified_bytes:
            data = self._checked(data, start, offset, located_expected)
        return data

    def _checked(self, data: bytes, start: int, offset: int, expected: int) -> bytes:
        """Check the batches of `data` (read at `start`, where a batch with base offset
        `expected` starts): each continues the offsets of the one before, and its CRC matches
        unless it lies in the range already known good."""
        if self.verified_from == self.verified_bytes:  # nothing known yet: the range starts here
            self.verified_from = self.verified_bytes = start
        view = memoryview(data)
        p = 0
        while p < len(data):
            h = None
            why = ""
            if p + HEADER_SIZE > len(data):
                why = "batch header cut short"
            else:
                try:
                    h = read_header(view, p, max_batch_bytes=2**31 - 1)
                except RecordsError as e:
                    why = f"bad header: {e}"
                else:
                    if p + h.total_size > len(data):
                        why, h = "batch longer than the bytes read", None
                    elif h.base_offset != expected:
                        # the CRC skips the base offset (patched in place on append), so a
                        # damaged one is caught only by continuity with the batch before it
                        why, h = f"base offset {h.base_offset} where {expected} was expected", None
                    elif not (self.verified_from <= start + p < self.verified_bytes) and (
                        crc32(view[p + CRC_START : p + h.total_size]) != h.crc
                    ):
                        why, h = "crc mismatch", None
            if h is None:
                if p:
                    return data[:p]  # hand over the good batches; the next read meets the damage
                raise SegmentCorruptError(
                    f"{self.log_path}: batch at position {start + p} is corrupt ({why})",
                    segment=self.log_path, position=start + p, offset=offset, expected_offset=expected,
                )
            p += h.total_size
            expected = h.last_offset + 1
            # [start, start + p) is now known good; joined to the range where the two meet
            if start <= self.verified_bytes and start + p >= self.verified_from:
                self.verified_from = min(self.verified_from, start)
                self.verified_bytes = max(self.verified_bytes, start + p)
        return data

    def find_damage(
        self, position: int, expected_offset: int | None, max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    ) -> list[Damaged]:
        """Scan from `position` (where a batch with base offset expected_offset should start)
        just far enough to find where valid batches resume, and remember that damaged range, so
        reads stop before it and offsets after it stay readable. Without expected_offset the
        whole segment is scanned. Returns the damage found ([] if the bytes there are fine)."""
        found: list[Damaged] = []
        if expected_offset is None:
            result = self.verify(max_batch_bytes)
            found = list(result.damaged)
            if result.tail is not None:
                found.append(Damaged(result.tail.position, self.size, result.next_offset, self.next_offset - 1,
                                     result.tail.reason))
        else:
            events = self._events(max_batch_bytes=max_batch_bytes, start_position=position,
                                  start_offset=expected_offset)
            for ev in events:
                if isinstance(ev, Batch):
                    break  # valid batches resume (or there was no damage at all)
                if isinstance(ev, Damaged):
                    found.append(ev)
                    continue
                assert isinstance(ev, Tail)
                first = found[-1].last_offset + 1 if found else expected_offset
                found.append(Damaged(ev.position, self.size, first, self.next_offset - 1, ev.reason))
                break
        for d in found:
            self.damaged[d.position] = d
            # an index entry right after the damage lets lookups of later offsets skip it
            if d.end < self.size and d.last_offset >= d.first_offset - 1:
                self.index.insert(d.last_offset + 1 - self.base_offset, d.end)
        return found

    def verify(
        self,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        *,
        size: int | None = None,
        index: tuple[list[int], list[int]] | None = None,
        times: tuple[list[int], list[int]] | None = None,
    ) -> VerifyResult:
        """Check every batch below `size` (header, CRC, contiguous offsets) and, when given the
        index entries (relative offsets, positions) and time entries (times, relative offsets),
        that every offset index entry points at a batch starting with its offset and that the
        time index is increasing. Read-only, through a private descriptor: safe without the
        partition lock (bytes below a snapshot of `size` never change; a deleted file stays
        readable through it)."""
        out = VerifyResult(next_offset=self.base_offset)
        boundaries: dict[int, int] = {}
        with self._cache.reserve():
            fd = os.open(self.log_path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            try:
                for ev in self._events(self.size if size is None else size, max_batch_bytes, fd):
                    if isinstance(ev, Batch):
                        out.batches += 1
                        boundaries[ev.position] = ev.header.base_offset
                        out.next_offset = ev.header.last_offset + 1
                    elif isinstance(ev, Damaged):
                        out.damaged.append(ev)
                        out.next_offset = ev.last_offset + 1
                    else:
                        assert isinstance(ev, Tail)
                        out.tail = ev
            finally:
                os.close(fd)
        if index is not None:
            for rel, pos in zip(*index):
                if boundaries.get(pos) != self.base_offset + rel:
                    out.index_problems.append(
                        f"offset index entry (offset {self.base_offset + rel}, position {pos}) does not "
                        "point at that batch"
                    )
                    break
        if times is not None:
            ts, rels = times
            if any(b <= a for a, b in zip(ts, ts[1:])) or any(b <= a for a, b in zip(rels, rels[1:])):
                out.index_problems.append("time index is not increasing")
        return out

    def position_of(self, offset: int) -> int:
        """Byte position where the batch starting at `offset` begins (size if offset == next_offset)."""
        if offset >= self.next_offset:
            return self.size
        return self.locate(offset)

    def offset_for_time(self, timestamp_ms: int) -> int | None:
        self.ensure_indexes()
        rel = self.time_index.first_at_or_after(timestamp_ms)
        return None if rel is None else self.base_offset + rel

    @property
    def largest_time_ms(self) -> int | None:
        self.ensure_indexes()
        return self.time_index.last_time_ms

    @property
    def first_time_ms(self) -> int | None:
        self.ensure_indexes()
        return self.time_index.first_time_ms

    def iter_headers(self, from_offset: int) -> Iterator[tuple[int, tuple[int, ...]]]:
        """Raw headers of the batches whose last offset >= from_offset (stopping at damage)."""
        start = self.locate(from_offset) if from_offset > self.base_offset else 0
        for p, h in self.walk(start, self.size):
            if h[0] + h[5] - 1 >= from_offset:
                yield p, h

    # -- recovery ------------------------------------------------------------------------------

    def scan(
        self,
        *,
        max_batch_bytes: int,
        min_time_ms: int,
        now_ms: int,
        on_batch: Callable[[BatchHeader, int], None] | None = None,
    ) -> ScanResult:
        """Validate every batch (header, CRC, contiguous offsets, see scan.py), rebuild both
        indexes, keep damaged batches that valid ones follow (recorded in `damaged`, never
        served), and truncate the file after the last valid batch when only a torn tail follows
        it; on_batch(header, append_time_ms) sees each valid batch."""
        fd = self._cache.fd(self.log_path)
        st = os.fstat(fd)
        file_size = st.st_size
        mtime_ms = min(st.st_mtime_ns // 1_000_000, now_ms)
        # Keep the persisted append times; they are checked against the recovered end below.
        self.time_index.load()
        times, time_rels = self.time_index.times, self.time_index.rel_offsets
        ti = 0  # next persisted time entry
        current_time = min_time_ms
        new_index = OffsetIndex(self.index.path, self._cache)
        new_time = TimeIndex(self.time_index.path, self._cache)
        self.damaged = {}

        valid = 0
        expected = self.base_offset
        batches = 0
        since_index = 0
        reason: str | None = None
        damaged: list[Damaged] = []
        for ev in self._events(file_size, max_batch_bytes):
            if isinstance(ev, Tail):
                reason = ev.reason
                break
            if isinstance(ev, Damaged):
                damaged.append(ev)
                self.damaged[ev.position] = ev
                since_index = self.index_interval_bytes  # index the batch after the damage
                valid = ev.end
                expected = ev.last_offset + 1
                continue
            assert isinstance(ev, Batch)
            pos, h = ev.position, ev.header
            rel = h.base_offset - self.base_offset
            # Append time: from the persisted time index. Batches after its last entry keep that
            # entry's time (exact after a process crash; after a power loss it errs early, so a
            # consumer starting by time sees more, never less). Only a segment with no entry at
            # all falls back to the batches' max_timestamp, bounded by the file's mtime.
            while ti < len(times) and time_rels[ti] <= rel:
                current_time = max(current_time, times[ti])
                ti += 1
            if not times:
                current_time = max(current_time, min(h.max_timestamp, mtime_ms))
            new_time.maybe_append(current_time, rel)
            if since_index >= self.index_interval_bytes and pos > 0:
                new_index.append(rel, pos)
                since_index = 0
            since_index += h.total_size
            if on_batch is not None:
                on_batch(h, current_time)
            expected = h.last_offset + 1
            batches += 1
            valid = pos + h.total_size
        truncated = file_size - valid
        if truncated:
            os.ftruncate(fd, valid)
        self.size = valid
        self.verified_from = 0
        self.verified_bytes = valid
        self._writeback_from = valid
        self.next_offset = expected
        self._bytes_since_index = since_index
        self.index = new_index
        self.time_index = new_time
        self.index.rewrite()
        self.time_index.rewrite()
        # Entries (and coverage marks) beyond the recovered end describe records that are gone:
        # offsets appended next would otherwise count as indexed (trace_index.py).
        self.trace_index.truncate(expected - self.base_offset)
        self.indexes_loaded = True
        return ScanResult(valid, expected, batches, truncated, reason if truncated else None, damaged)
