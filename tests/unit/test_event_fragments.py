"""Packed read answers (EventIndex.read_packed), built from the fragments in the index file
(broker/events/fragments.py): the packed answer equals a brute-force filter on random stores and
queries, and it is bounded in bytes. The index file itself: test_event_index_file.py."""

from __future__ import annotations

import pathlib
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dmq.broker.events.index import EventIndex
from dmq.broker.events.query import QueryItem, query_matches
from dmq.proto import dmq_pb2 as pb

TYPES = ("a", "b", "c")
TAGS = ("x:1", "x:2", "y:1", "z")


def _columns(packed: bytes) -> list[tuple[object, ...]]:
    a = pb.EventReadResponse.FromString(packed)
    return list(zip(a.positions, a.types, a.tags, a.payloads, a.metadata, a.append_times_ms, strict=True))


events_st = st.lists(
    st.tuples(st.sampled_from(TYPES), st.lists(st.sampled_from(TAGS), unique=True, max_size=3),
              st.binary(max_size=20), st.binary(max_size=4)),
    max_size=40,
)
items_st = st.lists(
    st.builds(QueryItem, st.lists(st.sampled_from(TYPES), unique=True, max_size=2).map(tuple),
              st.lists(st.sampled_from(TAGS), unique=True, max_size=2).map(tuple)),
    max_size=3,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=events_st, query=items_st, after=st.integers(0, 45), span=st.integers(0, 45),
       limit=st.integers(1, 45), batches=st.integers(1, 4))
def test_a_packed_read_equals_a_brute_force_filter(events: list[tuple[str, list[str], bytes, bytes]],
                                                    query: list[QueryItem], after: int, span: int, limit: int,
                                                    batches: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        index = EventIndex(tmp)
        rows = [(p, t, tags, 0, payload, meta, 1_000 + p) for p, (t, tags, payload, meta) in enumerate(events, 1)]
        step = max(1, len(rows) // batches)
        for i in range(0, len(rows), step):  # several records: fragments appended in turns
            index.add(rows[i : i + step], rows[min(i + step, len(rows)) - 1][0])
        until = min(after + span, len(rows))
        packed = index.read_packed(query, after, until, limit)
        matches = [(p, t, "\n".join(tags), payload, meta, ms) for p, t, tags, _, payload, meta, ms in rows
                   if after < p <= until and query_matches(query, t, tags)]
        assert _columns(packed.answer) == matches[:limit] and packed.event_count == len(matches[:limit])
        assert packed.read_to == (until if len(matches) <= limit else matches[limit - 1][0])
        index.close()


def test_a_packed_answer_is_bounded_in_bytes_but_holds_at_least_one_event(tmp_path: pathlib.Path) -> None:
    index = EventIndex(str(tmp_path))
    index.add([(p, "t", ["k"], 0, bytes(100), b"", 0) for p in range(1, 11)], 10)
    whole = index.read_packed((), 0, 10, 100)
    per_event = len(whole.answer) // 10
    cut = index.read_packed((), 0, 10, 100, max_bytes=3 * per_event)
    assert [c[0] for c in _columns(cut.answer)] == [1, 2, 3] and cut.event_count == 3 and cut.read_to == 0
    assert [c[0] for c in _columns(index.read_packed((), 0, 10, 100, max_bytes=3 * per_event - 1).answer)] == [1, 2]
    assert [c[0] for c in _columns(index.read_packed((QueryItem((), ("k",)),), 5, 10, 100, max_bytes=1).answer)] == [6]
    index.close()
