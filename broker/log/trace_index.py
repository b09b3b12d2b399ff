"""Trace index of one segment: which records carry which trace id, so a trace is found by reading
one small file per segment instead of the log.

File `<base_offset:020d>.traceindex`, 12-byte little-endian entries `<QI`, in append order::

    hash            uint64   blake2b-64 of the trace id's UTF-8 bytes (0 is never a hash: see below)
    relative_offset uint32   offset of a record carrying that trace id minus the segment's base offset

An entry with hash 0 is a *coverage mark*: every record below its relative offset that carries a
trace id has its entry before the mark. A traced batch is written as its entries followed by a
mark at its end, in one write. Batches without trace ids (attribute bit 6 clear, see
dmq.proto.records) write nothing; the segment's roll and the log's close write a mark at the end.

Why hashes and not the ids: fixed-size entries, so a lookup is one C substring search of the file
for the 8 hash bytes (at an entry boundary), whatever the ids' lengths. A hash may collide or an
entry may be stale (a rollback cut the log): the caller reads each candidate record and keeps it
only when it carries the trace id, so the index can only make a lookup cheaper, never wrong.

Loading (lazily: on the first traced append after open, or the first lookup), as the offset index
is checked (index.py): the file must be whole entries with non-decreasing relative offsets, none
beyond the segment's end. Otherwise it is rebuilt from the log. The records between the last
mark and the segment's end (a crash, or untraced batches after the last traced one) are indexed
from the log: their batch headers are walked and only those with bit 6 are decoded.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Callable, Iterable

from dmq.broker.log.handles import FileCache, reserve

__all__ = ["TRACE_SUFFIX", "TRACE_ENTRY", "TraceIndex", "trace_hash"]

TRACE_SUFFIX = ".traceindex"
TRACE_ENTRY = struct.Struct("<QI")
_HASH = struct.Struct("<Q")
_MARK = 0

# (start relative offset) -> (trace id, relative offset) of every traced record from there to the end
CatchUp = Callable[[int], Iterable[tuple[str, int]]]


def trace_hash(trace_id: str) -> int:
    """The 64-bit hash stored for a trace id (never 0, the coverage mark)."""
    h = int.from_bytes(hashlib.blake2b(trace_id.encode(), digest_size=8).digest(), "little")
    return h or 1


class TraceIndex:
    """See the module docstring. Callers hold the partition's lock."""

    __slots__ = ("path", "_cache", "loaded", "pending")

    def __init__(self, path: str, cache: FileCache, *, fresh: bool = False) -> None:
        self.path = path
        self._cache = cache
        # A new segment has nothing to index; one opened from disk is checked on first use.
        self.loaded = fresh
        self.pending = bytearray()  # entries a failed write left behind, written before the next

    def __repr__(self) -> str:
        return f"TraceIndex({os.path.basename(self.path)}, loaded={self.loaded}, pending={len(self.pending) // 12})"

    def _read(self) -> bytes:
        with reserve(self._cache):
            try:
                with open(self.path, "rb") as f:
                    return f.read()
            except FileNotFoundError:
                return b""

    def ensure_loaded(self, end_rel: int, catch_up: CatchUp) -> None:
        """Check the file against the segment's end and index what it misses (see the module doc)."""
        if self.loaded:
            return
        data = self._read()
        covered, keep = self._check(data, end_rel)
        # read the log first: if it fails (the segment was deleted meanwhile), nothing is written
        missed = [(trace_hash(t), rel) for t, rel in catch_up(covered)] if covered < end_rel else []
        if keep != len(data):
            self._rewrite(data[:keep])
        self.loaded = True
        self.pending.clear()
        if covered < end_rel:
            self.add(missed, end_rel)

    @staticmethod
    def _check(data: bytes, end_rel: int) -> tuple[int, int]:
        """(relative offset covered, bytes to keep): everything up to the last mark when the file is
        plausible, nothing when it is not."""
        if len(data) % TRACE_ENTRY.size:
            return 0, 0
        covered = keep = 0
        last = 0
        for i, (h, rel) in enumerate(TRACE_ENTRY.iter_unpack(data)):
            if rel < last or rel > end_rel or (h != _MARK and rel == end_rel):
                return 0, 0
            last = rel
            if h == _MARK:
                covered, keep = rel, (i + 1) * TRACE_ENTRY.size
        return covered, keep

    def _rewrite(self, data: bytes) -> None:
        self._cache.close(self.path)
        tmp = self.path + ".tmp"
        with reserve(self._cache):
            with open(tmp, "wb") as f:
                f.write(data)
        os.replace(tmp, self.path)

    def add(self, entries: Iterable[tuple[int, int]], end_rel: int) -> None:
        """Index a batch's traced records ((hash, relative offset) each), then mark its end."""
        for h, rel in entries:
            self.pending += TRACE_ENTRY.pack(h, rel)
        self.mark(end_rel)

    def mark(self, end_rel: int) -> None:
        """Write a coverage mark at end_rel (with any pending entries); an I/O error keeps them
        pending for the next write (the log data does not depend on this file)."""
        if not self.loaded or (end_rel == 0 and not self.pending):
            return  # never loaded: the file is checked against the log when it is; empty: no file
        self.pending += TRACE_ENTRY.pack(_MARK, end_rel)
        try:
            os.write(self._cache.fd(self.path, create=True), self.pending)
        except OSError:
            return
        self.pending.clear()

    def lookup(self, trace_id: str) -> list[int]:
        """Relative offsets of the entries with trace_id's hash (candidates: see the module doc)."""
        data = self._read() + self.pending
        needle = _HASH.pack(trace_hash(trace_id))
        out = []
        i = data.find(needle)
        while i >= 0:
            if i % TRACE_ENTRY.size == 0:
                out.append(TRACE_ENTRY.unpack_from(data, i)[1])
                i = data.find(needle, i + TRACE_ENTRY.size)
            else:
                i = data.find(needle, i + 1)
        return sorted(set(out))

    def truncate(self, end_rel: int) -> None:
        """The segment was cut back to end_rel: drop the entries at or beyond it."""
        if not os.path.exists(self.path):
            self.pending.clear()
            return
        had_pending = bool(self.pending)
        data = self._read() + self.pending
        self.pending.clear()
        if len(data) % TRACE_ENTRY.size:
            self._rewrite(b"")
            self.loaded = False
            return
        kept = bytearray()
        for h, rel in TRACE_ENTRY.iter_unpack(data):
            if rel < end_rel or (h == _MARK and rel == end_rel):
                kept += TRACE_ENTRY.pack(h, rel)
        if len(kept) != len(data) or had_pending:
            self._rewrite(bytes(kept))
