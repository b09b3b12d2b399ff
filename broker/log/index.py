"""Sparse offset index and time index of one segment.

Both are kept in memory as two parallel `array`s (looked up with `bisect`) and persisted as files of
fixed-size little-endian entries that are only ever appended to (or rewritten whole after a
rebuild). Entries are appended to the file lazily (on flush, roll and close): the offset index can
always be rebuilt from the segment's batch headers, so a lost tail only costs a scan at recovery.

Offset index `<base_offset:020d>.index`, 8-byte entries `<II`:
    relative_offset uint32   base offset of a batch minus the segment's base offset
    position        uint32   byte position of that batch in the .log file
  An entry is added for the first batch that starts after at least `index_interval_bytes` bytes
  have been appended since the previous entry, so there is an entry every ~interval bytes and the
  positions are batch boundaries. Lookups find the greatest entry <= the wanted offset, then walk
  batch headers from its position.

Time index `<base_offset:020d>.timeindex`, 12-byte entries `<qI`:
    append_time_ms  int64    broker append time of a batch (monotonic per partition)
    relative_offset uint32   base offset of the first batch appended with that time
  An entry is added whenever a batch's append time is greater than the previous entry's, so the
  index is exact: offset_for_time(ts) is the relative offset of the first entry with time >= ts,
  no scan needed. Append times are not stored in the batches (the CRC covers the timestamps and the
  broker does not rewrite them), so this file is the only record of them: the active segment's
  entries are written as they are added (at most one write per millisecond, so cheap) and survive
  a process crash; flushes fsync the file at most once a second (and at roll and close), so after
  a power loss the last ~second of append times is approximated by the last surviving entry.
"""

from __future__ import annotations

import os
import struct
import sys
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable

from dmq.broker.log.handles import FileCache, reserve

__all__ = ["OFFSET_ENTRY", "TIME_ENTRY", "OffsetIndex", "TimeIndex"]

OFFSET_ENTRY = struct.Struct("<II")
TIME_ENTRY = struct.Struct("<qI")

_OPEN_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)


def _write_file_tail(path: str, data: bytes, cache: FileCache | None, *, truncate: bool = False) -> None:
    """Append (or, with truncate, rewrite) through the FileCache's descriptor for the file: the
    same descriptor later fsyncs it, so making an index durable needs no new open (EMFILE)."""
    if cache is not None:
        fd = cache.fd(path, create=True)  # opened O_APPEND: writes land at the end
        if truncate:
            os.ftruncate(fd, 0)
        _write_all_to(fd, data)
        return
    flags = _OPEN_APPEND | (os.O_TRUNC if truncate else 0)
    fd = os.open(path, flags, 0o644)
    try:
        _write_all_to(fd, data)
    finally:
        os.close(fd)


def _write_all_to(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_file(path: str, cache: FileCache | None) -> bytes | None:
    with reserve(cache):
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None


def fsync_path(path: str, fsync_fn: Callable[[int], None], cache: FileCache | None) -> None:
    """fsync a file by path if it exists, through the FileCache's descriptor for it when there is
    a cache (the descriptor the writes went through, or one the cache keeps for next time), so
    that a process short of descriptors (EMFILE) can still make what it wrote durable."""
    if cache is not None:
        if not os.path.exists(path):  # stat needs no descriptor; an open would fail on EMFILE first
            return
        try:
            fd = cache.pin(path)
        except FileNotFoundError:
            return
        try:
            fsync_fn(fd)
        finally:
            cache.unpin(path, fd)
            if not path.endswith((".index", ".timeindex")):
                cache.close(path)  # snapshots are replaced by rename: never keep a stale inode
        return
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return
    try:
        fsync_fn(fd)
    finally:
        os.close(fd)


class OffsetIndex:
    """relative offset -> position, sparse (see module docstring)."""

    __slots__ = ("path", "cache", "rel_offsets", "positions", "persisted", "file_stale")

    def __init__(self, path: str, cache: FileCache | None = None) -> None:
        self.path = path
        self.cache = cache
        self.rel_offsets = array("I")
        self.positions = array("I")
        self.persisted = 0  # entries already in the file
        self.file_stale = False  # an entry was inserted before the file's end: rewrite it whole

    def __len__(self) -> int:
        return len(self.rel_offsets)

    def __repr__(self) -> str:
        return f"OffsetIndex({os.path.basename(self.path)}, entries={len(self)}, persisted={self.persisted})"

    def append(self, rel_offset: int, position: int) -> None:
        self.rel_offsets.append(rel_offset)
        self.positions.append(position)

    def insert(self, rel_offset: int, position: int) -> None:
        """Add an entry in its place (an entry right after damage, found after the fact). The
        file is appended to, so one inserted before its end makes the next write_pending rewrite
        it whole. No-op if there is an entry at that position."""
        i = bisect_left(self.positions, position)
        if i < len(self.positions) and self.positions[i] == position:
            return
        self.rel_offsets.insert(i, rel_offset)
        self.positions.insert(i, position)
        if i < self.persisted:
            self.file_stale = True

    def floor(self, rel_offset: int) -> tuple[int, int]:
        """(relative offset, position) of the last entry <= rel_offset, or (0, 0)."""
        i = bisect_right(self.rel_offsets, rel_offset) - 1
        if i < 0:
            return 0, 0
        return self.rel_offsets[i], self.positions[i]

    def floor_by_position(self, position: int) -> tuple[int, int]:
        """(relative offset, position) of the greatest entry at or below position, or (0, 0)."""
        i = bisect_right(self.positions, position) - 1
        return (self.rel_offsets[i], self.positions[i]) if i >= 0 else (0, 0)

    def last_position(self) -> int:
        return self.positions[-1] if self.positions else 0

    def clear(self) -> None:
        del self.rel_offsets[:]
        del self.positions[:]

    def load(self, segment_size: int) -> bool | None:
        """Read the file; False (and empty) if implausible, None if missing: the caller rebuilds.
        (A segment whose batches never reached index_interval_bytes has no entries and no file.)"""
        self.clear()
        self.persisted = 0
        data = _read_file(self.path, self.cache)
        if data is None:
            return True if segment_size == 0 else None
        if len(data) % OFFSET_ENTRY.size:
            return False
        flat = array("I")
        flat.frombytes(data)
        if sys.byteorder != "little":
            flat.byteswap()
        rel, pos = flat[0::2], flat[1::2]
        # Entries must be strictly increasing in both columns and point inside the segment. O(n),
        # but only once per segment and lazily (n is ~size / index_interval_bytes); a lookup
        # also checks that its entry points at the batch it names (Segment.locate).
        if rel and (
            pos[-1] >= max(segment_size, 1)
            or any(b <= a for a, b in zip(rel, rel[1:]))
            or any(b <= a for a, b in zip(pos, pos[1:]))
        ):
            return False
        self.rel_offsets, self.positions = rel, pos
        self.persisted = len(rel)
        return True

    def write_pending(self) -> None:
        if self.file_stale:
            self.rewrite()
            return
        n = len(self.rel_offsets)
        if self.persisted >= n:
            return
        data = b"".join(
            OFFSET_ENTRY.pack(self.rel_offsets[i], self.positions[i]) for i in range(self.persisted, n)
        )
        _write_file_tail(self.path, data, self.cache)
        self.persisted = n

    def rewrite(self) -> None:
        if not self.rel_offsets and not os.path.exists(self.path):
            self.persisted = 0
            return  # no entries, no file
        flat = array("I", bytes(8 * len(self.rel_offsets)))
        flat[0::2] = self.rel_offsets
        flat[1::2] = self.positions
        if sys.byteorder != "little":
            flat.byteswap()
        _write_file_tail(self.path, flat.tobytes(), self.cache, truncate=True)
        self.persisted = len(self.rel_offsets)
        self.file_stale = False


class TimeIndex:
    """append time -> first relative offset with that time (exact, see module docstring)."""

    __slots__ = ("path", "cache", "times", "rel_offsets", "persisted")

    def __init__(self, path: str, cache: FileCache | None = None) -> None:
        self.path = path
        self.cache = cache
        self.times = array("q")
        self.rel_offsets = array("I")
        self.persisted = 0

    def __len__(self) -> int:
        return len(self.times)

    def __repr__(self) -> str:
        return f"TimeIndex({os.path.basename(self.path)}, entries={len(self)}, persisted={self.persisted})"

    @property
    def first_time_ms(self) -> int | None:
        return self.times[0] if self.times else None

    @property
    def last_time_ms(self) -> int | None:
        return self.times[-1] if self.times else None

    def maybe_append(self, time_ms: int, rel_offset: int) -> bool:
        """Add an entry if time_ms is newer than the last; True if added."""
        if not self.times or time_ms > self.times[-1]:
            self.times.append(time_ms)
            self.rel_offsets.append(rel_offset)
            return True
        return False

    def write_last(self, fd: int) -> None:
        """Append the newest entry to the file through an open descriptor (O_APPEND)."""
        if self.persisted == len(self.times) - 1:
            os.write(fd, TIME_ENTRY.pack(self.times[-1], self.rel_offsets[-1]))
            self.persisted += 1

    def time_of(self, rel_offset: int) -> int | None:
        """Append time of the batch holding rel_offset (the entry at or before it), or None."""
        j = bisect_right(self.rel_offsets, rel_offset) - 1
        return self.times[j] if j >= 0 else None

    def first_at_or_after(self, time_ms: int) -> int | None:
        """Relative offset of the first batch appended at or after time_ms, or None."""
        i = bisect_left(self.times, time_ms)
        if i >= len(self.times):
            return None
        return self.rel_offsets[i]

    def clear(self) -> None:
        del self.times[:]
        del self.rel_offsets[:]

    def load(self, max_rel_offset: int | None = None) -> bool:
        """Read the file. Entries that are not increasing or point at or past max_rel_offset
        (beyond a truncated log end) are dropped; returns False if anything was dropped."""
        self.clear()
        self.persisted = 0
        data = _read_file(self.path, self.cache)
        if data is None:
            return True
        usable = len(data) - len(data) % TIME_ENTRY.size
        ok = usable == len(data)
        for t, rel in TIME_ENTRY.iter_unpack(memoryview(data)[:usable]):
            if (self.times and (t <= self.times[-1] or rel <= self.rel_offsets[-1])) or (
                max_rel_offset is not None and rel >= max_rel_offset
            ):
                ok = False
                break
            self.times.append(t)
            self.rel_offsets.append(rel)
        self.persisted = len(self.times) if ok else 0
        return ok

    def write_pending(self) -> None:
        n = len(self.times)
        if self.persisted >= n:
            return
        data = b"".join(TIME_ENTRY.pack(self.times[i], self.rel_offsets[i]) for i in range(self.persisted, n))
        _write_file_tail(self.path, data, self.cache)
        self.persisted = n

    def rewrite(self) -> None:
        data = b"".join(TIME_ENTRY.pack(t, r) for t, r in zip(self.times, self.rel_offsets))
        _write_file_tail(self.path, data, self.cache, truncate=True)
        self.persisted = len(self.times)
