"""The append path's batch codecs (issue 30, (b)): each writes exactly what the per-event path it
replaced wrote, or raises exactly its error.

- names.check_id's one regex search accepts and refuses the same characters as the
  unicodedata.category() test per character it replaced (every code point);
- event_headers.check_events (a batch in a few C passes) raises the first FieldError the
  per-event checks raise, or none;
- event_headers.encode_events_headers + records.encode(encoded_headers=) is byte for byte the
  batch records.encode(headers=[event_headers(...)]) builds;
- fragments.answer_fragments is byte for byte protobuf's answer_fragment per event.
"""

from __future__ import annotations

import sys
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dmq.broker.events.fragments import answer_fragment, answer_fragments
from dmq.proto import records
from dmq.proto.event_headers import (
    EVENT_TYPE_MAX_BYTES,
    TAG_MAX_BYTES,
    TAGS_PER_EVENT_MAX,
    check_event_type,
    check_events,
    check_tags,
    encode_events_headers,
    event_headers,
)
from dmq.proto.names import CONTROL_CHARACTER_RE, FieldError, check_id


def test_the_control_character_regex_is_unicodes_cc_and_cs() -> None:
    differ = [c for c in range(sys.maxunicode + 1)
              if (unicodedata.category(chr(c)) in ("Cc", "Cs")) != bool(CONTROL_CHARACTER_RE.search(chr(c)))]
    assert differ == []


@pytest.mark.parametrize("value, message", [
    ("ok:1", None),
    ("", "must not be empty"),
    ("a\nb", "contains the control character '\\n'"),
    ("a\x85", "contains the control character '\\x85'"),
    ("a\ud800", "contains the control character '\\ud800'"),
    ("é" * 10, None),
    ("é" * 11, "is 22 bytes long, the limit is 20"),
    ("x" * 20, None),
])
def test_check_id(value: str, message: str | None) -> None:
    if message is None:
        check_id(value, "f", "tag", 20)
    else:
        with pytest.raises(FieldError, match=message.replace("\\", "\\\\").replace("(", "\\(")):
            check_id(value, "f", "tag", 20)


def _one_by_one(types: list[object], tags: list[list[object]]) -> str | None:
    try:
        for i, (t, ts) in enumerate(zip(types, tags, strict=True)):
            check_event_type(t, field=f"events[{i}].type")
            check_tags(ts, field=f"events[{i}].tags")
    except FieldError as e:
        return str(e)
    return None


_name = st.one_of(
    st.sampled_from(["t", "course:1", "student:42", "é" * 60, "x" * (EVENT_TYPE_MAX_BYTES + 1), "ü" * 200]),
    st.text(max_size=8),  # control characters, surrogates, empty strings
)
_value = st.one_of(_name, st.integers(0, 3), st.binary(max_size=3))


@settings(max_examples=400, deadline=None)
@given(types=st.lists(_value, min_size=0, max_size=5),
       tags=st.lists(st.one_of(st.lists(_value, max_size=4),
                               st.just(["k"] * TAGS_PER_EVENT_MAX), st.just(["k"] * (TAGS_PER_EVENT_MAX + 1))),
                     min_size=0, max_size=5))
def test_check_events_raises_what_the_per_event_checks_raise(types: list[object], tags: list[list[object]]) -> None:
    tags = (tags + [[]] * len(types))[: len(types)]
    expected = _one_by_one(types, tags)
    try:
        check_events(types, tags)
        got = None
    except FieldError as e:
        got = str(e)
    assert got == expected


def test_check_events_refuses_a_long_tag_by_its_bytes_not_its_characters() -> None:
    check_events(["t"], [["ü" * (TAG_MAX_BYTES // 2)]])  # 512 bytes: within the limit
    with pytest.raises(FieldError, match=r"events\[1\]\.tags\[0\]: tag is 514 bytes long"):
        check_events(["t", "t"], [[], ["ü" * (TAG_MAX_BYTES // 2 + 1)]])


_tag = st.one_of(st.sampled_from(["course:hot", "student:1", "ü" * 70, "x" * 200]), st.text(min_size=1, max_size=5))


@settings(max_examples=200, deadline=None)
@given(events=st.lists(st.tuples(st.sampled_from(["t", "StudentJoinedCourse", "é" * 100]),
                                 st.lists(_tag, max_size=70).map(tuple),
                                 st.binary(max_size=300), st.sampled_from([b"", b"m", bytes(200)])),
                       min_size=1, max_size=8))
def test_encoded_event_headers_make_the_same_batch(events: list[tuple[str, tuple[str, ...], bytes, bytes]]) -> None:
    types, tags, payloads, metadata = zip(*events, strict=True)
    with_tuples = records.encode(list(payloads), headers=[event_headers(t, g, m) for t, g, _, m in events],
                                 timestamp_ms=7)
    encoded = records.encode(list(payloads), encoded_headers=encode_events_headers(types, tags, metadata),
                             timestamp_ms=7)
    assert encoded == with_tuples


def test_encode_takes_headers_or_encoded_headers_not_both() -> None:
    with pytest.raises(records.RecordsError, match="not both"):
        records.encode([b"x"], headers=[[("k", b"v")]], encoded_headers=[b""])
    with pytest.raises(records.RecordsError, match="1 encoded header blocks for 2 values"):
        records.encode([b"x", b"y"], encoded_headers=[b""])


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.tuples(st.one_of(st.integers(1, 200), st.integers(1, 2**63 - 1),
                                         st.integers(0x3F00, 0x4100), st.integers(0x1FFF00, 0x200100),
                                         st.sampled_from([0x7F, 0x80, 0x3FFF, 0x4000, 0x1FFFFF, 0x200000])),
                               st.text(max_size=300), st.text(max_size=200), st.binary(max_size=300),
                               st.binary(max_size=200), st.integers(-(2**63), 2**63 - 1)),
                     max_size=6))
def test_hand_written_fragments_are_protobufs_bytes(rows: list[tuple[int, str, str, bytes, bytes, int]]) -> None:
    rows = [r for r in rows if not any(0xD800 <= ord(c) <= 0xDFFF for c in r[1] + r[2])]  # never stored
    columns = list(zip(*rows, strict=True)) or [(), (), (), (), (), ()]
    assert answer_fragments(*columns) == [answer_fragment(*r) for r in rows]
