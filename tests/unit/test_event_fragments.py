"""Packed read answers (EventIndex.read_packed) and the fragments file behind them
(broker/events/fragments.py): the packed answer equals the row-built one on random stores and
queries, it is bounded in bytes, and the file stays consistent with the index's rows through a
crash (bytes past the committed end), a lost file, a failed write and a cut of the index."""

from __future__ import annotations

import os
import pathlib
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dmq.broker.events.fragments import FRAGMENTS_FILE, AT
from dmq.broker.events.index import EventIndex
from dmq.broker.events.query import QueryItem, query_matches
from dmq.broker.events.store import NewEvent
from dmq.broker.log import PartitionLog
from dmq.proto import dmq_pb2 as pb

from tests.unit.test_event_index import append, open_store

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
        for i in range(0, len(rows), step):  # several stages and commits: fragments appended in turns
            index.add(rows[i : i + step], rows[min(i + step, len(rows)) - 1][0])
            index.commit()
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


def _three_events_closed(tmp_path: pathlib.Path) -> tuple[PartitionLog, pathlib.Path]:
    """A store of events p0..p2 (tag k) whose index is closed; the log and the fragments file."""
    plog, store = open_store(tmp_path)
    append(store, [NewEvent("t", ("k",), b"p%d" % i) for i in range(3)])
    assert store._index is not None
    store._index.close()
    return plog, tmp_path / "es-0" / FRAGMENTS_FILE


def test_fragments_past_the_committed_end_are_cut_when_the_index_opens(tmp_path: pathlib.Path) -> None:
    plog, path = _three_events_closed(tmp_path)
    size = path.stat().st_size
    with open(path, "ab") as f:  # fragments of rows a crash took before their commit
        f.write(b"\xff" * 1000)
    again = EventIndex(str(tmp_path / "es-0"))
    assert path.stat().st_size == size and again.end == 3
    again.add([(4, "t", ["k"], 3, b"p3", b"", 0)], 4)
    assert [c[3] for c in _columns(again.read_packed((QueryItem((), ("k",)),), 0, 4, 10).answer)] == \
        [b"p0", b"p1", b"p2", b"p3"]
    again.close()
    plog.close()


def test_a_fragments_file_shorter_than_the_index_says_rebuilds_the_index_from_the_log(tmp_path: pathlib.Path) -> None:
    plog, path = _three_events_closed(tmp_path)
    os.truncate(path, path.stat().st_size // 2)
    again = EventIndex(str(tmp_path / "es-0"))
    assert again.end == 0 and again.catch_up(plog) == 3
    assert [c[3] for c in _columns(again.read_packed((), 0, 3, 10).answer)] == [b"p0", b"p1", b"p2"]
    again.close()
    plog.close()


def test_a_failed_stage_takes_its_fragments_back(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index = EventIndex(str(tmp_path))
    index.add([(1, "t", ["k"], 0, b"one", b"", 0)], 1)
    index.commit()
    committed = index._fragments.end

    class Full:
        """The connection, failing its next executemany as a full disk would."""

        def __init__(self, db: object) -> None:
            self.db = db

        def executemany(self, *_: object) -> None:
            raise OSError(28, "No space left on device")

        def __getattr__(self, name: str) -> object:
            return getattr(self.db, name)

    real = index._db
    monkeypatch.setattr(index, "_db", Full(real))
    with pytest.raises(OSError):
        index.add([(2, "t", ["k"], 1, b"two", b"", 0)], 2)
    monkeypatch.setattr(index, "_db", real)
    assert index._fragments.end == committed == (tmp_path / FRAGMENTS_FILE).stat().st_size and index.end == 1
    index.add([(2, "t", ["k"], 1, b"two", b"", 0)], 2)  # the error was not permanent
    assert [c[3] for c in _columns(index.read_packed((), 0, 2, 10).answer)] == [b"one", b"two"]
    index.close()


def test_a_cut_of_the_index_cuts_the_fragments_file(tmp_path: pathlib.Path) -> None:
    index = EventIndex(str(tmp_path))
    index.add([(p, "t", ["k"], 0, b"p%d" % p, b"", 0) for p in range(1, 6)], 5)
    start_of_4 = AT.unpack(index._db.execute("SELECT at FROM events WHERE position = 4").fetchone()[0])[0]
    index.truncate_to(3)
    assert (tmp_path / FRAGMENTS_FILE).stat().st_size == start_of_4 == index._fragments.end
    index.add([(4, "u", ["k"], 3, b"new", b"", 0)], 4)
    assert [c[1:4] for c in _columns(index.read_packed((), 0, 4, 10).answer)] == \
        [("t", "k", b"p1"), ("t", "k", b"p2"), ("t", "k", b"p3"), ("u", "k", b"new")]
    index.close()
    again = EventIndex(str(tmp_path))
    assert again.end == 4 and len(_columns(again.read_packed((), 0, 4, 10).answer)) == 4
    again.close()
