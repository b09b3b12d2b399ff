"""Record-batch codec: the bytes that are the produce request, the stored log and the fetch response.

A batch is a fixed 57-byte header followed by a columnar body. Everything is little-endian.

Header (``HEADER = struct.Struct("<qiBIhiqqqhii")``)::

    off size field            type    notes
    0   8    base_offset      int64   offset of the first record; patched in place by the broker at
                                      append, so it is NOT covered by the CRC
    8   4    batch_length     int32   bytes after this field: total batch size = 12 + batch_length
    12  1    magic            int8    = 2
    13  4    crc              uint32  zlib.crc32 of bytes [17, end of batch)
    17  2    attributes       int16   bits 0-2 codec (0 none, 1 zstd, 2 lz4)
                                      bit 3    timestamp type (0 create time, 1 log append time:
                                               every record's timestamp is then max_timestamp)
                                      bit 4    has headers (the header_offsets array is present)
                                      bit 5    some record carries a transaction id (header
                                               TXN_HEADER): the leader de-duplicates them
                                      bit 6    some record carries a trace id (header
                                               TRACEPARENT_HEADER, or the older
                                               TRACE_HEADER): the leader indexes them
                                      bits 7-15 reserved, must be 0
    19  4    record_count     int32   >= 1; records have offsets base_offset .. base_offset+count-1
                                      (the last one must fit int64)
    23  8    first_timestamp  int64   ms since the epoch, timestamp of the first record
    31  8    max_timestamp    int64   ms, exactly the largest record timestamp (checked when the
                                      records' timestamps are built)
    39  8    producer_id      int64   -1 when not idempotent
    47  2    producer_epoch   int16   -1 when not idempotent
    49  4    base_sequence    int32   -1 when not idempotent; sequence of the first record
    53  4    body_length      int32   length of the UNCOMPRESSED body
    57       body             stored length = 12 + batch_length - 57; compressed as a whole
                              (one zstd frame / one lz4 frame) when codec != 0, else exactly
                              body_length bytes

Body (uncompressed), n = record_count, all integers int32 little-endian::

    size          field            notes
    4*n           timestamp_deltas record timestamp - first_timestamp (may be negative)
    4*(n+1)       key_offsets      Arrow-style: key i is key_blob[key_offsets[i]:key_offsets[i+1]];
                                   key_offsets[0] = 0, non-decreasing, key_offsets[n] = len(key_blob)
    4*(n+1)       value_offsets    same for value_blob (values are never null)
    4*(n+1)       header_offsets   same for header_blob; ONLY present when attribute bit 4 is set
    ceil(n/8)     key_validity     Arrow validity bitmap, LSB bit order: key i is present when
                                   bit (i % 8) of byte (i // 8) is 1; a null key has an empty slot;
                                   padding bits are 0
    key_offsets[n]     key_blob    keys back to back
    value_offsets[n]   value_blob  values back to back
    header_offsets[n]  header_blob per-record header lists back to back (absent without bit 4)

Nothing else: body_length must equal the sum of the sections exactly. The arrays come first so a
reader can wrap them (``memoryview.cast("i")``, ``pyarrow.Array.from_buffers``) without copying.

Per-record headers (one entry of header_blob; an empty entry means no headers) - varints are
unsigned LEB128 (7 bits per byte, low group first, high bit = more follows, at most 5 bytes)::

    uvarint  header_count           >= 1 when the entry is not empty
    then header_count times:
      uvarint  key_length           bytes of the UTF-8 key
      bytes    key                  UTF-8
      uvarint  value_length_plus_1  0 = value None, else len(value) + 1
      bytes    value

Reserved headers: names starting with ``dmq.`` belong to DMQ. ``dmq.txn`` (TXN_HEADER) is a
record's transaction id and ``dmq.trace`` (TRACE_HEADER) its trace id, each a UTF-8 string of 1 to
RECORD_ID_MAX_CHARS characters. A record's trace context is the W3C ``traceparent`` header
(TRACEPARENT_HEADER, dmq.proto.tracecontext), whose trace id is the record's trace id; clients
write it instead of ``dmq.trace`` now, which is still read for records written before
(trace_ids). encode() sets attribute bits 5 / 6 when a record has them, so the broker decodes the
records of exactly those batches (and no other: bits clear, it never does).

Limits: a batch (total size and uncompressed body_length) is at most ``max_batch_bytes``
(default 16 MiB, never above 2**31 - 1 so every offset fits int32); on encode a record's
key + value + encoded headers is at most ``max_record_bytes`` (default 1 MiB). Decoders bound
decompression output by body_length, itself bounded by max_batch_bytes, and raise only
``RecordsError`` subclasses on any input.

``RecordBatch.to_arrow()`` leaves the headers out (their per-record encoding is not an Arrow
layout); iterate the batch for headers.
"""

from __future__ import annotations

import enum
import struct
import sys
import threading
import time

try:
    # ISA-L computes zlib's CRC-32 with carry-less multiplies at ~30 GB/s, ten times zlib 1.2's
    # ~3 GB/s: without it, checking the CRC of a produced batch costs more than writing it.
    from isal.isal_zlib import crc32 as crc32  # `as`: re-exported, the log checks CRCs with it
except ImportError:  # pragma: no cover - the dependency is declared; this keeps the codec usable
    from zlib import crc32 as crc32
from array import array
from dataclasses import dataclass
from itertools import accumulate, compress, islice, pairwise, repeat
from operator import add, sub
from typing import TYPE_CHECKING, Any, Iterable, Iterator, NamedTuple, Sequence

from dmq.proto.tracecontext import TRACEPARENT_HEADER, traceparent_trace_id

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow

__all__ = [
    "HEADER",
    "HEADER_SIZE",
    "MAGIC",
    "Codec",
    "DEFAULT_MAX_BATCH_BYTES",
    "DEFAULT_MAX_RECORD_BYTES",
    "RecordsError",
    "TruncatedBatchError",
    "CorruptBatchError",
    "BatchTooLargeError",
    "RecordTooLargeError",
    "InvalidRecordIdError",
    "TXN_HEADER",
    "TRACE_HEADER",
    "TRACEPARENT_HEADER",
    "RECORD_ID_MAX_CHARS",
    "ATTR_HAS_TXN_IDS",
    "ATTR_HAS_TRACE_IDS",
    "check_record_id",
    "record_ids",
    "header_values",
    "trace_ids",
    "BatchHeader",
    "Record",
    "RecordBatch",
    "read_header",
    "validate_batch",
    "patch_base_offset",
    "iter_headers",
    "encode",
    "decode",
    "decode_batches",
    "slice_batch",
]

HEADER = struct.Struct("<qiBIhiqqqhii")
HEADER_SIZE = 57
MAGIC = 2
assert HEADER.size == HEADER_SIZE

# The part of the header the CRC covers starts at the attributes field.
CRC_START = 17
_PREFIX = struct.Struct("<qiBI")  # base_offset, batch_length, magic, crc
_TAIL = struct.Struct("<hiqqqhii")  # attributes .. body_length, CRC-covered
assert _PREFIX.size == CRC_START and _PREFIX.size + _TAIL.size == HEADER_SIZE
_INT64 = struct.Struct("<q")
_INT32 = struct.Struct("<i")

# batch_length counts the bytes after itself, so a batch without body has this batch_length.
_MIN_BATCH_LENGTH = HEADER_SIZE - 12

DEFAULT_MAX_BATCH_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_RECORD_BYTES = 1024 * 1024
_INT32_MAX = 2**31 - 1
_INT32_MIN = -(2**31)
_INT64_MAX = 2**63 - 1
_INT64_MIN = -(2**63)


class Codec(enum.IntEnum):
    NONE = 0
    ZSTD = 1
    LZ4 = 2


ATTR_CODEC_MASK = 0x07
ATTR_LOG_APPEND_TIME = 0x08
ATTR_HAS_HEADERS = 0x10
ATTR_HAS_TXN_IDS = 0x20
ATTR_HAS_TRACE_IDS = 0x40
_ATTR_KNOWN = ATTR_CODEC_MASK | ATTR_LOG_APPEND_TIME | ATTR_HAS_HEADERS | ATTR_HAS_TXN_IDS | ATTR_HAS_TRACE_IDS

TXN_HEADER = "dmq.txn"
TRACE_HEADER = "dmq.trace"  # the trace id header before traceparent: read for data written then
RECORD_ID_MAX_CHARS = 255
# encode(): header name -> the attribute bit it sets
_RESERVED_BITS = {
    TXN_HEADER: ATTR_HAS_TXN_IDS, TRACE_HEADER: ATTR_HAS_TRACE_IDS, TRACEPARENT_HEADER: ATTR_HAS_TRACE_IDS
}
# each name as it is encoded in a header entry: its uvarint length (< 128), then the UTF-8 bytes
_RESERVED_KEYS = {name: bytes((len(name),)) + name.encode() for name in _RESERVED_BITS}

_LITTLE = sys.byteorder == "little"
assert array("i").itemsize == 4, "array('i') must be 32-bit for the body arrays"


class RecordsError(ValueError):
    """Root of every error raised by this module (bad bytes or bad arguments)."""


class TruncatedBatchError(RecordsError):
    """The buffer ends before the batch (or its header) does."""


class CorruptBatchError(RecordsError):
    """Bad magic, bad CRC, impossible field values or an inconsistent body."""


class BatchTooLargeError(RecordsError):
    """A batch (total size or uncompressed body) exceeds max_batch_bytes."""


class RecordTooLargeError(RecordsError):
    """A record's key + value + headers exceeds max_record_bytes."""


class InvalidRecordIdError(RecordsError):
    """A transaction id or trace id that is empty, too long or not UTF-8."""


def check_record_id(value: object, field: str) -> str:
    """A transaction / trace id as it travels (str or its UTF-8 bytes) -> the str; raises
    InvalidRecordIdError naming `field` and the limit (client and broker run the same rule)."""
    if type(value) is str and 0 < len(value) <= RECORD_ID_MAX_CHARS:
        return value  # the common case, first: the producer checks every id it sends
    if isinstance(value, bytes | bytearray | memoryview):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidRecordIdError(f"{field} is not UTF-8: {e}") from None
    if not isinstance(value, str):
        raise InvalidRecordIdError(f"{field} must be a str, got {type(value).__name__}")
    if not 1 <= len(value) <= RECORD_ID_MAX_CHARS:
        raise InvalidRecordIdError(
            f"{field} is {len(value)} characters; it must be 1 to {RECORD_ID_MAX_CHARS} characters"
        )
    return value


@dataclass(frozen=True, slots=True)
class BatchHeader:
    base_offset: int
    batch_length: int
    magic: int
    crc: int
    attributes: int
    record_count: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    body_length: int

    @property
    def total_size(self) -> int:
        return 12 + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.record_count - 1

    @property
    def codec(self) -> Codec:
        return Codec(self.attributes & ATTR_CODEC_MASK)

    @property
    def has_headers(self) -> bool:
        return bool(self.attributes & ATTR_HAS_HEADERS)

    @property
    def log_append_time(self) -> bool:
        return bool(self.attributes & ATTR_LOG_APPEND_TIME)

    @property
    def last_sequence(self) -> int:
        """Sequence of the last record, or -1 when the batch is not idempotent."""
        if self.base_sequence < 0:
            return -1
        return self.base_sequence + self.record_count - 1


class Record(NamedTuple):
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes | None], ...]


def _min_body_length(count: int, has_headers: bool) -> int:
    """Bytes the arrays of a body with `count` records take before any blob."""
    return 4 * count + 4 * (count + 1) * (3 if has_headers else 2) + (count + 7) // 8


def _as_bytes_view(buf: Any) -> memoryview:
    """A flat unsigned-byte view of any buffer, so len() counts bytes."""
    try:
        mv = memoryview(buf)
    except TypeError as e:
        raise RecordsError(f"expected a bytes-like buffer, got {type(buf).__name__}") from e
    if mv.format != "B" or mv.ndim != 1:
        try:
            mv = mv.cast("B")
        except TypeError as e:  # non-contiguous views cannot be cast
            raise RecordsError(f"buffer must be C-contiguous: {e}") from e
    return mv


def read_header(buf: Any, pos: int = 0, *, max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES) -> BatchHeader:
    """Parse and sanity-check the header of the batch at `pos`.

    Needs only the HEADER_SIZE header bytes to be present (a log reader can read the header, then
    the rest); checks magic, attributes, record_count, body_length and sizes against
    max_batch_bytes, but not the CRC nor that the whole batch is in `buf` (validate_batch does).
    """
    if pos < 0:
        raise RecordsError(f"pos {pos} must be >= 0")
    if type(buf) is not bytes:
        buf = _as_bytes_view(buf)
    available = len(buf) - pos
    if available < HEADER_SIZE:
        raise TruncatedBatchError(
            f"batch at position {pos}: {max(available, 0)} bytes left, a header needs {HEADER_SIZE}"
        )
    h = BatchHeader(*HEADER.unpack_from(buf, pos))
    if h.magic != MAGIC:
        raise CorruptBatchError(f"batch at position {pos}: magic {h.magic}, expected {MAGIC}")
    if h.batch_length < _MIN_BATCH_LENGTH:
        raise CorruptBatchError(
            f"batch at position {pos}: batch_length {h.batch_length} below the minimum "
            f"{_MIN_BATCH_LENGTH} (a header without body)"
        )
    if h.total_size > max_batch_bytes:
        raise BatchTooLargeError(
            f"batch at position {pos}: total size {h.total_size} bytes exceeds max_batch_bytes "
            f"{max_batch_bytes}"
        )
    if h.attributes & ~_ATTR_KNOWN:
        raise CorruptBatchError(
            f"batch at position {pos}: attributes 0x{h.attributes & 0xFFFF:04x} set reserved bits 7-15"
        )
    codec = h.attributes & ATTR_CODEC_MASK
    if codec > Codec.LZ4:
        raise CorruptBatchError(
            f"batch at position {pos}: unknown codec {codec} in attributes bits 0-2 "
            f"(known: 0 none, 1 zstd, 2 lz4)"
        )
    if h.record_count <= 0:
        raise CorruptBatchError(f"batch at position {pos}: record_count {h.record_count} must be >= 1")
    if h.base_offset + h.record_count - 1 > _INT64_MAX:
        raise CorruptBatchError(
            f"batch at position {pos}: base_offset {h.base_offset} + record_count {h.record_count} "
            f"overflows int64"
        )
    if h.body_length > max_batch_bytes:
        raise BatchTooLargeError(
            f"batch at position {pos}: body_length {h.body_length} (uncompressed) exceeds "
            f"max_batch_bytes {max_batch_bytes}"
        )
    min_body = _min_body_length(h.record_count, bool(h.attributes & ATTR_HAS_HEADERS))
    if h.body_length < min_body:
        raise CorruptBatchError(
            f"batch at position {pos}: body_length {h.body_length} too small for record_count "
            f"{h.record_count} (its arrays alone need {min_body} bytes)"
        )
    if codec == Codec.NONE and h.total_size - HEADER_SIZE != h.body_length:
        raise CorruptBatchError(
            f"batch at position {pos}: uncompressed body is {h.total_size - HEADER_SIZE} bytes "
            f"but body_length says {h.body_length}"
        )
    return h


def _check_complete(h: BatchHeader, available: int, pos: int) -> None:
    if h.total_size > available:
        raise TruncatedBatchError(
            f"batch at position {pos}: batch_length {h.batch_length} needs {h.total_size} bytes, "
            f"{available} left in the buffer"
        )


def validate_batch(buf: Any, pos: int = 0, *, max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES) -> BatchHeader:
    """read_header + the whole batch is present + its CRC matches. What the broker runs on produce."""
    mv = _as_bytes_view(buf)
    h = read_header(mv, pos, max_batch_bytes=max_batch_bytes)
    _check_complete(h, len(mv) - pos, pos)
    crc = crc32(mv[pos + CRC_START : pos + h.total_size])
    if crc != h.crc:
        raise CorruptBatchError(
            f"batch at position {pos}: crc 0x{h.crc:08x} does not match computed 0x{crc:08x}"
        )
    return h


def patch_base_offset(buf: bytearray | memoryview, pos: int, base_offset: int) -> None:
    """Write base_offset into the batch at `pos`, in place. The CRC stays valid (it skips it)."""
    if pos < 0 or len(_as_bytes_view(buf)) - pos < 8:
        raise TruncatedBatchError(f"no batch header at position {pos} to patch")
    try:
        _INT64.pack_into(buf, pos, base_offset)
    except struct.error as e:
        raise RecordsError(f"base_offset {base_offset} does not fit int64: {e}") from e


def iter_headers(
    buf: Any, pos: int = 0, *, max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) for each batch of concatenated batches, without CRC checks.

    Raises TruncatedBatchError when the last batch is incomplete (after yielding the complete ones),
    so a caller recovering a log can truncate at the position it names.
    """
    mv = _as_bytes_view(buf)
    end = len(mv)
    while pos < end:
        h = read_header(mv, pos, max_batch_bytes=max_batch_bytes)
        _check_complete(h, end - pos, pos)
        yield pos, h
        pos += h.total_size



_LENGTH_AT = 8  # batch_length's offset in the header
_COUNT_AT = 19  # record_count's


def count_records(buf: Any) -> int:
    """The records of concatenated batches, summed from their headers' record_count: O(batches),
    nothing decoded or checked (for batches already validated, e.g. a log's, as metrics count
    them). A trailing partial header or batch counts what its header holds, if the header is whole."""
    mv = _as_bytes_view(buf)
    end = len(mv) - HEADER_SIZE
    pos = count = 0
    int32 = _INT32.unpack_from
    while pos <= end:
        count += int32(mv, pos + _COUNT_AT)[0]
        # never a step back or in place, whatever the bytes say: this loop must end
        pos += 12 + max(int32(mv, pos + _LENGTH_AT)[0], _MIN_BATCH_LENGTH)
    return count

# ---------------------------------------------------------------------------------------------
# Compression. The libraries are imported on first use so the header-level API (the broker's)
# never depends on them.

def _zstd() -> Any:
    try:
        import zstandard
    except ImportError as e:  # pragma: no cover - dependency of the project
        raise RecordsError("codec zstd needs the 'zstandard' package") from e
    return zstandard


def _lz4frame() -> Any:
    try:
        import lz4.frame
    except ImportError as e:  # pragma: no cover - dependency of the project
        raise RecordsError("codec lz4 needs the 'lz4' package") from e
    return lz4.frame


_ZSTD_DEFAULT_LEVEL = 3  # zstd's (and Kafka's) default: far ahead of the network at ~400 MB/s
# Compression contexts cost ~9 us to create, as much as compressing a small batch: keep one per
# thread and level (a context is not safe to share between threads).
_contexts = threading.local()


def _zstd_compressor(level: int) -> Any:
    cache = _contexts.__dict__.setdefault("zstd_c", {})
    c = cache.get(level)
    if c is None:
        # content size is written in the frame so a reader can check it before inflating
        c = cache[level] = _zstd().ZstdCompressor(level=level, write_content_size=True)
    return c


def _compress(codec: Codec, body: bytes, level: int | None) -> bytes:
    try:
        # the codec modules are untyped (Any): the annotation states what they return
        out: bytes
        if codec == Codec.ZSTD:
            out = _zstd_compressor(_ZSTD_DEFAULT_LEVEL if level is None else level).compress(body)
            return out
        if codec == Codec.LZ4:
            out = _lz4frame().compress(body, store_size=True, compression_level=level or 0)
            return out
    except RecordsError:
        raise
    except Exception as e:  # e.g. a compression level the library refuses
        raise RecordsError(f"encode: {codec.name.lower()} compression failed: {e}") from e
    raise RecordsError(f"unknown codec {codec!r}")


def _decompress(codec: int, data: memoryview, body_length: int, pos: int) -> bytes:
    """Inflate `data`, producing at most body_length bytes whatever the data claims."""
    where = f"batch at position {pos}"
    out: bytes  # the codec modules are untyped (Any): the annotation states what they return
    if codec == Codec.ZSTD:
        zstandard = _zstd()
        try:
            size = zstandard.frame_content_size(data)
        except Exception as e:  # ZstdError for a bad frame header
            raise CorruptBatchError(f"{where}: bad zstd frame header: {e}") from e
        if size != body_length:
            raise CorruptBatchError(
                f"{where}: zstd frame content size {size} does not match body_length {body_length}"
            )
        dctx = _contexts.__dict__.get("zstd_d")
        if dctx is None:
            dctx = _contexts.zstd_d = zstandard.ZstdDecompressor()
        dobj = dctx.decompressobj()
        try:
            # libzstd fails a frame that inflates past its declared content size, so the output
            # is bounded by body_length (<= max_batch_bytes)
            out = dobj.decompress(data)
        except Exception as e:
            raise CorruptBatchError(f"{where}: zstd body does not decompress: {e}") from e
        if not dobj.eof:
            raise CorruptBatchError(f"{where}: zstd body ends inside its frame")
        if dobj.unused_data:
            raise CorruptBatchError(f"{where}: {len(dobj.unused_data)} bytes after the zstd frame")
    elif codec == Codec.LZ4:
        dec = _lz4frame().LZ4FrameDecompressor()
        try:
            out = dec.decompress(data, max_length=body_length)
        except Exception as e:
            raise CorruptBatchError(f"{where}: lz4 body does not decompress: {e}") from e
        if not dec.eof:
            raise CorruptBatchError(
                f"{where}: lz4 body does not end within body_length {body_length} bytes"
            )
        if dec.unused_data:
            raise CorruptBatchError(f"{where}: {len(dec.unused_data)} bytes after the lz4 frame")
    else:  # read_header rejects other codecs
        raise CorruptBatchError(f"{where}: unknown codec {codec}")
    if len(out) != body_length:
        raise CorruptBatchError(
            f"{where}: body decompresses to {len(out)} bytes but body_length says {body_length}"
        )
    return out


# ---------------------------------------------------------------------------------------------
# Per-record headers.

def _put_uvarint(out: bytearray, n: int) -> None:
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


# The uvarints below 128 (every header count, and the lengths of most keys and values), as bytes.
_SMALL_UVARINTS = [bytes((i,)) for i in range(128)]
# Encoded keys (uvarint length + UTF-8), by key: a producer uses few distinct header names.
_KEY_CACHE: dict[str, bytes] = {}
_KEY_CACHE_MAX = 1024


def _uvarint_bytes(n: int) -> bytes:
    if n < 128:
        return _SMALL_UVARINTS[n]
    out = bytearray()
    _put_uvarint(out, n)
    return bytes(out)


def _encode_record_headers(hs: Iterable[tuple[str, bytes | None]]) -> bytes:
    items = list(hs)
    if not items:
        return b""
    parts = [_uvarint_bytes(len(items))]
    for k, v in items:
        kb = _KEY_CACHE.get(k)
        if kb is None:
            raw = k.encode("utf-8")
            kb = _uvarint_bytes(len(raw)) + raw
            if len(_KEY_CACHE) < _KEY_CACHE_MAX:
                _KEY_CACHE[k] = kb
        parts.append(kb)
        if v is None:
            parts.append(b"\x00")
        else:
            parts.append(_uvarint_bytes(len(v) + 1))
            parts.append(v)
    return b"".join(parts)


def _get_uvarint(data: bytes, i: int, end: int) -> tuple[int, int]:
    n = 0
    shift = 0
    while True:
        if i >= end:
            raise CorruptBatchError("record headers: varint runs past the end of its entry")
        b = data[i]
        i += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, i
        shift += 7
        if shift >= 35:
            raise CorruptBatchError("record headers: varint longer than 5 bytes")


def _decode_record_headers(data: bytes, i: int, end: int) -> tuple[tuple[str, bytes | None], ...]:
    if i == end:
        return ()
    count, i = _get_uvarint(data, i, end)
    if count == 0:
        raise CorruptBatchError("record headers: header_count 0 in a non-empty entry")
    out = []
    for _ in range(count):
        klen, i = _get_uvarint(data, i, end)
        if i + klen > end:
            raise CorruptBatchError(f"record headers: key_length {klen} runs past the end of its entry")
        try:
            key = data[i : i + klen].decode("utf-8")
        except UnicodeDecodeError as e:
            raise CorruptBatchError(f"record headers: key is not UTF-8: {e}") from e
        i += klen
        vlen, i = _get_uvarint(data, i, end)
        if vlen == 0:
            value = None
        else:
            vlen -= 1
            if i + vlen > end:
                raise CorruptBatchError(
                    f"record headers: value_length {vlen} runs past the end of its entry"
                )
            value = data[i : i + vlen]
            i += vlen
        out.append((key, value))
    if i != end:
        raise CorruptBatchError(f"record headers: {end - i} unused bytes at the end of an entry")
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# Encode.

def _int32_bytes(values: Iterable[int], count: int) -> bytes:
    # one C call for the whole array, little-endian whatever the host; faster than array('i')
    return struct.pack(f"<{count}i", *values)


def _offsets(lengths: list[int]) -> bytes:
    return _int32_bytes(accumulate(lengths, initial=0), len(lengths) + 1)


def _validity_bitmap(present: bytes, n: int) -> bytes:
    """Pack one 0/1 byte per record into an LSB-first bitmap of ceil(n/8) bytes."""
    # '0'/'1' text reversed so record 0 is the lowest bit; int() parses base 2 in linear time
    bits = present.translate(_BIT_CHARS)[::-1]
    return int(bits or b"0", 2).to_bytes((n + 7) // 8, "little")


_BIT_CHARS = bytes.maketrans(b"\x00\x01", b"01")


def encode(
    values: Sequence[bytes],
    keys: Sequence[bytes | None] | None = None,
    headers: Sequence[Sequence[tuple[str, bytes | None]] | None] | None = None,
    timestamps: Sequence[int] | None = None,
    *,
    timestamp_ms: int | None = None,
    codec: Codec = Codec.NONE,
    compression_level: int | None = None,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    base_offset: int = 0,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
    encoded_headers: Sequence[bytes] | None = None,
) -> bytes:
    """Build one batch from parallel lists (values required, the rest optional).

    encoded_headers: instead of `headers`, each record's headers already encoded as the body
    holds them (as `headers` would be encoded; b"" for none), from a writer that encodes
    its own headers faster (dmq.proto.event_headers.encode_events_headers).

    Timestamps: `timestamps` per record, else every record gets `timestamp_ms`, else now.
    compression_level: the codec's own scale (zstd 1-22, default 3; lz4 frame 0-16, default 0).
    The per-record work is done in C (map(len), accumulate, one struct.pack per array, one join),
    not in a Python loop, except for headers and for key lists that mix None and bytes.
    """
    n = len(values)
    if n == 0:
        raise RecordsError("encode: values is empty; a batch holds at least one record")
    if max_batch_bytes > _INT32_MAX:
        raise RecordsError(f"max_batch_bytes {max_batch_bytes} above {_INT32_MAX}: offsets are int32")
    try:
        codec = Codec(codec)
    except ValueError as e:
        raise RecordsError(f"unknown codec {codec!r} (known: {[c.name for c in Codec]})") from e

    try:
        value_lengths = list(map(len, values))
    except TypeError as e:
        raise RecordsError(f"encode: values must be bytes-like (a value is never None): {e}") from e
    value_total = sum(value_lengths)

    # keys: three cases - no keys at all, all keys present, some keys None
    key_lengths = None
    key_parts: Sequence[bytes] = ()
    if keys is None:
        validity = bytes((n + 7) // 8)
    else:
        if len(keys) != n:
            raise RecordsError(f"encode: {len(keys)} keys for {n} values")
        try:
            key_lengths = list(map(len, keys))  # type: ignore[arg-type]
            key_parts = keys  # type: ignore[assignment]
            validity = _all_present(n)
        except TypeError:  # len(None): some keys are null
            present = bytes(map(_is_not_none, keys))
            key_parts = list(compress(keys, present))  # type: ignore[arg-type]
            key_lengths = [0 if k is None else len(k) for k in keys]
            validity = _validity_bitmap(present, n)
    key_total = 0 if key_lengths is None else sum(key_lengths)

    # headers: only encoded (and flagged) when some record has one
    header_lengths = None
    header_parts: list[bytes] = []
    header_total = 0
    if headers is not None:
        if encoded_headers is not None:
            raise RecordsError("encode: pass headers or encoded_headers, not both")
        if len(headers) != n:
            raise RecordsError(f"encode: {len(headers)} header lists for {n} values")
        if any(headers):
            header_parts = [_encode_record_headers(h) if h else b"" for h in headers]
            header_lengths = list(map(len, header_parts))
            header_total = sum(header_lengths)
    elif encoded_headers is not None:
        if len(encoded_headers) != n:
            raise RecordsError(f"encode: {len(encoded_headers)} encoded header blocks for {n} values")
        if any(encoded_headers):
            header_parts = list(encoded_headers)
            header_lengths = list(map(len, header_parts))
            header_total = sum(header_lengths)

    if value_total + key_total + header_total > max_record_bytes:
        _check_record_sizes(max_record_bytes, value_lengths, key_lengths, header_lengths)
    body_length = _min_body_length(n, header_lengths is not None) + key_total + value_total + header_total
    if body_length > max_batch_bytes:
        raise BatchTooLargeError(
            f"encode: {n} records make a body of {body_length} bytes, above max_batch_bytes "
            f"{max_batch_bytes}; send fewer records per batch"
        )

    if timestamps is None:
        first_ts = max_ts = time.time_ns() // 1_000_000 if timestamp_ms is None else timestamp_ms
        deltas = bytes(4 * n)
    else:
        if len(timestamps) != n:
            raise RecordsError(f"encode: {len(timestamps)} timestamps for {n} values")
        first_ts = timestamps[0]
        max_ts = max(timestamps)
        lo = min(timestamps)
        if max_ts - first_ts > _INT32_MAX or lo - first_ts < _INT32_MIN:
            raise RecordsError(
                "encode: timestamps must lie within 2**31 ms (~24 days) of the first record's "
                f"({first_ts}); got min {lo}, max {max_ts}"
            )
        try:
            deltas = _int32_bytes(map(sub, timestamps, repeat(first_ts, n)), n)
        except (struct.error, TypeError) as e:
            raise RecordsError(f"encode: timestamps must be int milliseconds: {e}") from e

    # the sections in body order (see the module comment)
    key_offsets = bytes(4 * (n + 1)) if key_lengths is None else _offsets(key_lengths)
    parts = [deltas, key_offsets, _offsets(value_lengths)]
    attributes = int(codec)
    header_blob = b""
    if header_lengths is not None:
        attributes |= ATTR_HAS_HEADERS
        parts.append(_offsets(header_lengths))
        header_blob = b"".join(header_parts)
        # A C substring search, not a loop over the records: a value that happens to hold the
        # encoded name only makes the broker decode this batch and find no id (harmless).
        for name, bit in _RESERVED_BITS.items():
            if _RESERVED_KEYS[name] in header_blob:
                attributes |= bit
    parts.append(validity)
    parts += key_parts
    parts += values
    parts.append(header_blob)
    try:
        body = b"".join(parts)
    except TypeError as e:
        raise RecordsError(f"encode: keys, values and header values must be bytes-like: {e}") from e
    if len(body) != body_length:
        raise RecordsError("encode: keys and values must be byte buffers (itemsize 1)")
    if codec != Codec.NONE:
        body = _compress(codec, body, compression_level)
    total = HEADER_SIZE + len(body)
    if total > max_batch_bytes:
        raise BatchTooLargeError(
            f"encode: batch is {total} bytes, above max_batch_bytes {max_batch_bytes}"
        )
    try:
        tail = _TAIL.pack(
            attributes, n, first_ts, max_ts, producer_id, producer_epoch, base_sequence, body_length
        )
        crc = crc32(body, crc32(tail))
        prefix = _PREFIX.pack(base_offset, total - 12, MAGIC, crc)
    except struct.error as e:
        raise RecordsError(f"encode: a header field is out of range: {e}") from e
    return b"".join((prefix, tail, body))


def _check_record_sizes(
    limit: int, value_lengths: list[int], key_lengths: list[int] | None, header_lengths: list[int] | None
) -> None:
    columns = [c for c in (value_lengths, key_lengths, header_lengths) if c is not None]
    # the sum of the column maxima bounds every record: usually enough to skip the exact pass
    if sum(map(max, columns)) <= limit:
        return
    sizes = columns[0]
    for c in columns[1:]:
        sizes = list(map(add, sizes, c))
    biggest = max(sizes)
    if biggest > limit:
        raise RecordTooLargeError(
            f"record {sizes.index(biggest)}: key + value + headers is {biggest} bytes, above "
            f"max_record_bytes {limit}"
        )


def _is_not_none(x: object) -> bool:
    return x is not None


def _all_present(n: int) -> bytes:
    full, rest = divmod(n, 8)
    return b"\xff" * full + (bytes(((1 << rest) - 1,)) if rest else b"")


# ---------------------------------------------------------------------------------------------
# Decode.

def _int32_view(mv: memoryview) -> memoryview:
    """A memoryview of int32 items over little-endian bytes (copied only on big-endian hosts)."""
    if _LITTLE:
        return mv.cast("i")
    a = array("i", bytes(mv))
    a.byteswap()
    return memoryview(a)


# A batch's record columns: keys, values, timestamps, headers (RecordBatch.columns()).
Columns = tuple[
    list[bytes | None], list[bytes], list[int], list[tuple[tuple[str, bytes | None], ...]]
]


class RecordBatch:
    """A decoded batch: the header plus views of the body arrays; records are built on iteration.

    The views point into the buffer given to decode() (uncompressed batches) or into the
    decompressed body, so pyarrow can wrap them without copying values.
    """

    __slots__ = (
        "header",
        "timestamp_deltas",
        "key_offsets",
        "value_offsets",
        "header_offsets",
        "key_validity",
        "key_blob",
        "value_blob",
        "header_blob",
        "_checked",
        "_where",
        "_columns",
    )

    def __init__(self, header: BatchHeader, body: memoryview, pos: int = 0) -> None:
        n = header.record_count
        has_headers = header.has_headers
        where = f"batch at position {pos}"
        if len(body) != header.body_length:
            raise CorruptBatchError(f"{where}: body is {len(body)} bytes, body_length says {header.body_length}")
        self.header = header
        i = 4 * n
        self.timestamp_deltas = _int32_view(body[:i])
        self.key_offsets = _int32_view(body[i : i + 4 * (n + 1)])
        i += 4 * (n + 1)
        self.value_offsets = _int32_view(body[i : i + 4 * (n + 1)])
        i += 4 * (n + 1)
        if has_headers:
            self.header_offsets: memoryview | None = _int32_view(body[i : i + 4 * (n + 1)])
            i += 4 * (n + 1)
        else:
            self.header_offsets = None
        self.key_validity = body[i : i + (n + 7) // 8]
        i += (n + 7) // 8
        blobs = []
        for name, offs in (
            ("key_offsets", self.key_offsets),
            ("value_offsets", self.value_offsets),
            ("header_offsets", self.header_offsets),
        ):
            if offs is None:
                blobs.append(body[i:i])
                continue
            first, last = offs[0], offs[n]
            if first != 0:
                raise CorruptBatchError(f"{where}: {name}[0] is {first}, must be 0")
            if last < 0 or i + last > len(body):
                raise CorruptBatchError(
                    f"{where}: {name}[{n}] = {last} runs past the body end ({len(body) - i} bytes left)"
                )
            blobs.append(body[i : i + last])
            i += last
        if i != len(body):
            raise CorruptBatchError(
                f"{where}: arrays and blobs take {i} bytes but body_length is {len(body)}"
            )
        self.key_blob, self.value_blob, self.header_blob = blobs
        self._checked: set[str] = set()  # offset arrays already proven monotonic
        self._where = where
        self._columns: Columns | None = None

    def __len__(self) -> int:
        return self.header.record_count

    def __repr__(self) -> str:
        h = self.header
        return (
            f"RecordBatch(offsets={h.base_offset}..{h.last_offset}, records={h.record_count}, "
            f"codec={h.codec.name}, body_length={h.body_length})"
        )

    @property
    def base_offset(self) -> int:
        return self.header.base_offset

    @property
    def last_offset(self) -> int:
        return self.header.last_offset

    # Column iterators. Each converts its offsets to a list once and cuts the items out of one
    # bytes copy of the blob with a plain `blob[a:b]` per record: the interpreter's slice
    # expression reuses one cached slice object, where map(blob.__getitem__, starmap(slice, ...))
    # allocated a garbage-collected slice per record and took 2.4x as long (1,000 values of ~100
    # bytes: 110 us against 270 us, most of it in the collections those allocations set off).

    def _offsets(self, name: str) -> list[int]:
        offs: list[int] = getattr(self, name).tolist()
        self._check_monotonic(name, offs)
        return offs

    def _check_monotonic(self, name: str, offs: list[int]) -> None:
        if name not in self._checked:
            # sorted() of already-sorted input is one C pass; both ends were checked in __init__
            if offs != sorted(offs):
                raise CorruptBatchError(f"{self._where}: {name} are not monotonic (non-decreasing)")
            self._checked.add(name)

    def _iter_timestamps(self) -> Iterator[int]:
        h = self.header
        n = h.record_count
        if h.log_append_time:
            return repeat(h.max_timestamp, n)
        first = h.first_timestamp
        if not int.from_bytes(self.timestamp_deltas, "little"):  # common: one timestamp per batch
            deltas = None
            low = high = first
        else:
            deltas = self.timestamp_deltas.tolist()
            low, high = first + min(deltas), first + max(deltas)
        # max_timestamp is by definition the largest; this also keeps every timestamp in int64
        if high != h.max_timestamp or low < _INT64_MIN:
            raise CorruptBatchError(
                f"{self._where}: record timestamps span {low}..{high} but max_timestamp is "
                f"{h.max_timestamp}"
            )
        return repeat(first, n) if deltas is None else map(add, repeat(first), deltas)

    def _iter_values(self) -> Iterator[bytes]:
        vo = self.value_offsets
        n = len(vo) - 1
        size = vo[1] if n > 1 else 0
        if size > 0 and vo[n] == size * n and vo.tobytes() == _same_size_offsets(size, n):
            # Values of one size (fixed-size messages), their offsets proven monotonic by that
            # comparison (one memcmp, no int per record): one C call cuts them all from the blob
            # as it is (1,000 of 100 bytes: ~10 us, not ~100 us).
            return iter(_same_size_values(size, n).unpack(self.value_blob))
        blob = bytes(self.value_blob)
        offs: list[int] = vo.tolist()
        self._check_monotonic("value_offsets", offs)
        return (blob[a:b] for a, b in pairwise(offs))

    def _iter_keys(self) -> Iterator[bytes | None]:
        n = self.header.record_count
        bits = int.from_bytes(self.key_validity, "little") & ((1 << n) - 1)
        if bits == 0:
            return repeat(None, n)
        blob = bytes(self.key_blob)
        keys = (blob[a:b] for a, b in pairwise(self._offsets("key_offsets")))
        if bits == (1 << n) - 1:
            return keys
        present = format(bits, "b").zfill(n)[::-1]  # character i is record i's validity bit
        return (k if p == "1" else None for k, p in zip(keys, present))

    def _iter_headers(self) -> Iterator[tuple[tuple[str, bytes | None], ...]]:
        if self.header_offsets is None:
            return repeat((), self.header.record_count)
        blob = bytes(self.header_blob)
        offs = self._offsets("header_offsets")
        return (_decode_record_headers(blob, a, b) for a, b in pairwise(offs))

    def timestamps(self) -> list[int]:
        return list(self._iter_timestamps())

    def keys(self) -> list[bytes | None]:
        return list(self._iter_keys())

    def values(self) -> list[bytes]:
        return list(self._iter_values())

    def headers(self) -> list[tuple[tuple[str, bytes | None], ...]]:
        return list(self._iter_headers())

    def columns(self) -> Columns:
        """(keys, values, timestamps, headers) of every record, built once and kept: readers
        that hand a batch out in several slices (max_records below the batch's count) cut each
        slice from these instead of decoding the batch again."""
        cols = self._columns
        if cols is None:
            cols = self._columns = (self.keys(), self.values(), self.timestamps(), self.headers())
        return cols

    def __iter__(self) -> Iterator[Record]:
        h = self.header
        rows = zip(
            range(h.base_offset, h.base_offset + h.record_count),
            self._iter_timestamps(),
            self._iter_keys(),
            self._iter_values(),
            self._iter_headers(),
        )
        # tuple.__new__ builds each NamedTuple in C; Record(...) would run a Python __new__
        return map(tuple.__new__, repeat(Record), rows)

    def record_at(self, offset: int) -> Record:
        """The one record at `offset`, built without building the others (readers that pick a few
        records out of large batches: the event store's index reads)."""
        h = self.header
        i = offset - h.base_offset
        if not 0 <= i < h.record_count:
            raise IndexError(f"offset {offset} is not in {self!r}")
        vo = self.value_offsets
        a, b = vo[i], vo[i + 1]
        if not 0 <= a <= b <= len(self.value_blob):
            raise CorruptBatchError(f"{self._where}: value_offsets[{i}..{i + 1}] = {a}..{b} are out of order")
        key: bytes | None = None
        if self.key_validity[i >> 3] >> (i & 7) & 1:
            ka, kb = self.key_offsets[i], self.key_offsets[i + 1]
            if not 0 <= ka <= kb <= len(self.key_blob):
                raise CorruptBatchError(f"{self._where}: key_offsets[{i}..{i + 1}] = {ka}..{kb} are out of order")
            key = bytes(self.key_blob[ka:kb])
        headers: tuple[tuple[str, bytes | None], ...] = ()
        ho = self.header_offsets
        if ho is not None:
            ha, hb = ho[i], ho[i + 1]
            if not 0 <= ha <= hb <= len(self.header_blob):
                raise CorruptBatchError(f"{self._where}: header_offsets[{i}..{i + 1}] = {ha}..{hb} are out of order")
            headers = _decode_record_headers(bytes(self.header_blob[ha:hb]), 0, hb - ha)
        if h.log_append_time:
            ts = h.max_timestamp
        else:
            ts = h.first_timestamp + self.timestamp_deltas[i]
        return Record(offset, ts, key, bytes(self.value_blob[a:b]), headers)

    def iter_from(self, offset: int) -> Iterator[Record]:
        """Records with offset >= `offset` (a fetch returns the whole batch holding `offset`)."""
        return islice(iter(self), max(0, offset - self.header.base_offset), None)

    def to_arrow(self) -> "pyarrow.RecordBatch":
        """Columns offset (int64), timestamp (int64 ms), key (binary, nullable), value (binary).

        Keys and values are wrapped without copying; headers are left out (iterate for them).
        """
        try:
            import pyarrow as pa
        except ImportError as e:
            raise RecordsError("to_arrow() needs the 'pyarrow' package") from e
        h = self.header
        n = h.record_count
        # Arrow trusts offsets blindly (out-of-range reads, not exceptions): check them first
        self._offsets("key_offsets")
        self._offsets("value_offsets")
        mask = (1 << n) - 1
        key_nulls = n - (int.from_bytes(self.key_validity, "little") & mask).bit_count()
        keys = pa.Array.from_buffers(
            pa.binary(),
            n,
            [pa.py_buffer(self.key_validity), _arrow_offsets(pa, self.key_offsets), pa.py_buffer(self.key_blob)],
            null_count=key_nulls,
        )
        values = pa.Array.from_buffers(
            pa.binary(),
            n,
            [None, _arrow_offsets(pa, self.value_offsets), pa.py_buffer(self.value_blob)],
            null_count=0,
        )
        offsets = pa.array(range(h.base_offset, h.base_offset + n), type=pa.int64())
        timestamps = pa.array(self.timestamps(), type=pa.int64())
        return pa.RecordBatch.from_arrays(
            [offsets, timestamps, keys, values], names=["offset", "timestamp", "key", "value"]
        )


_SAME_SIZE_STRUCTS: dict[tuple[int, int], struct.Struct] = {}
_SAME_SIZE_STRUCTS_MAX = 64


def _same_size_values(size: int, count: int) -> struct.Struct:
    """A Struct that cuts `count` values of `size` bytes out of a value blob ("100s100s...")."""
    s = _SAME_SIZE_STRUCTS.get((size, count))
    if s is None:
        s = struct.Struct(f"{size}s" * count)
        if len(_SAME_SIZE_STRUCTS) < _SAME_SIZE_STRUCTS_MAX:
            _SAME_SIZE_STRUCTS[(size, count)] = s
    return s


_SAME_SIZE_OFFSETS: dict[tuple[int, int], bytes] = {}


def _same_size_offsets(size: int, count: int) -> bytes:
    """The value offsets of `count` values of `size` bytes (0, size, ..., size * count) as a
    RecordBatch's value_offsets view holds them (native int32s), to compare with one memcmp."""
    b = _SAME_SIZE_OFFSETS.get((size, count))
    if b is None:
        b = array("i", range(0, size * count + 1, size)).tobytes()
        if len(_SAME_SIZE_OFFSETS) < _SAME_SIZE_STRUCTS_MAX:
            _SAME_SIZE_OFFSETS[(size, count)] = b
    return b


def _arrow_offsets(pa: Any, offs: memoryview) -> Any:
    buf = pa.py_buffer(offs)
    if buf.address % 4:
        # the body follows a 57-byte header, so offsets are often unaligned; Arrow requires
        # aligned int32 offsets, and copying them costs 4 bytes per record (values stay zero-copy)
        buf = pa.py_buffer(bytes(offs))
    return buf


# ---------------------------------------------------------------------------------------------
# Slice: some records of a decoded batch as a batch of their own.

# int.from_bytes(b"\x01\x00\x00\x00" * m, "little") by m: subtracting base * this from m int32
# lanes read as one integer subtracts base from every lane at once (see _rebased).
_LANE_ONES: dict[int, int] = {}
_LANE_ONES_MAX = 64


def _le_int32s(view: memoryview) -> bytes:
    """Little-endian bytes of an int32 view (as the body stores them)."""
    if _LITTLE:
        return view.tobytes()
    return struct.pack(f"<{len(view)}i", *view.tolist())


def _rebased(offs: memoryview, lo: int, hi: int, blob_len: int, name: str, where: str) -> tuple[bytes, int, int]:
    """offs[lo..hi] minus offs[lo], as body bytes, and the blob range (offs[lo], offs[hi]) they
    cover. Checked first (non-decreasing, inside the blob), so a sliced batch never carries a
    corrupt array under a fresh CRC."""
    part = offs[lo : hi + 1]
    values = part.tolist()
    first, last = values[0], values[-1]
    if first < 0 or last > blob_len or values != sorted(values):
        raise CorruptBatchError(f"{where}: {name}[{lo}..{hi}] are not non-decreasing within the blob")
    m = len(values)
    if not first:
        return _le_int32s(part), first, last
    if not _LITTLE:
        return struct.pack(f"<{m}i", *map(sub, values, repeat(first, m))), first, last
    # Every lane is >= first (checked), so no lane borrows from the next one: one integer
    # subtraction over the little-endian lanes rebases them all, in C.
    ones = _LANE_ONES.get(m)
    if ones is None:
        ones = int.from_bytes(b"\x01\x00\x00\x00" * m, "little")
        if len(_LANE_ONES) < _LANE_ONES_MAX:
            _LANE_ONES[m] = ones
    return (int.from_bytes(part, "little") - first * ones).to_bytes(4 * m, "little"), first, last


def slice_batch(batch: RecordBatch, start_offset: int, stop_offset: int) -> bytes:
    """The records of `batch` with offsets in [start_offset, stop_offset) as one new batch: keys,
    values, headers and timestamps as they are, uncompressed, no producer id (a reader's copy,
    never appended). Built from byte ranges of the body (each array cut and rebased in C), so no
    Python code runs per record: a queue pop of 1,000 records out of a producer's 10,000-record
    batch costs tens of microseconds, not the milliseconds of decoding the columns and encoding.
    The range must hold at least one record of the batch; CorruptBatchError when the arrays it
    covers are malformed."""
    h = batch.header
    n = h.record_count
    lo = max(start_offset - h.base_offset, 0)
    hi = min(stop_offset - h.base_offset, n)
    if lo >= hi:
        raise RecordsError(
            f"slice_batch: offsets [{start_offset}, {stop_offset}) hold no record of batch "
            f"{h.base_offset}..{h.last_offset}"
        )
    m = hi - lo
    where = batch._where
    # timestamps: rebased on the slice's first record, as encode() writes them
    deltas = batch.timestamp_deltas[lo:hi]
    first_ts = max_ts = h.first_timestamp
    if h.log_append_time:
        max_ts = h.max_timestamp  # every record's timestamp
        delta_bytes = _le_int32s(deltas)
    elif not int.from_bytes(deltas, "little"):  # common: one timestamp for the whole batch
        delta_bytes = bytes(4 * m)
    else:
        ds = deltas.tolist()
        d0, dmax = ds[0], max(ds)
        if dmax - d0 <= _INT32_MAX and min(ds) - d0 >= _INT32_MIN:
            first_ts, max_ts = h.first_timestamp + d0, h.first_timestamp + dmax
            delta_bytes = struct.pack(f"<{m}i", *map(sub, ds, repeat(d0, m)))
        else:  # a span of over 2**31 ms: kept relative to the batch's first timestamp
            max_ts = h.first_timestamp + dmax
            delta_bytes = _le_int32s(deltas)
    # keys: a validity bitmap cut at bit lo; a slice without keys needs no key offsets
    bits = int.from_bytes(batch.key_validity, "little") >> lo & ((1 << m) - 1)
    if bits:
        key_offsets, ka, kb = _rebased(batch.key_offsets, lo, hi, len(batch.key_blob), "key_offsets", where)
    else:
        key_offsets, ka, kb = bytes(4 * (m + 1)), 0, 0
    value_offsets, va, vb = _rebased(batch.value_offsets, lo, hi, len(batch.value_blob), "value_offsets", where)
    parts: list[bytes | memoryview] = [delta_bytes, key_offsets, value_offsets]
    header_part: memoryview | bytes = b""
    if batch.header_offsets is not None:
        header_offsets, ha, hb = _rebased(
            batch.header_offsets, lo, hi, len(batch.header_blob), "header_offsets", where
        )
        parts.append(header_offsets)
        header_part = batch.header_blob[ha:hb]
    parts += (
        bits.to_bytes((m + 7) // 8, "little"), batch.key_blob[ka:kb], batch.value_blob[va:vb], header_part
    )
    body = b"".join(parts)
    if max_ts > h.max_timestamp:  # the batch's own check (_iter_timestamps), for these records
        raise CorruptBatchError(f"{where}: record timestamps reach {max_ts}, above max_timestamp {h.max_timestamp}")
    try:
        tail = _TAIL.pack(h.attributes & ~ATTR_CODEC_MASK, m, first_ts, max_ts, -1, -1, -1, len(body))
    except struct.error as e:
        raise CorruptBatchError(f"{where}: a timestamp of offsets {start_offset}.. does not fit int64: {e}") from e
    crc = crc32(body, crc32(tail))
    return b"".join((_PREFIX.pack(h.base_offset + lo, HEADER_SIZE + len(body) - 12, MAGIC, crc), tail, body))


def header_values(batch: RecordBatch, name: str) -> list[bytes | None]:
    """Per record of `batch`, the value of its header `name` (the last one when repeated; b"" for a
    None value), or None when it has none. Raises CorruptBatchError for a malformed header entry.

    The broker runs this on every batch flagged with ids, so it walks each header entry's key
    lengths and compares key bytes, without building the header tuples (decode's headers() would
    cost several times more per record)."""
    n = batch.header.record_count
    if batch.header_offsets is None:
        return [None] * n
    blob = bytes(batch.header_blob)
    offs = batch._offsets("header_offsets")
    key = name.encode()
    klen_wanted = len(key)
    out: list[bytes | None] = []
    r = 0
    try:
        for r in range(n):
            i, end = offs[r], offs[r + 1]
            if i == end:
                out.append(None)
                continue
            found = -1  # position of the value's first byte
            flen = 0
            count = blob[i]
            i += 1
            if count >= 0x80:  # varints of one byte (< 128) are all a DMQ client writes for ids
                count, i = _get_uvarint(blob, i - 1, end)
            for _ in range(count):
                klen = blob[i]
                i += 1
                if klen >= 0x80:
                    klen, i = _get_uvarint(blob, i - 1, end)
                k_at = i
                i += klen
                vlen = blob[i]
                i += 1
                if vlen >= 0x80:
                    vlen, i = _get_uvarint(blob, i - 1, end)
                if klen == klen_wanted and blob[k_at : k_at + klen] == key:
                    found, flen = i, max(vlen - 1, 0)
                if vlen:
                    i += vlen - 1
            if i != end:
                raise CorruptBatchError(f"record {r}: its headers take {i - offs[r]} bytes, its entry {end - offs[r]}")
            out.append(None if found < 0 else blob[found : found + flen])
    except IndexError:
        raise CorruptBatchError(f"record {r}: headers run past the end of the batch") from None
    return out


def record_ids(batch: RecordBatch, name: str, field: str) -> list[str | None]:
    """Per record of `batch`, the value of its reserved header `name` (TXN_HEADER or TRACE_HEADER)
    checked by check_record_id, or None. Raises InvalidRecordIdError naming the record and `field`,
    CorruptBatchError for a malformed header entry."""
    out: list[str | None] = []
    for r, value in enumerate(header_values(batch, name)):
        if value is None:
            out.append(None)
            continue
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            text = ""
        if not 0 < len(text) <= RECORD_ID_MAX_CHARS:
            check_record_id(value, f"record {r}: {field}")  # raises, naming the rule broken
        out.append(text)
    return out


def trace_ids(batch: RecordBatch) -> list[str | None]:
    """Per record of `batch`, its trace id: the trace-id of its ``traceparent`` header, else (data
    written before traceparent, or by hand) its ``dmq.trace`` header, else None. A traceparent
    the W3C spec says to ignore is ignored (the record is stored, not indexed by it); a bad
    ``dmq.trace`` raises InvalidRecordIdError as it always did (the broker refuses the batch).

    The old header is looked for only when the batch's header bytes hold its name (one C
    substring search), so batches of current clients are walked once."""
    out = [None if v is None else traceparent_trace_id(v) for v in header_values(batch, TRACEPARENT_HEADER)]
    if batch.header_offsets is not None and _RESERVED_KEYS[TRACE_HEADER] in bytes(batch.header_blob):
        legacy = record_ids(batch, TRACE_HEADER, "trace_id")
        out = [t if t is not None else old for t, old in zip(out, legacy)]
    return out


def decode(
    buf: Any, pos: int = 0, *, verify_crc: bool = True, max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
) -> RecordBatch:
    """Decode the batch at `pos` lazily: header, CRC, decompression and the body layout are checked
    here; records are only built when iterated (offset monotonicity is checked on first use).

    An uncompressed batch keeps memoryviews into `buf` (no copy): a bytearray cannot be resized
    while the RecordBatch lives. Pass the max_batch_bytes the batches were produced under when it
    is above the 16 MiB default.
    """
    mv = _as_bytes_view(buf)
    if verify_crc:
        h = validate_batch(mv, pos, max_batch_bytes=max_batch_bytes)
    else:
        h = read_header(mv, pos, max_batch_bytes=max_batch_bytes)
        _check_complete(h, len(mv) - pos, pos)
    stored = mv[pos + HEADER_SIZE : pos + h.total_size]
    codec = h.attributes & ATTR_CODEC_MASK
    body = stored if codec == Codec.NONE else memoryview(_decompress(codec, stored, h.body_length, pos))
    return RecordBatch(h, body, pos)


def decode_batches(
    buf: Any, *, verify_crc: bool = True, max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
) -> list[RecordBatch]:
    """Decode every batch of concatenated batches (a fetch response)."""
    mv = _as_bytes_view(buf)
    out = []
    pos = 0
    end = len(mv)
    while pos < end:
        batch = decode(mv, pos, verify_crc=verify_crc, max_batch_bytes=max_batch_bytes)
        out.append(batch)
        pos += batch.header.total_size
    return out
