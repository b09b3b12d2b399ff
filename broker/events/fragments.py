"""An event's read answer, encoded: the fragments the event index file holds (index.py).

An event's fragment is the event as an encoded EventReadResponse with one entry in each column
(answer_fragment). Protobuf merges concatenated messages and appends their repeated fields, so the
fragments of a read's events, concatenated in position order, are the encoded columnar answer of
that read: the broker builds no column and turns no row into Python objects.

Why a copy of each event beside the index: a read is then slices of one memory map (the index
file's), no record of the log read or parsed.
"""

from __future__ import annotations

from dmq.proto import dmq_pb2 as pb

__all__ = ["answer_fragment"]


def answer_fragment(position: int, type_: str, tags: str, payload: bytes, metadata: bytes, time_ms: int) -> bytes:
    """One event as an encoded EventReadResponse with one entry in each column (tags joined by "\\n")."""
    return pb.EventReadResponse(positions=(position,), types=(type_,), tags=(tags,), payloads=(payload,),
                                metadata=(metadata,), append_times_ms=(time_ms,)).SerializeToString()
