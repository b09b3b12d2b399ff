"""One segment of a partition log: `<base_offset:020d>.log` plus its offset and time indexes.

The .log file is record batches back to back, exactly as produced (base offset patched), nothing
else. The segment tracks its own `size` (bytes of complete, accepted batches) and `next_offset`;
the file may be longer only after a crash, and recovery truncates it back.

A segment owns no file descriptor: it asks the shared FileCache for one by path on each use, so
thousands of segments can exist with a bounded number of open files.

Batch headers are walked with `HEADER.unpack_from` on trusted (already validated) data, and with
`read_header` + a CRC-32 (records.crc32: ISA-L) over memoryview
slices of large reads during recovery.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import structlog

from dmq.broker.log.errors import LogError
from dmq.broker.log.handles import FileCache
from dmq.broker.log.index import OffsetIndex, TimeIndex
from dmq.proto.records import HEADER, HEADER_SIZE, BatchHeader, RecordsError, crc32, read_header

__all__ = ["Segment", "ScanResult", "LOG_SUFFIX", "segment_name"]

log = structlog.get_logger(__name__)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIMEINDEX_SUFFIX = ".timeindex"
CRC_START = 17  # the CRC covers [17, end of batch)

# Header walks read this much at a time: enough for the batches between two index entries at the
# default interval, small enough that walking past one huge batch costs little.
WALK_CHUNK_BYTES = 64 * 1024
# Recovery reads segments in large chunks so the per-syscall cost vanishes next to the CRC.
SCAN_CHUNK_BYTES = 8 * 1024 * 1024
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


@dataclass(slots=True)
class ScanResult:
    valid_bytes: int
    next_offset: int
    batches: int
    truncated_bytes: int
    reason: str | None  # why the tail was cut, None if the segment was intact


class Segment:
    __slots__ = (
        "base_offset",
        "log_path",
        "index",
        "time_index",
        "size",
        "next_offset",
        "indexes_loaded",
        "index_interval_bytes",
        "_cache",
        "_bytes_since_index",
    )

    def __init__(
        self, directory: str, base_offset: int, cache: FileCache, index_interval_bytes: int, *, size: int = 0
    ) -> None:
        name = os.path.join(directory, segment_name(base_offset))
        self.base_offset = base_offset
        self.log_path = name + LOG_SUFFIX
        self.index = OffsetIndex(name + INDEX_SUFFIX, cache)
        self.time_index = TimeIndex(name + TIMEINDEX_SUFFIX, cache)
        self.size = size
        self.next_offset = base_offset  # only exact for the active segment and after a scan
        self.indexes_loaded = size == 0
        self.index_interval_bytes = index_interval_bytes
        self._cache = cache
        self._bytes_since_index = 0

    def __repr__(self) -> str:
        return (
            f"Segment(base_offset={self.base_offset}, size={self.size}, next_offset={self.next_offset}, "
            f"index_entries={len(self.index)}, time_entries={len(self.time_index)})"
        )

    # -- lifecycle -----------------------------------------------------------------------------

    @classmethod
    def create(cls, directory: str, base_offset: int, cache: FileCache, index_interval_bytes: int) -> Segment:
        seg = cls(directory, base_offset, cache, index_interval_bytes)
        cache.create(seg.log_path)
        return seg

    def fd(self) -> int:
        return self._cache.fd(self.log_path)

    def file_size(self) -> int:
        return os.fstat(self.fd()).st_size

    def close(self) -> None:
        self._cache.close(self.log_path)
        self._cache.close(self.time_index.path)

    def delete_files(self) -> None:
        self.close()
        for path in (self.log_path, self.index.path, self.time_index.path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def write_indexes(self) -> None:
        """Append index entries not yet in the files (no fsync)."""
        self.index.write_pending()
        self.time_index.write_pending()

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

    def _rebuild_indexes(self, *, rebuild_times: bool) -> None:
        """From the batch headers. Append times are not in the batches: a lost time index is
        approximated by the batches' max_timestamp, kept monotonic."""
        self.index.clear()
        if rebuild_times:
            self.time_index.clear()
        since = 0
        current = 0
        for pos, h in self.walk(0, self.size):
            rel = h[0] - self.base_offset
            if since >= self.index_interval_bytes and pos > 0:
                self.index.append(rel, pos)
                since = 0
            since += 12 + h[1]
            if rebuild_times:
                current = max(current, h[7])
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
        try:
            _write_all(fd, parts)
        except BaseException:
            # Leave no partial batch behind: later appends (O_APPEND) would land after it.
            try:
                os.ftruncate(fd, self.size)
            except OSError:
                pass
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
        self.size += nbytes
        self._bytes_since_index += nbytes
        self.next_offset = last_offset + 1

    def set_active_state(self, next_offset: int) -> None:
        """After a clean open: where appends continue."""
        self.next_offset = next_offset
        self._bytes_since_index = self.size - self.index.last_position()

    # -- reads ---------------------------------------------------------------------------------

    def walk(
        self, start: int, end: int, chunk_bytes: int = WALK_CHUNK_BYTES
    ) -> Iterator[tuple[int, tuple]]:  # type: ignore[type-arg]
        """Yield (position, raw header tuple) of the batches in [start, end), trusted data only,
        reading chunk_bytes at a time (a header beyond the chunk costs one more small read)."""
        pos = start
        buf = b""
        buf_start = start
        while pos < end:
            if pos + HEADER_SIZE > buf_start + len(buf):
                buf = os.pread(self._cache.fd(self.log_path), max(min(chunk_bytes, end - pos), HEADER_SIZE), pos)
                buf_start = pos
                if len(buf) < HEADER_SIZE:
                    raise LogError(f"{self.log_path}: header at position {pos} beyond the end of the file")
            h = HEADER.unpack_from(buf, pos - buf_start)
            if h[1] < HEADER_SIZE - 12:
                raise LogError(f"{self.log_path}: impossible batch_length {h[1]} at position {pos}")
            yield pos, h
            pos += 12 + h[1]

    def locate(self, offset: int) -> int:
        """Position of the batch containing `offset` (which must be in this segment)."""
        _, pos = self.index.floor(offset - self.base_offset)
        # the batch holding `offset` starts within ~one index interval of the indexed position
        for p, h in self.walk(pos, self.size, self.index_interval_bytes + HEADER_SIZE):
            if h[0] + h[5] - 1 >= offset:
                return p
        raise LogError(f"{self.log_path}: offset {offset} not found (segment ends at {self.next_offset})")

    def read(self, offset: int, max_bytes: int, end_position: int | None = None) -> bytes:
        """Whole batches from the one holding `offset`, up to max_bytes (at least one batch),
        not beyond end_position (a batch boundary)."""
        limit = self.size if end_position is None else end_position
        start = self.locate(offset)
        if start >= limit:
            return b""
        want = min(start + max_bytes, limit)
        # The indexed boundary nearest below `want` bounds the header walk to ~one index interval.
        end = max(self.index.floor_position(want), start)
        for p, h in self.walk(end, limit, want - end + HEADER_SIZE):
            e = p + 12 + h[1]
            if e > want:
                if end == start:  # the first batch alone exceeds max_bytes: return it anyway
                    end = e
                break
            end = e
        data = os.pread(self._cache.fd(self.log_path), end - start, start)
        if len(data) != end - start:
            raise LogError(f"{self.log_path}: short read at {start} ({len(data)} of {end - start} bytes)")
        return data

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

    def iter_headers(self, from_offset: int) -> Iterator[tuple[int, tuple]]:  # type: ignore[type-arg]
        """Raw headers of the batches whose last offset >= from_offset."""
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
        """Validate every batch (header, CRC, contiguous offsets), rebuild both indexes and truncate
        the file after the last valid batch; on_batch(header, append_time_ms) sees each valid batch.
        """
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

        chunk = bytearray(SCAN_CHUNK_BYTES)
        view = memoryview(chunk)
        pos = 0  # file position of view[0]
        avail = 0
        off = 0
        expected = self.base_offset
        batches = 0
        since_index = 0
        reason: str | None = None
        while True:
            if pos + off >= file_size:
                break
            # Refill when the next header or batch is not fully in the buffer.
            need = HEADER_SIZE
            if avail - off >= HEADER_SIZE:
                try:
                    h = read_header(view[:avail], off, max_batch_bytes=max_batch_bytes)
                except RecordsError as e:
                    reason = f"bad header: {e}"
                    break
                need = h.total_size
            if avail - off < need:
                if pos + off + need > file_size:
                    reason = (
                        f"torn batch: {need} bytes needed at position {pos + off}, "
                        f"{file_size - pos - off} left in the file"
                    )
                    break
                pos += off
                off = 0
                if need > len(chunk):
                    chunk = bytearray(need)
                    view = memoryview(chunk)
                avail = os.preadv(fd, [view[: min(len(chunk), file_size - pos)]], pos)
                continue
            if crc32(view[off + CRC_START : off + h.total_size]) != h.crc:
                reason = f"crc mismatch in batch at position {pos + off}"
                break
            if h.base_offset != expected:
                reason = f"batch at position {pos + off} has base offset {h.base_offset}, expected {expected}"
                break
            if h.last_offset - self.base_offset > MAX_RELATIVE_OFFSET:
                reason = f"batch at position {pos + off} has offsets beyond the segment's range"
                break
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
            if since_index >= self.index_interval_bytes and pos + off > 0:
                new_index.append(rel, pos + off)
                since_index = 0
            since_index += h.total_size
            if on_batch is not None:
                on_batch(h, current_time)
            expected = h.last_offset + 1
            batches += 1
            off += h.total_size
        valid = pos + off
        truncated = file_size - valid
        if truncated:
            os.ftruncate(fd, valid)
        self.size = valid
        self.next_offset = expected
        self._bytes_since_index = since_index
        self.index = new_index
        self.time_index = new_time
        self.index.rewrite()
        self.time_index.rewrite()
        self.indexes_loaded = True
        return ScanResult(valid, expected, batches, truncated, reason if truncated else None)
