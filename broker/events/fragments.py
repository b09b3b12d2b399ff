"""The event index's fragments file: each event's read answer, encoded, in position order.

File `<partition dir>/events.fragments`, beside the index (index.py). An event's fragment is the
event as an encoded EventReadResponse with one entry in each column (answer_fragment). Protobuf
merges concatenated messages and appends their repeated fields, so the fragments of a read's
events, concatenated in position order, are the encoded columnar answer of that read: the broker
builds no column and turns no row into Python objects.

Why a file and not an index column: a tag read of 10,000 events scattered over a 1,000,000-event
store took ~16 ms in SQLite's lookups of the events table alone (one B-tree descent per event);
the index's rows hold each event's (offset, length) here instead, and the bytes are sliced out of a
memory map. A copy of the fragment in every tag row (a covering index) read as fast but made the
(tag, position) tree ~6x larger, and appends, whose tags land all over that tree, 4x slower.

Derived data, like the index: written before the index rows that point into it and fsynced before
they commit (EventIndex.commit), so a committed row never points past the durable end. The file's
committed end is kept in the index's meta table; bytes past it (rows rolled back or lost in a
crash) are cut off when the index opens. Bytes of events a log truncation took stay unreferenced
until the index is rebuilt (rare, and bounded by what was cut).

Used by the index's one thread (the store's writer).
"""

from __future__ import annotations

import mmap
import os
import struct
from array import array
from collections.abc import Sequence
from itertools import accumulate

from dmq.proto import dmq_pb2 as pb

__all__ = ["FRAGMENTS_FILE", "AT", "FragmentsFile", "answer_fragment"]

FRAGMENTS_FILE = "events.fragments"
# Where an event's fragment is: (start, end) offsets in the file, as stored in the index rows.
# Two machine words, so that a read's concatenated pairs load into one array('Q') at C speed.
AT = struct.Struct("=QQ")


def answer_fragment(position: int, type_: str, tags: str, payload: bytes, metadata: bytes, time_ms: int) -> bytes:
    """One event as an encoded EventReadResponse with one entry in each column (tags joined by "\\n")."""
    return pb.EventReadResponse(positions=(position,), types=(type_,), tags=(tags,), payloads=(payload,),
                                metadata=(metadata,), append_times_ms=(time_ms,)).SerializeToString()


class FragmentsLostError(Exception):
    """The file is shorter than the index's committed end: the index must be rebuilt."""


class FragmentsFile:
    def __init__(self, directory: str, committed_end: int) -> None:
        self.path = os.path.join(directory, FRAGMENTS_FILE)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        self._map: mmap.mmap | None = None
        self._view = memoryview(b"")
        try:
            size = os.fstat(self._fd).st_size
            if size < committed_end:
                raise FragmentsLostError(f"{self.path} holds {size} bytes, the index points up to {committed_end}")
            if size > committed_end:
                os.ftruncate(self._fd, committed_end)  # fragments of rows that never committed
        except BaseException:
            os.close(self._fd)
            raise
        self.end = committed_end  # where the next fragment goes

    def __repr__(self) -> str:
        return f"<FragmentsFile {self.path} end={self.end}>"

    def append(self, fragments: Sequence[bytes]) -> bytes:
        """Write fragments at the end; their (start, end) pairs, packed with AT, concatenated."""
        data = b"".join(fragments)
        view, at = memoryview(data), self.end
        while view:
            written = os.pwrite(self._fd, view, at)
            view, at = view[written:], at + written
        bounds = array("Q", accumulate(map(len, fragments), initial=self.end))
        pairs = array("Q", bytes(16 * len(fragments)))
        pairs[0::2], pairs[1::2] = bounds[:-1], bounds[1:]
        self.end += len(data)
        return pairs.tobytes()

    def sync(self) -> None:
        os.fdatasync(self._fd)

    def cut(self, end: int) -> None:
        """Forget what lies past `end` (staged fragments of a rolled-back transaction)."""
        self._unmap()  # a map past the new end would fault on access
        os.ftruncate(self._fd, end)
        self.end = end

    def gather(self, pairs: array[int], prefix: bytes = b"") -> bytes:
        """`prefix`, then the fragments at these (start, end) pairs (flat, as AT packs them),
        concatenated: one copy of each fragment, cut from the map by C loops (map / join)."""
        starts, ends = pairs[0::2], pairs[1::2]
        if not starts:
            return prefix
        needed = max(ends)
        if self._map is None or len(self._map) < needed:
            self._unmap()
            self._map = mmap.mmap(self._fd, 0, access=mmap.ACCESS_READ)
            self._view = memoryview(self._map)
            if len(self._map) < needed:
                raise OSError(f"{self.path} holds {len(self._map)} bytes, a fragment ends at {needed}")
        parts: list[bytes | memoryview] = [prefix]
        parts += map(self._view.__getitem__, map(slice, starts, ends))
        # the slices of the view are released as soon as the join has copied them
        return b"".join(parts)

    def _unmap(self) -> None:
        if self._map is not None:
            self._view.release()
            self._map.close()
            self._map = None

    def close(self) -> None:
        self._unmap()
        os.close(self._fd)
