"""W3C traceparent parsing (dmq.proto.tracecontext) rule by rule, and the trace id each record of a
batch is indexed by (records.trace_ids): traceparent first, the older dmq.trace header after."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dmq.proto import records
from dmq.proto.tracecontext import (
    InvalidTraceContextError,
    TraceContext,
    check_trace_id,
    check_traceparent,
    parse_traceparent,
)

TID = "4bf92f3577b34da6a3ce929d0e0e4736"
SID = "00f067aa0ba902b7"
GOOD = f"00-{TID}-{SID}-01"


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (GOOD.upper(), "lowercase hex"),
        (f"ff-{TID}-{SID}-01", "version ff is invalid"),
        (f"00-{'0' * 32}-{SID}-01", "the trace-id is all zeros"),
        (f"00-{TID}-{'0' * 16}-01", "the parent-id is all zeros"),
        (GOOD + "-", "exactly 55 characters"),
        (f"01-{TID}-{SID}-01x", "may only continue with '-'"),
        (f"00-{TID[:-1]}-{SID}-01", "lowercase hex"),
        (f"00_{TID}-{SID}-01", "lowercase hex"),
        (" " + GOOD, "lowercase hex"),
        ("", "lowercase hex"),
    ],
)
def test_values_the_spec_says_to_ignore(value: str, why: str) -> None:
    assert parse_traceparent(value) is None
    assert parse_traceparent(value.encode()) is None
    with pytest.raises(InvalidTraceContextError, match="traceparent is not a W3C traceparent") as e:
        check_traceparent(value, "traceparent")
    assert why in str(e.value)


def test_valid_values_and_later_versions() -> None:
    assert parse_traceparent(GOOD) == TraceContext(TID, SID, 1)
    assert parse_traceparent(GOOD.encode()) == TraceContext(TID, SID, 1)
    assert parse_traceparent(f"00-{TID}-{SID}-00") == TraceContext(TID, SID, 0)
    # a later version: read as version 00 from its first 55 characters, the rest is its own
    assert parse_traceparent(f"cc-{TID}-{SID}-09-more-fields") == TraceContext(TID, SID, 9)
    assert parse_traceparent(f"cc-{TID}-{SID}-01") == TraceContext(TID, SID, 1)
    assert parse_traceparent(b"\xff" * 55) is None and parse_traceparent(None) is None


def test_contexts_made_and_continued() -> None:
    ctx = TraceContext.new()
    assert parse_traceparent(ctx.traceparent) == ctx and ctx.sampled
    child = ctx.child()
    assert (child.trace_id, child.flags) == (ctx.trace_id, ctx.flags) and child.span_id != ctx.span_id
    assert TraceContext.new(TID.upper()).trace_id == TID
    assert not TraceContext.new(sampled=False).sampled
    for bad in ("", "0" * 32, TID + "0", "x" * 32, 7):
        with pytest.raises(InvalidTraceContextError, match="trace_id must be"):
            check_trace_id(bad, "trace_id")


@given(st.text(max_size=70))
def test_parsing_any_text_never_raises_and_what_parses_round_trips(text: str) -> None:
    ctx = parse_traceparent(text)
    if ctx is not None:
        assert text[2:55] == ctx.traceparent[2:]  # the fields as they came; the version may be later


def test_a_batch_is_indexed_by_traceparent_then_by_the_older_header() -> None:
    headers = [
        [("traceparent", GOOD.encode())],
        None,
        [("dmq.trace", b"ORDER-42")],
        [("traceparent", GOOD.upper().encode())],  # ignored, as the spec says
        [("dmq.trace", b"ORDER-42"), ("traceparent", GOOD.encode())],  # the traceparent wins
        [("other", b"x")],
    ]
    batch = records.decode(records.encode([b"v"] * len(headers), headers=headers))
    assert batch.header.attributes & records.ATTR_HAS_TRACE_IDS
    assert records.trace_ids(batch) == [TID, None, "ORDER-42", None, TID, None]
    untraced = records.decode(records.encode([b"v"], headers=[[("other", b"x")]]))
    assert not untraced.header.attributes & records.ATTR_HAS_TRACE_IDS
    bad_old = records.decode(records.encode([b"v"], headers=[[("dmq.trace", b"t" * 300)]]))
    with pytest.raises(records.InvalidRecordIdError, match="record 0: trace_id is 300 characters"):
        records.trace_ids(bad_old)
