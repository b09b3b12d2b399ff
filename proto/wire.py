"""Messages framed by hand where protobuf would copy a large bytes field more than once.

Setting a multi-megabyte `bytes` field copies it into the message, and serialising copies it
again (and building a parent from child messages once more); framing the small fields with
protobuf and the large field by hand copies it once, in the final join. The output is ordinary
protobuf wire format: any protobuf parser reads it (tests check it against the generated classes).
"""

from __future__ import annotations

from collections.abc import Sequence

from dmq.proto import dmq_pb2 as pb

__all__ = ["uvarint", "frame_fetch_response"]

# (field number << 3) | wire type 2 (length-delimited)
_FETCH_RESPONSE_PARTITIONS = b"\x0a"  # FetchResponse.partitions = 1
_FETCH_PARTITION_RECORDS = b"\x3a"  # FetchPartitionResult.records = 7


def uvarint(n: int) -> bytes:
    """Protobuf base-128 varint of a non-negative int."""
    if n < 0:
        raise ValueError(f"uvarint takes n >= 0, got {n}")
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def frame_fetch_response(partitions: Sequence[tuple[pb.FetchPartitionResult, bytes]]) -> bytes:
    """A serialised dmq.v1.FetchResponse: each partition's small fields (`records` unset) are
    serialised by protobuf, its records appended as field 7; the records are copied once."""
    parts: list[bytes] = []
    for result, records in partitions:
        head = result.SerializeToString()
        if records:
            tail = _FETCH_PARTITION_RECORDS + uvarint(len(records))
            size = len(head) + len(tail) + len(records)
            parts += (_FETCH_RESPONSE_PARTITIONS, uvarint(size), head, tail, records)
        else:
            parts += (_FETCH_RESPONSE_PARTITIONS, uvarint(len(head)), head)
    return b"".join(parts)
