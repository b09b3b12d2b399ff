"""Hand-framed messages (dmq.proto.wire) are the protobuf messages the generated classes build."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dmq.proto import dmq_pb2 as pb
from dmq.proto.wire import WireError, frame_fetch_response, parse_fetch_response, uvarint

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)

partition_results = st.tuples(
    st.builds(
        pb.FetchPartitionResult,
        topic=st.text(max_size=40),
        partition=INT32,
        error=st.sampled_from(list(pb.ErrorCode.values())),
        error_message=st.text(max_size=60),
        high_watermark=INT64,
        log_start_offset=INT64,
    ),
    st.binary(max_size=3000),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(partition_results, max_size=6))
def test_fetch_response_parses_back_to_what_protobuf_builds(parts):
    framed = frame_fetch_response(parts)
    expected = pb.FetchResponse()
    for result, records in parts:
        p = expected.partitions.add()
        p.CopyFrom(result)
        p.records = records
    parsed = pb.FetchResponse.FromString(framed)
    assert parsed == expected
    assert framed == expected.SerializeToString()  # the canonical bytes, field order included


def test_large_records_keep_their_length_prefix():
    data = bytes(range(256)) * 40_000  # ~10 MB: a multi-byte varint length
    framed = frame_fetch_response([(pb.FetchPartitionResult(topic="t", partition=3, high_watermark=9), data)])
    (p,) = pb.FetchResponse.FromString(framed).partitions
    assert (p.topic, p.partition, p.high_watermark, p.records) == ("t", 3, 9, data)


@given(st.integers(1, 2**63 - 1))
def test_uvarint_matches_protobuf(n):
    # ProduceResponse.base_offset is int64 field 1: tag 0x08, then the varint (zero is omitted)
    assert b"\x08" + uvarint(n) == pb.ProduceResponse(base_offset=n).SerializeToString()


def test_uvarint_refuses_negative_numbers():
    with pytest.raises(ValueError, match="n >= 0"):
        uvarint(-1)


# -- parse_fetch_response ---------------------------------------------------------------------------


def known(data: bytes) -> pb.FetchResponse:
    """What protobuf reads, unknown fields dropped (the views have no place for them)."""
    msg = pb.FetchResponse.FromString(data)
    msg.DiscardUnknownFields()
    return msg


def as_protobuf(views):  # type: ignore[no-untyped-def]
    out = pb.FetchResponse()
    for v in views:
        p = out.partitions.add()
        p.topic, p.partition, p.error, p.error_message = v.topic, v.partition, v.error, v.error_message
        p.high_watermark, p.log_start_offset, p.records = v.high_watermark, v.log_start_offset, bytes(v.records)
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(partition_results, max_size=6))
def test_parse_reads_what_protobuf_writes(parts):
    expected = pb.FetchResponse()
    for result, records in parts:
        p = expected.partitions.add()
        p.CopyFrom(result)
        p.records = records
    data = expected.SerializeToString()
    views = parse_fetch_response(data)
    assert as_protobuf(views) == expected
    for v in views:  # records are views into the input, not copies
        assert not v.records or v.records.obj is data


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=200))
def test_hostile_bytes_raise_wire_error_or_parse_as_protobuf_does(data):
    try:
        views = parse_fetch_response(data)
    except WireError:
        return
    # whatever it accepts, protobuf accepts and reads the same
    assert as_protobuf(views) == known(data)


@settings(max_examples=300, deadline=None)
@given(st.lists(partition_results, min_size=1, max_size=3), st.data())
def test_truncated_or_mutated_responses_never_escape_as_other_errors(parts, data):
    framed = bytearray(frame_fetch_response(parts))
    cut = data.draw(st.integers(0, len(framed)))
    for i in data.draw(st.lists(st.integers(0, max(len(framed) - 1, 0)), max_size=4)):
        if framed:
            framed[i] ^= data.draw(st.integers(1, 255))
    try:
        views = parse_fetch_response(bytes(framed[:cut]))
    except WireError:
        return
    assert as_protobuf(views) == known(bytes(framed[:cut]))


def test_wire_errors_say_what_is_wrong():
    with pytest.raises(WireError, match="runs past the end"):
        parse_fetch_response(b"\x0a\x05\x08")
    with pytest.raises(WireError, match="truncated varint"):
        parse_fetch_response(b"\x0a\x02\x10\x80")
    with pytest.raises(WireError, match="not UTF-8"):
        parse_fetch_response(b"\x0a\x03\x0a\x01\xff")
    with pytest.raises(WireError, match="field number 0"):
        parse_fetch_response(b"\x00\x00")


def test_clients_turn_malformed_fetch_answers_into_corrupt_record_errors():
    from dmq.client._cluster import fetch_results
    from dmq.client.errors import CorruptRecordError

    good = frame_fetch_response([(pb.FetchPartitionResult(topic="t", partition=1), b"abc")])
    (view,) = fetch_results(good, "Fetch t[1]")
    assert (view.topic, view.partition, bytes(view.records)) == ("t", 1, b"abc")
    with pytest.raises(CorruptRecordError, match=r"Fetch t\[1\]: malformed Fetch answer \(.*runs past the end"):
        fetch_results(good[:-1], "Fetch t[1]")
