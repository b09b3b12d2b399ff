"""An event's read answer, encoded: the fragments the event index file holds (index.py).

An event's fragment is the event as an encoded EventReadResponse with one entry in each column
(answer_fragment). Protobuf merges concatenated messages and appends their repeated fields, so the
fragments of a read's events, concatenated in position order, are the encoded columnar answer of
that read: the broker builds no column and turns no row into Python objects.

Why a copy of each event beside the index: a read is then slices of one memory map (the index
file's), no record of the log read or parsed.

answer_fragments() writes the same bytes as answer_fragment() (protobuf's own serializer, field
by field in number order) by hand, a batch at a time: building a message per event cost ~3 us an
event on the append path. A fragment, in EventReadResponse's field numbers:

  0x1a len varint(position)       positions (3), packed int64, one value
  0x22 len type                   types (4), UTF-8
  0x2a len tags                   tags (5), joined by "\\n", UTF-8 (present even when empty)
  0x32 len payload                payloads (6)
  0x3a len metadata               metadata (7) (present even when empty)
  0x42 len varint(time_ms)        append_times_ms (8), packed int64, one value

(`len` a varint; a negative int64 is its two's complement, ten bytes, as protobuf writes it.)
"""

from __future__ import annotations

from collections.abc import Sequence

from dmq.proto import dmq_pb2 as pb
from dmq.proto.event_headers import ONE_BYTE as _ONE_BYTE
from dmq.proto.event_headers import uvarint

__all__ = ["answer_fragment", "answer_fragments"]

# positions' field tag and length, by the length of the position's varint (at most 10 bytes)
_POSITION_PREFIX = [b"\x1a" + bytes((n,)) for n in range(11)]


def _varint(n: int) -> bytes:
    """An int64 field's varint (a negative one as its two's complement, ten bytes)."""
    if 0 <= n < 0x80:
        return _ONE_BYTE[n]
    return uvarint(n + (1 << 64) if n < 0 else n)


def answer_fragment(position: int, type_: str, tags: str, payload: bytes, metadata: bytes, time_ms: int) -> bytes:
    """One event as an encoded EventReadResponse with one entry in each column (tags joined by "\\n")."""
    return pb.EventReadResponse(positions=(position,), types=(type_,), tags=(tags,), payloads=(payload,),
                                metadata=(metadata,), append_times_ms=(time_ms,)).SerializeToString()


def answer_fragments(positions: Sequence[int], types: Sequence[str], tags: Sequence[str],
                     payloads: Sequence[bytes], metadata: Sequence[bytes], times_ms: Sequence[int]) -> list[bytes]:
    """answer_fragment() of each event (parallel columns), the same bytes, written by hand (see
    the module docstring). The one-byte varints (lengths under 128) and the positions under 2**21
    are written inline: a function call per varint was a third of the time."""
    type_fields: dict[str, bytes] = {}  # a batch has few types: each encoded once
    last_ms, time_field = None, b""  # and usually one time
    out = []
    varint, one_byte, pos_prefix = _varint, _ONE_BYTE, _POSITION_PREFIX
    for p, t, joined, payload, meta, ms in zip(positions, types, tags, payloads, metadata, times_ms, strict=True):
        type_field = type_fields.get(t)
        if type_field is None:
            raw = t.encode()
            type_field = type_fields[t] = b"\x22" + varint(len(raw)) + raw
        if ms != last_ms:
            v = varint(ms)
            last_ms, time_field = ms, b"\x42" + one_byte[len(v)] + v
        if 0x4000 <= p < 0x200000:
            pv = bytes((p & 0x7F | 0x80, p >> 7 & 0x7F | 0x80, p >> 14))
        elif 0x80 <= p < 0x4000:
            pv = bytes((p & 0x7F | 0x80, p >> 7))
        else:
            pv = varint(p)
        jb = joined.encode()
        n, m, k = len(jb), len(payload), len(meta)
        out.append(b"".join((pos_prefix[len(pv)], pv, type_field,
                             b"\x2a", one_byte[n] if n < 0x80 else varint(n), jb,
                             b"\x32", one_byte[m] if m < 0x80 else varint(m), payload,
                             b"\x3a", one_byte[k] if k < 0x80 else varint(k), meta, time_field)))
    return out
