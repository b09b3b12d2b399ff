"""Hand-framed messages (dmq.proto.wire) are the protobuf messages the generated classes build."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dmq.proto import dmq_pb2 as pb
from dmq.proto.wire import frame_fetch_response, uvarint

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
