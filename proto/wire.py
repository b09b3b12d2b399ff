"""Messages framed by hand where protobuf would copy a large bytes field more than once.

Setting a multi-megabyte `bytes` field copies it into the message, and serialising copies it
again (and building a parent from child messages once more); framing the small fields with
protobuf and the large field by hand copies it once, in the final join. The output is ordinary
protobuf wire format: any protobuf parser reads it (tests check it against the generated classes).

`parse_fetch_response` is the reverse for readers that move a lot of data (the Spark source): the
generated class copies the records when it parses and again when `.records` is read; the views it
returns point into the received bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc

__all__ = [
    "uvarint",
    "frame_produce_request",
    "frame_fetch_response",
    "parse_fetch_response",
    "add_broker_servicer",
    "BROKER_SERVICE",
    "PRODUCE_METHOD",
    "FETCH_METHOD",
    "FetchPartitionView",
    "WireError",
]

BROKER_SERVICE = pb.DESCRIPTOR.services_by_name["Broker"].full_name
# The methods whose one side is framed by hand: clients call them with raw (de)serializers.
PRODUCE_METHOD = f"/{BROKER_SERVICE}/Produce"
FETCH_METHOD = f"/{BROKER_SERVICE}/Fetch"

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


def frame_produce_request(topic: str, partition: int, acks: int, batch: bytes) -> bytes:
    """A serialised dmq.v1.ProduceRequest, framed by hand with the batch last.

    Building a ProduceRequest message and serialising it copies the batch twice; this copies it
    once. Field numbers from dmq.proto: 1 topic (string), 2 partition (int32), 3 batch (bytes),
    4 acks (enum); proto3 omits zero values and accepts fields in any order.
    """
    t = topic.encode()
    head = b"\x0a" + uvarint(len(t)) + t
    if partition:
        head += b"\x10" + uvarint(partition)
    if acks:
        head += b"\x20" + uvarint(acks)
    head += b"\x1a" + uvarint(len(batch))
    return b"".join((head, batch))


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


# -- parsing -------------------------------------------------------------------------------------


class WireError(ValueError):
    """Bytes that are not a well-formed message of the expected type."""


class FetchPartitionView:
    """A FetchPartitionResult whose `records` is a memoryview into the parsed buffer."""

    __slots__ = ("topic", "partition", "error", "error_message", "high_watermark", "log_start_offset", "records")

    def __init__(self) -> None:
        self.topic = ""
        self.partition = 0
        self.error = 0
        self.error_message = ""
        self.high_watermark = 0
        self.log_start_offset = 0
        self.records: memoryview = memoryview(b"")

    def __repr__(self) -> str:
        return (
            f"FetchPartitionView({self.topic}[{self.partition}], error={self.error}, "
            f"high_watermark={self.high_watermark}, log_start_offset={self.log_start_offset}, "
            f"records={len(self.records)} bytes)"
        )


_MAX_VARINT_BYTES = 10
_FIXED_SIZES = {1: 8, 5: 4}  # wire type -> bytes: fixed64, fixed32


def _varint(mv: memoryview, pos: int, end: int) -> tuple[int, int]:
    result = 0
    shift = 0
    for i in range(pos, min(end, pos + _MAX_VARINT_BYTES)):
        b = mv[i]
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result & 0xFFFFFFFFFFFFFFFF, i + 1
        shift += 7
    if end - pos < _MAX_VARINT_BYTES:
        raise WireError(f"truncated varint at byte {pos}")
    raise WireError(f"varint longer than {_MAX_VARINT_BYTES} bytes at byte {pos}")


def _int64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _int32(v: int) -> int:
    v &= 0xFFFFFFFF  # protobuf keeps the low 32 bits of an int32 varint
    return v - (1 << 32) if v >= 1 << 31 else v


def _length_delimited(mv: memoryview, pos: int, end: int) -> tuple[int, int]:
    n, pos = _varint(mv, pos, end)
    if n > end - pos:
        raise WireError(f"field of {n} bytes at byte {pos} runs past the end ({end - pos} bytes left)")
    return pos, pos + n


def _skip(mv: memoryview, pos: int, wire_type: int, end: int) -> int:
    if wire_type == 0:
        return _varint(mv, pos, end)[1]
    if wire_type == 2:
        return _length_delimited(mv, pos, end)[1]
    size = _FIXED_SIZES.get(wire_type)
    if size is None:
        raise WireError(f"unsupported wire type {wire_type} at byte {pos}")
    if size > end - pos:
        raise WireError(f"truncated fixed-width field at byte {pos}")
    return pos + size


def _text(mv: memoryview, start: int, stop: int) -> str:
    try:
        return str(mv[start:stop], "utf-8")
    except UnicodeDecodeError as e:
        raise WireError(f"string field at byte {start} is not UTF-8: {e}") from e


def _key(mv: memoryview, pos: int, end: int) -> tuple[int, int, int]:
    key, after = _varint(mv, pos, end)
    if key >> 3 == 0 or key >> 3 > 0x1FFFFFFF:
        raise WireError(f"invalid field number {key >> 3} at byte {pos}")
    return key >> 3, key & 7, after


def _parse_partition(mv: memoryview, pos: int, end: int) -> FetchPartitionView:
    view = FetchPartitionView()
    while pos < end:
        field, wire_type, pos = _key(mv, pos, end)
        if wire_type == 2 and field in (1, 4, 7):
            start, pos = _length_delimited(mv, pos, end)
            if field == 7:
                view.records = mv[start:pos]
            elif field == 1:
                view.topic = _text(mv, start, pos)
            else:
                view.error_message = _text(mv, start, pos)
        elif wire_type == 0 and 2 <= field <= 6 and field != 4:
            v, pos = _varint(mv, pos, end)
            if field == 2:
                view.partition = _int32(v)
            elif field == 3:
                view.error = _int32(v)
            elif field == 5:
                view.high_watermark = _int64(v)
            else:
                view.log_start_offset = _int64(v)
        else:  # unknown field, or a known one with another wire type: skipped, as protobuf does
            pos = _skip(mv, pos, wire_type, end)
    return view


def parse_fetch_response(buf: bytes | memoryview) -> list[FetchPartitionView]:
    """The partitions of a serialised FetchResponse, records as views into `buf` (no copy).
    Raises WireError on malformed bytes."""
    mv = memoryview(buf).cast("B")
    end = len(mv)
    pos = 0
    out: list[FetchPartitionView] = []
    while pos < end:
        field, wire_type, pos = _key(mv, pos, end)
        if field == 1 and wire_type == 2:
            start, pos = _length_delimited(mv, pos, end)
            out.append(_parse_partition(mv, start, pos))
        else:
            pos = _skip(mv, pos, wire_type, end)
    return out


class _HandlerCapture:
    """Stands in for a server to collect the generated method handlers of a servicer."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}

    def add_generic_rpc_handlers(self, handlers: object) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler[Any, Any]]) -> None:
        self.handlers = dict(handlers)


def encoded_or_serialized(answer: bytes | Any) -> bytes:
    """A response serializer for handlers that answer either a message or its encoding."""
    return answer if isinstance(answer, bytes) else answer.SerializeToString()


def add_broker_servicer(servicer: Any, server: Any) -> None:
    """Register a Broker servicer as the generated code would, except Fetch: its handler answers
    bytes framed by `frame_fetch_response`, so it is registered with no response serializer; and
    EventRead, which answers a message or, when columnar, its encoding (encoded_or_serialized)."""
    capture = _HandlerCapture()
    pb_grpc.add_BrokerServicer_to_server(servicer, capture)  # type: ignore[no-untyped-call]  # generated code, unannotated
    handlers = capture.handlers
    if "Fetch" not in handlers:
        raise RuntimeError("the generated Broker stubs register no Fetch handler: regenerate them (make proto)")
    handlers["Fetch"] = grpc.unary_unary_rpc_method_handler(
        servicer.Fetch, request_deserializer=pb.FetchRequest.FromString
    )
    # a columnar event read is answered already encoded (the stored per-event encodings joined)
    handlers["EventRead"] = grpc.unary_unary_rpc_method_handler(
        servicer.EventRead, request_deserializer=pb.EventReadRequest.FromString, response_serializer=encoded_or_serialized
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(BROKER_SERVICE, handlers),))
    server.add_registered_method_handlers(BROKER_SERVICE, handlers)
