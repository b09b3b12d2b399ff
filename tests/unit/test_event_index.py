"""The event index against its log (the log is the truth): caught up when behind, cut back when
ahead (a torn or rolled-back tail), and the pure matching rules it implements in SQL."""

from __future__ import annotations

import pathlib

from dmq.broker.events.index import EventIndex
from dmq.broker.events.progress import SqliteProgressStore
from dmq.broker.events.query import QueryItem, belongs, partition_values, query_matches
from dmq.broker.events.store import EventStore, NewEvent
from dmq.broker.log import LogConfig, PartitionLog
from dmq.proto import records
from dmq.proto.event_headers import event_headers, parse_event_headers, partition_key


def append(store: EventStore, events: list[NewEvent]) -> int:
    batch = records.encode([e.payload for e in events], headers=[event_headers(e.type, e.tags) for e in events])
    index = store._index
    assert index is not None
    with index.transaction():
        return store._append_one(index, events, None, batch)[0]


def open_store(tmp_path: pathlib.Path) -> tuple[PartitionLog, EventStore]:
    plog = PartitionLog(tmp_path / "es-0", "es", 0, LogConfig(flush_policy="interval"))
    store = EventStore(plog, progress=lambda: SqliteProgressStore(str(plog.directory)))
    store._open()
    return plog, store


def test_headers_round_trip_and_attributes() -> None:
    headers = event_headers("t", ["a:1", "plain", "b:x:y"], b"meta")
    assert parse_event_headers(headers) == ("t", ["a:1", "plain", "b:x:y"], b"meta")
    assert partition_values(["b", "a"], ["a:1", "b:x:y"]) == {"b": "x:y", "a": "1"}
    assert partition_values(["a", "c"], ["a:1"]) is None
    assert partition_key({"b": "2", "a": "1"}) == "a:1\nb:2"


def test_matching_rules() -> None:
    assert query_matches((), "t", [])
    assert query_matches((QueryItem(("t",), ("a:1",)),), "t", ["a:1", "b:2"])
    assert not query_matches((QueryItem(("u",), ("a:1",)),), "t", ["a:1"])
    assert not query_matches((QueryItem((), ("a:1", "c")),), "t", ["a:1"])
    partition = {"course": "Algebra", "user": "joe"}
    assert belongs(partition, ["course:Algebra"]) and belongs(partition, ["user:joe", "other"])
    assert belongs(partition, ["course:Algebra", "user:joe"])
    assert not belongs(partition, ["course:Algebra", "user:jake"])
    assert not belongs(partition, ["course:History", "user:joe"])
    assert not belongs(partition, ["plain"])


def test_an_index_behind_the_log_catches_up(tmp_path: pathlib.Path) -> None:
    plog, store = open_store(tmp_path)
    assert append(store, [NewEvent("t", (f"n:{i % 2}",), str(i).encode()) for i in range(10)]) == 10
    index = store._index
    assert index is not None
    index.truncate_to(4)  # as if the last index commits were lost in a crash
    assert index.matching((QueryItem((), ("n:1",)),), 0, 10, 100) == [(2, 0), (4, 0)]
    assert index.catch_up(plog) == 6
    assert [p for p, _ in index.matching((QueryItem(("t",), ("n:1",)),), 0, 10, 100)] == [2, 4, 6, 8, 10]
    plog.close()


def test_an_index_ahead_of_the_log_is_cut_back(tmp_path: pathlib.Path) -> None:
    plog, store = open_store(tmp_path)
    append(store, [NewEvent("t", ("k",), b"x")] * 3)
    index = store._index
    assert index is not None
    # events the log no longer has (its tail was torn or rolled back after the index commit)
    index.add([(4, "t", ["k"], 3), (5, "t", ["k"], 3)], 5)
    index.catch_up(plog)
    assert index.end == 3 and [p for p, _ in index.matching((), 0, 10, 100)] == [1, 2, 3]
    assert append(store, [NewEvent("u", ("k",), b"y")]) == 4
    assert [e.type for e in store.load(index.matching((), 0, 10, 100))] == ["t", "t", "t", "u"]
    plog.close()


def test_a_reopened_index_needs_no_catch_up(tmp_path: pathlib.Path) -> None:
    plog, store = open_store(tmp_path)
    append(store, [NewEvent("t", ("k",), b"x")] * 5)
    assert store._index is not None
    store._index.close()
    again = EventIndex(str(tmp_path / "es-0"))
    assert again.end == 5 and again.catch_up(plog) == 0
    again.close()
    plog.close()
