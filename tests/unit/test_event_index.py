"""The event index against its log (the log is the truth): caught up when behind, cut back when
ahead (a torn or rolled-back tail), and the pure matching rules it implements in memory."""

from __future__ import annotations

import pathlib

from dmq.broker.events.index import INDEX_FILE, OLD_FILES, EventColumns, EventIndex
from dmq.broker.events.progress import SqliteProgressStore
from dmq.broker.events.query import QueryItem, belongs, partition_values, query_matches
from dmq.broker.events.store import EventStore, NewEvent
from dmq.broker.log import LogConfig, PartitionLog
from dmq.proto import records
from dmq.proto.event_headers import event_headers, parse_event_headers, partition_key


def append(store: EventStore, events: list[NewEvent], timestamp_ms: int | None = None) -> int:
    batch = records.encode([e.payload for e in events], headers=[event_headers(e.type, e.tags, e.metadata) for e in events],
                           timestamp_ms=timestamp_ms)
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
    assert index.matching((QueryItem((), ("n:1",)),), 0, 10, 100) == [2, 4]
    assert index.catch_up(plog) == 6
    assert index.matching((QueryItem(("t",), ("n:1",)),), 0, 10, 100) == [2, 4, 6, 8, 10]
    plog.close()


def test_an_index_ahead_of_the_log_is_cut_back(tmp_path: pathlib.Path) -> None:
    plog, store = open_store(tmp_path)
    append(store, [NewEvent("t", ("k",), b"x")] * 3)
    index = store._index
    assert index is not None
    # events the log no longer has (its tail was torn or rolled back after the index commit)
    index.add([(4, "t", ["k"], 3, b"x", b"", 0), (5, "t", ["k"], 3, b"x", b"", 0)], 5)
    index.catch_up(plog)
    assert index.end == 3 and index.matching((), 0, 10, 100) == [1, 2, 3]
    assert append(store, [NewEvent("u", ("k",), b"y")]) == 4
    assert index.read((), 0, 10, 100).types == ["t", "t", "t", "u"]
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


def _all_rows(index: EventIndex) -> list[tuple[object, ...]]:
    """Every event the index holds, with its fragment (the bytes a read answers with)."""
    view = index._mapped(index._file_end)
    return [(p, b, index._type_names[t], j, bytes(view[s:e])) for p, b, t, j, s, e in
            zip(index._positions, index._batches, index._type_of, index._tags, index._starts, index._ends, strict=True)]


def _events_in_log(plog: PartitionLog) -> list[tuple[int, str, str, bytes, bytes, int]]:
    """Every event as the log holds it (position, type, tags joined, payload, metadata, time),
    decoded here, apart from the index."""
    out = []
    for batch in records.decode_batches(plog.read(0, 1 << 20)):
        for r in batch.iter_from(0):
            event_type, tags, metadata = parse_event_headers(r.headers)
            out.append((r.offset + 1, event_type, "\n".join(tags), bytes(r.value), bytes(metadata), r.timestamp))
    return out


def test_an_index_rebuilt_from_the_log_carries_the_same_columns(tmp_path: pathlib.Path) -> None:
    """The read columns (payload, metadata, time) are copies of the log's: the rows catch_up()
    derives from the log equal those the appends wrote, and a read from either returns what
    the log holds."""
    plog, store = open_store(tmp_path)
    append(store, [NewEvent("t", ("a:1", "b"), b"p1", b"m1"), NewEvent("u", (), b"", b"")], timestamp_ms=1_000)
    append(store, [NewEvent("t", ("a:2",), b"p3" * 100, b"")], timestamp_ms=2_000)
    index = store._index
    assert index is not None
    appended = _all_rows(index)
    from_log = _events_in_log(plog)
    index.truncate_to(0)  # as if the whole index was lost
    assert index.read((), 0, 3, 100).positions == []
    assert index.catch_up(plog) == 3
    assert _all_rows(index) == appended
    got = index.read((), 0, 3, 100)
    assert got == EventColumns([1, 2, 3], ["t", "u", "t"], ["a:1\nb", "", "a:2"], [b"p1", b"", b"p3" * 100],
                               [b"m1", b"", b""], [1_000, 1_000, 2_000])
    assert from_log == list(zip(*got, strict=True))
    plog.close()


def test_the_old_sqlite_index_files_are_removed_and_the_index_rebuilt_from_the_log(tmp_path: pathlib.Path) -> None:
    plog, store = open_store(tmp_path)
    append(store, [NewEvent("t", ("k",), b"x", b"m")] * 2, timestamp_ms=5)
    assert store._index is not None
    store._index.close()
    directory = tmp_path / "es-0"
    (directory / INDEX_FILE).unlink()
    for name in OLD_FILES:  # as a broker of the SQLite layout left them
        (directory / name).write_bytes(b"old")
    again = EventIndex(str(directory))
    assert not [name for name in OLD_FILES if (directory / name).exists()]
    assert again.end == 0 and again.catch_up(plog) == 2
    assert again.read((QueryItem((), ("k",)),), 0, 2, 10) == EventColumns([1, 2], ["t", "t"], ["k", "k"], [b"x", b"x"],
                                                                           [b"m", b"m"], [5, 5])
    again.close()
    plog.close()


def test_a_read_answer_is_bounded_in_bytes_but_holds_at_least_one_event(tmp_path: pathlib.Path) -> None:
    plog, store = open_store(tmp_path)
    append(store, [NewEvent("t", ("k",), bytes(100)) for _ in range(10)])
    index = store._index
    assert index is not None
    # an event's share of an answer is its fragment (one batch: the same timestamp; positions of one byte)
    per_event = len(index.read_packed((), 0, 10, 100).answer) // 10
    assert per_event > 100
    assert index.read((), 0, 10, 100, max_bytes=3 * per_event).positions == [1, 2, 3]
    assert index.read((), 0, 10, 100, max_bytes=3 * per_event - 1).positions == [1, 2]
    assert index.read((), 5, 10, 100, max_bytes=1).positions == [6]
    assert index.read((), 0, 10, 100, max_bytes=10 * per_event).positions == list(range(1, 11))
    assert index.read((QueryItem((), ("k",)), QueryItem(("t",))), 0, 10, 4).positions == [1, 2, 3, 4]
    plog.close()
