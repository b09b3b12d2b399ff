"""Batch-by-batch validation of a segment file, telling a torn tail from damage in the middle.

`scan_batches` walks the bytes of one .log file and yields what it finds, in file order:

    Batch(position, header)            a complete batch: header sane, CRC right, offsets contiguous
    Damaged(position, end, first_offset, last_offset, reason)
                                       bytes [position, end) are not a valid batch, but a valid
                                       batch continuing the offsets starts at `end`: damage in
                                       the middle of the log (bit rot, a bad sector). The offsets
                                       first_offset..last_offset (possibly empty) are lost there.
    Tail(position, reason)             from `position` to the end of the file nothing valid
                                       follows: a torn write (crash during an append) or garbage

Why the distinction: recovery may cut a torn tail (it was never acknowledged: the fsync that
acknowledges a batch covers its whole write), but valid batches after a damaged one are
acknowledged data and must be kept; the damaged batch is reported and never served.

Resynchronising after a bad batch tries, in order: the position its length field points at (when
plausible), then every later position where the magic byte sits at the right place. A candidate is
accepted when its header is sane, its CRC matches, it lies wholly in the file and its base offset
is >= the expected one and not absurdly far (no more offsets skipped than bytes skipped). A CRC
match on random bytes has probability 2**-32 per candidate; the offset check removes the
remaining risk of resynchronising on a batch stored inside a record's value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from dmq.proto.records import CRC_START, HEADER_SIZE, MAGIC, BatchHeader, RecordsError, crc32, read_header

__all__ = ["Batch", "Damaged", "Tail", "scan_batches", "SCAN_CHUNK_BYTES"]

# Large reads so the per-syscall cost vanishes next to the CRC.
SCAN_CHUNK_BYTES = 8 * 1024 * 1024
_MAGIC_AT = 12  # byte position of the magic in a header
_MAGIC_BYTE = bytes([MAGIC])


@dataclass(frozen=True, slots=True)
class Batch:
    position: int
    header: BatchHeader


@dataclass(frozen=True, slots=True)
class Damaged:
    position: int
    end: int
    first_offset: int
    last_offset: int  # < first_offset when the damaged bytes held no offsets
    reason: str


@dataclass(frozen=True, slots=True)
class Tail:
    position: int
    reason: str


Event = Batch | Damaged | Tail


class _Reader:
    """Random access to a file through one cached chunk (pread callable: (n, pos) -> bytes)."""

    def __init__(self, pread: Callable[[int, int], bytes], size: int, chunk_bytes: int) -> None:
        self._pread = pread
        self.size = size
        self._chunk = chunk_bytes
        self._buf = memoryview(b"")
        self._start = 0

    def view(self, pos: int, n: int) -> memoryview | None:
        """n bytes at pos, or None if they are not all in the file."""
        if pos < 0 or pos + n > self.size:
            return None
        if not (self._start <= pos and pos + n <= self._start + len(self._buf)):
            want = min(max(n, self._chunk), self.size - pos)
            data = self._pread(want, pos)
            if len(data) < n:
                return None
            self._buf, self._start = memoryview(data), pos
        return self._buf[pos - self._start : pos - self._start + n]


def _check(r: _Reader, pos: int, max_batch_bytes: int) -> tuple[BatchHeader | None, str]:
    """(header, "") if a complete batch with a matching CRC starts at pos, else (None, why)."""
    head = r.view(pos, HEADER_SIZE)
    if head is None:
        return None, f"torn batch: {r.size - pos} bytes at position {pos}, less than a header"
    try:
        h = read_header(head, 0, max_batch_bytes=max_batch_bytes)
    except RecordsError as e:
        return None, f"bad header at position {pos}: {e}"
    body = r.view(pos, h.total_size)
    if body is None:
        return None, (
            f"torn batch: {h.total_size} bytes needed at position {pos}, {r.size - pos} left in the file"
        )
    if crc32(body[CRC_START:]) != h.crc:
        return None, f"crc mismatch in batch at position {pos}"
    return h, ""


def _plausible_length(r: _Reader, pos: int) -> int | None:
    head = r.view(pos, 12)
    if head is None:
        return None
    length = int.from_bytes(head[8:12], "little", signed=True)
    total = 12 + length
    return total if HEADER_SIZE <= total <= r.size - pos else None


def _resync(r: _Reader, pos: int, expected: int, max_batch_bytes: int) -> tuple[int, BatchHeader] | None:
    """The first position after pos where a valid batch continuing the offsets starts."""

    def ok(p: int) -> BatchHeader | None:
        h, _ = _check(r, p, max_batch_bytes)
        if h is None or not expected <= h.base_offset <= expected + (p - pos):
            return None
        return h

    tried = set()
    skip = _plausible_length(r, pos)
    if skip is not None:
        tried.add(pos + skip)
        h = ok(pos + skip)
        if h is not None:
            return pos + skip, h
    # Every later position whose magic byte is in place, found with bytes.find chunk by chunk.
    p = pos + 1
    while p + HEADER_SIZE <= r.size:
        n = min(SCAN_CHUNK_BYTES, r.size - p - _MAGIC_AT)
        window = r.view(p + _MAGIC_AT, n)
        if window is None:
            return None
        chunk = bytes(window)  # one copy per chunk; candidates are found in it
        i = chunk.find(_MAGIC_BYTE)
        while i >= 0:
            cand = p + i
            if cand + HEADER_SIZE > r.size:
                return None
            if cand not in tried:
                h = ok(cand)
                if h is not None:
                    return cand, h
            i = chunk.find(_MAGIC_BYTE, i + 1)
        p += n
    return None


def scan_batches(
    pread: Callable[[int, int], bytes],
    file_size: int,
    base_offset: int,
    *,
    max_batch_bytes: int,
    max_relative_offset: int,
    chunk_bytes: int = SCAN_CHUNK_BYTES,
    start_position: int = 0,
    start_offset: int | None = None,
) -> Iterator[Event]:
    """Validate the batches of one segment file (see the module docstring), from
    start_position, where a batch with start_offset (default base_offset) is expected."""
    r = _Reader(pread, file_size, chunk_bytes)
    pos = start_position
    expected = base_offset if start_offset is None else start_offset
    while pos < file_size:
        h, why = _check(r, pos, max_batch_bytes)
        if h is not None and h.base_offset != expected:
            why = f"batch at position {pos} has base offset {h.base_offset}, expected {expected}"
            h = None
        elif h is not None and h.last_offset - base_offset > max_relative_offset:
            why = f"batch at position {pos} has offsets beyond the segment's range"
            h = None
        if h is not None:
            yield Batch(pos, h)
            pos += h.total_size
            expected = h.last_offset + 1
            continue
        found = _resync(r, pos, expected, max_batch_bytes)
        if found is None:
            yield Tail(pos, why)
            return
        nxt, nh = found
        yield Damaged(pos, nxt, expected, nh.base_offset - 1, why)
        pos = nxt
        expected = nh.base_offset
