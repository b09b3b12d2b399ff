"""The event index's file (broker/events/index.py): one checksummed record per append, beside the
segments. A reopened index equals the one written; a cut (truncation on a leader change) is durable
and keeps the events before it, even inside a record; a damaged record (crc), a torn tail and a
file without its header are detected, cut off, and indexed again from the log; a failed write
leaves neither memory nor file changed."""

from __future__ import annotations

import pathlib

import pytest

from dmq.broker.events.index import HEAD, INDEX_FILE, MAGIC, EventIndex
from dmq.broker.events.query import QueryItem
from dmq.broker.events.store import NewEvent
from dmq.broker.log import PartitionLog
from tests.unit.test_event_index import _all_rows, append, open_store

K = (QueryItem((), ("k:1",)),)


def _store_of_three_appends(tmp_path: pathlib.Path) -> tuple[PartitionLog, pathlib.Path, list[tuple[object, ...]]]:
    """Appends of 4, 3 and 5 events (three records), the index closed: the log, the index file
    and the index's events as the appends wrote them."""
    plog, store = open_store(tmp_path)
    for n, t in ((4, "a"), (3, "b"), (5, "c")):
        append(store, [NewEvent(t, (f"k:{i % 2}", f"n:{i}"), b"p%d" % i, b"m") for i in range(n)], timestamp_ms=7)
    index = store._index
    assert index is not None
    rows = _all_rows(index)
    index.close()
    return plog, tmp_path / "es-0" / INDEX_FILE, rows


def _record_offsets(path: pathlib.Path) -> list[int]:
    data, at, out = path.read_bytes(), len(MAGIC), []
    while at < len(data):
        out.append(at)
        at += HEAD.size + HEAD.unpack_from(data, at)[0]
    return out


def test_one_record_per_append_and_a_reopened_index_equals_the_written_one(tmp_path: pathlib.Path) -> None:
    plog, path, rows = _store_of_three_appends(tmp_path)
    assert len(_record_offsets(path)) == 3
    again = EventIndex(str(path.parent))
    assert again.end == 12 and _all_rows(again) == rows and again.catch_up(plog) == 0
    assert again.matching(K, 0, 12, 100) == [2, 4, 6, 9, 11]
    assert again.first_match(K, 11, 12) is None and again.first_match((QueryItem(("b",), ("k:1",)),), 0, 12) == 6
    again.close()
    plog.close()


def test_a_cut_inside_a_record_keeps_the_events_before_it_durably(tmp_path: pathlib.Path) -> None:
    plog, path, rows = _store_of_three_appends(tmp_path)
    index = EventIndex(str(path.parent))
    index.truncate_to(5)  # inside the second record (positions 5..7)
    assert index.end == 5 and _all_rows(index) == rows[:5]
    assert index.matching(K, 0, 12, 100) == [2, 4]
    assert index.first_match((QueryItem(("c",)),), 0, 12) is None  # type "c" is gone from memory too
    index.add([(6, "d", ["k:1"], 5, b"new", b"", 9)], 6)  # the new leader's event at position 6
    written = _all_rows(index)
    index.close()  # as a crash after the cut: the cut was fsynced by truncate_to
    again = EventIndex(str(path.parent))
    assert again.end == 6 and _all_rows(again) == written and again.matching(K, 0, 12, 100) == [2, 4, 6]
    assert again.read(K, 0, 6, 10).types == ["a", "a", "d"]
    again.close()
    plog.close()


def test_a_cut_to_a_record_boundary_and_to_nothing(tmp_path: pathlib.Path) -> None:
    plog, path, rows = _store_of_three_appends(tmp_path)
    index = EventIndex(str(path.parent))
    index.truncate_to(7)
    assert index.end == 7 and _all_rows(index) == rows[:7]
    index.truncate_to(0)
    assert index.end == 0 and _all_rows(index) == [] and index.matching((), 0, 12, 100) == []
    index.close()
    again = EventIndex(str(path.parent))
    assert again.end == 0 and again.catch_up(plog) == 12 and _all_rows(again) == rows
    again.close()
    plog.close()


@pytest.mark.parametrize("record", [0, 1, 2])
@pytest.mark.parametrize("where", ["positions", "payload"])
def test_a_damaged_record_is_detected_cut_off_and_rebuilt_from_the_log(tmp_path: pathlib.Path, record: int,
                                                                      where: str) -> None:
    plog, path, rows = _store_of_three_appends(tmp_path)
    offsets = _record_offsets(path)
    data = bytearray(path.read_bytes())
    # one bit of the record's first position, or of its last event's fragment (only the crc tells)
    ends = [*offsets[1:], len(data)]
    data[offsets[record] + HEAD.size + 3 if where == "positions" else ends[record] - 3] ^= 0x40
    path.write_bytes(bytes(data))
    again = EventIndex(str(path.parent))
    kept = [0, 4, 7][record]
    assert again.end == kept and _all_rows(again) == rows[:kept]
    assert path.stat().st_size == offsets[record]  # the bad record and all after it cut off
    assert again.catch_up(plog) == 12 - kept and _all_rows(again) == rows
    assert again.matching(K, 0, 12, 100) == [2, 4, 6, 9, 11]
    again.close()
    plog.close()


def test_a_torn_tail_and_a_file_without_its_header_are_rebuilt(tmp_path: pathlib.Path) -> None:
    plog, path, rows = _store_of_three_appends(tmp_path)
    size = path.stat().st_size
    with open(path, "r+b") as f:  # the last record's write was torn
        f.truncate(size - 10)
    again = EventIndex(str(path.parent))
    assert again.end == 7 and again.catch_up(plog) == 5 and _all_rows(again) == rows
    again.close()
    path.write_bytes(b"this is not an event index" * 10)
    again = EventIndex(str(path.parent))
    assert again.end == 0 and path.read_bytes() == MAGIC and again.catch_up(plog) == 12 and _all_rows(again) == rows
    again.close()
    plog.close()


def test_a_failed_write_changes_neither_memory_nor_file(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index = EventIndex(str(tmp_path))
    index.add([(1, "t", ["k:1"], 0, b"one", b"", 0)], 1)
    size, rows = (tmp_path / INDEX_FILE).stat().st_size, _all_rows(index)

    def full(data: object, at: int) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(index, "_write_all", full)
        with pytest.raises(OSError):
            index.add([(2, "t", ["k:1"], 1, b"two", b"", 0)], 2)
    assert (tmp_path / INDEX_FILE).stat().st_size == size and _all_rows(index) == rows and index.end == 1
    # a job whose second append fails: the first one's record is taken back with it
    with pytest.raises(OSError), index.transaction():
        index.stage([(2, "t", ["k:1"], 1, b"two", b"", 0)], 2)
        with monkeypatch.context() as m:
            m.setattr(index, "_write_all", full)
            index.stage([(3, "u", ["k:1"], 2, b"three", b"", 0)], 3)
    assert (tmp_path / INDEX_FILE).stat().st_size == size and _all_rows(index) == rows and index.end == 1
    assert index.matching(K, 0, 3, 10) == [1] and index.first_match((QueryItem(("u",)),), 0, 3) is None
    index.add([(2, "t", ["k:1"], 1, b"two", b"", 0)], 2)  # the error was not permanent
    assert index.read(K, 0, 2, 10).payloads == [b"one", b"two"]
    index.close()
    again = EventIndex(str(tmp_path))
    assert again.read(K, 0, 2, 10).payloads == [b"one", b"two"]
    again.close()
