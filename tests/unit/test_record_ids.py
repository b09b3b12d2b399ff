"""Transaction ids and trace ids in the partition log: de-duplication within the window (mixed
batches, idempotent sequences, reopening, the entry cap) and the per-segment trace index (rebuilt
when deleted or damaged). Real files in tmp_path; the clock is injected."""

from __future__ import annotations

import os

import pytest

from dmq.broker.log import LogConfig, PartitionLog
from dmq.broker.log.dedup import TransactionIds
from dmq.broker.log.producer_state import ProducerStateManager
from dmq.broker.log.trace_index import TRACE_SUFFIX
from dmq.proto import records
from tests.clocks import ManualClockMs


def batch(txns=(), traces=None, *, pid: int = -1, epoch: int = -1, seq: int = -1, codec=records.Codec.NONE) -> bytes:  # type: ignore[no-untyped-def]
    n = len(txns) if txns else len(traces or ())
    headers = []
    for i in range(n):
        h = []
        if txns and txns[i] is not None:
            h.append((records.TXN_HEADER, txns[i].encode()))
        if traces and traces[i] is not None:
            h.append((records.TRACE_HEADER, traces[i].encode()))
        headers.append(h)
    values = [f"v{i}".encode() for i in range(n)]
    return records.encode(values, headers=headers, producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                          timestamp_ms=1, codec=codec)


def stored(plog: PartitionLog) -> list[tuple[int, str | None]]:
    """(offset, transaction id) of every record in the log."""
    out = []
    for b in records.decode_batches(plog.read(plog.log_start_offset, 1 << 30, max_offset=plog.log_end_offset)):
        for r in b:
            txn = dict(r.headers).get(records.TXN_HEADER)
            out.append((r.offset, None if txn is None else txn.decode()))
    return out


def open_log(path, clock=None, **config) -> PartitionLog:  # type: ignore[no-untyped-def]
    return PartitionLog(path / "t-0", "t", 0, LogConfig(**config), clock_ms=clock or ManualClockMs())


# -- the codec marks batches with ids --------------------------------------------------------------


def test_encode_sets_the_attribute_bits_only_for_batches_with_reserved_headers() -> None:
    plain = records.read_header(records.encode([b"a"], headers=[[("x", b"1")]]))
    assert plain.attributes & (records.ATTR_HAS_TXN_IDS | records.ATTR_HAS_TRACE_IDS) == 0
    txn = records.read_header(batch(["T1"]))
    assert txn.attributes & records.ATTR_HAS_TXN_IDS and not txn.attributes & records.ATTR_HAS_TRACE_IDS
    both = records.read_header(batch([None, "T"], traces=["a", None]))
    assert both.attributes & records.ATTR_HAS_TXN_IDS and both.attributes & records.ATTR_HAS_TRACE_IDS


@pytest.mark.parametrize("value", ["", "x" * 256, b"\xff"])
def test_a_bad_record_id_is_refused_naming_the_field_and_the_limit(value) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(records.InvalidRecordIdError, match="transaction_id .*(255|UTF-8)"):
        records.check_record_id(value, "transaction_id")
    assert records.check_record_id("x" * 255, "trace_id") == "x" * 255


# -- de-duplication --------------------------------------------------------------------------------


def test_a_duplicate_transaction_id_is_answered_with_the_original_offset_and_not_stored(tmp_path) -> None:
    plog = open_log(tmp_path)
    first = plog.append(batch(["A", "B"]))
    assert (first.base_offset, first.record_offsets, first.duplicate) == (0, None, False)
    again = plog.append(batch(["B"]))
    assert again.duplicate and again.record_offsets == [1]
    assert stored(plog) == [(0, "A"), (1, "B")]


@pytest.mark.parametrize("codec", [records.Codec.NONE, records.Codec.ZSTD])
def test_a_mixed_batch_is_stored_without_its_duplicates_and_the_sequence_goes_on(tmp_path, codec) -> None:  # type: ignore[no-untyped-def]
    plog = open_log(tmp_path)
    plog.append(batch(["B"], pid=7, epoch=0, seq=0))
    # A new, B duplicate of the log, None without id, A again (a duplicate inside the batch), C new
    info = plog.append(batch(["A", "B", None, "A", "C"], pid=7, epoch=0, seq=1, codec=codec))
    assert not info.duplicate
    assert info.record_offsets == [1, 0, 2, 1, 3]
    assert stored(plog) == [(0, "B"), (1, "A"), (2, None), (3, "C")]
    # a retry of the same batch (lost answer): the same offsets, nothing written
    retry = plog.append(batch(["A", "B", None, "A", "C"], pid=7, epoch=0, seq=1, codec=codec))
    assert retry.duplicate and retry.record_offsets == [1, 0, 2, 1, 3]
    # an all-duplicate batch advances the sequence too: the next batch (seq 8) is in order
    dup = plog.append(batch(["C", "A"], pid=7, epoch=0, seq=6))
    assert dup.duplicate and dup.record_offsets == [3, 1]
    nxt = plog.append(batch(["D"], pid=7, epoch=0, seq=8))
    assert nxt.base_offset == 4 and not nxt.duplicate
    assert len(stored(plog)) == 5


def test_outside_the_window_an_id_is_stored_again(tmp_path) -> None:
    clock = ManualClockMs()
    plog = open_log(tmp_path, clock, dedup_window_ms=1000)
    assert plog.append(batch(["A"])).base_offset == 0
    clock.now_ms += 1000
    assert plog.append(batch(["A"])).duplicate  # at the edge: still inside
    clock.now_ms += 1
    info = plog.append(batch(["A"]))
    assert (info.base_offset, info.duplicate) == (1, False)
    # and the second copy is the one remembered now
    assert plog.append(batch(["A"])).record_offsets == [1]


def test_window_zero_turns_de_duplication_off(tmp_path) -> None:
    plog = open_log(tmp_path, dedup_window_ms=0)
    plog.append(batch(["A"]))
    assert plog.append(batch(["A"])).base_offset == 1
    assert stored(plog) == [(0, "A"), (1, "A")]


@pytest.mark.parametrize("clean", [True, False])
def test_the_ids_are_rebuilt_from_the_log_after_reopening(tmp_path, clean) -> None:  # type: ignore[no-untyped-def]
    clock = ManualClockMs()
    plog = open_log(tmp_path, clock, dedup_window_ms=10_000, segment_bytes=1024)
    plog.append(batch(["OLD"]))
    clock.now_ms += 20_000  # OLD is outside the window from now on
    for i in range(40):  # several segments
        plog.append(batch([f"T{i}", None]))
        clock.now_ms += 10
    assert plog.segment_count > 2
    if clean:
        plog.close()
    else:
        plog.abandon()  # a crash: no marker, the active segment is scanned
    again = open_log(tmp_path, clock, dedup_window_ms=10_000, segment_bytes=1024)
    assert again.append(batch(["T3"])).record_offsets == [1 + 3 * 2]
    assert again.append(batch(["T39"])).record_offsets == [1 + 39 * 2]
    assert not again.append(batch(["OLD"])).duplicate
    assert again._record_ids.txn is not None and "OLD" in again._record_ids.txn
    assert len(again._record_ids.txn) == 41  # T0..T39 and the new OLD: nothing older was loaded
    again.close()


def test_the_cap_forgets_the_oldest_ids_first() -> None:
    ids = TransactionIds(window_ms=60_000, max_entries=3)
    for i, t in enumerate("abcd"):
        ids.add(t, i, 1000 + i)
    assert list(ids) == ["b", "c", "d"] and ids.evicted == 1
    assert ids.get("a") is None and ids.get("d") == 3
    ids.expire(1002 + 60_000)  # c (1002) is exactly at the window's start: kept
    assert list(ids) == ["c", "d"]
    ids.truncate(3)
    assert list(ids) == ["c"]
    assert "entries=1" in repr(ids)


def test_a_retry_of_a_batch_stored_without_its_duplicates_is_a_duplicate() -> None:
    state = ProducerStateManager()
    # the original had sequences 0..4; two were duplicates, so the log holds 3 records as 2..4
    state.update(5, 0, 2, 3, 10, 12, 1)
    assert state.check(5, 0, 0, 5) is not None
    assert state.check(5, 0, 2, 3) is not None
    assert state.check(5, 0, 5, 1) is None  # the next batch is in order


# -- trace index -----------------------------------------------------------------------------------


def find(plog: PartitionLog, trace_id: str) -> list[int]:
    return [o for o, _ in plog.find_trace(trace_id, 100)[0]]


def test_traces_are_found_through_the_index_and_only_the_matching_records(tmp_path) -> None:
    plog = open_log(tmp_path, segment_bytes=1024)
    want = []
    for i in range(30):
        info = plog.append(batch(traces=[f"t{i % 3}", None, "other"]))
        if i % 3 == 1:
            want.append(info.base_offset)
    assert plog.segment_count > 2
    assert find(plog, "t1") == want
    assert find(plog, "nobody") == []
    found, truncated = plog.find_trace("t1", 4)
    assert len(found) == 4 and truncated
    plog.close()


@pytest.mark.parametrize("damage", ["delete", "garbage", "beyond_the_end"])
def test_the_trace_index_is_rebuilt_when_its_file_is_missing_or_damaged(tmp_path, damage) -> None:  # type: ignore[no-untyped-def]
    plog = open_log(tmp_path, segment_bytes=1024)
    want = [plog.append(batch(traces=["x", "y"])).base_offset for _ in range(20)]
    plog.close()
    files = sorted(f for f in os.listdir(tmp_path / "t-0") if f.endswith(TRACE_SUFFIX))
    assert len(files) > 2  # one per segment, marked complete at roll and close
    for name in files:
        path = tmp_path / "t-0" / name
        if damage == "delete":
            path.unlink()
        elif damage == "garbage":
            path.write_bytes(b"\x01" * 13)
        else:  # entries pointing past the segment's end (a log cut back after a crash)
            path.write_bytes(path.read_bytes() + (1).to_bytes(8, "little") + (10**6).to_bytes(4, "little"))
    again = open_log(tmp_path, segment_bytes=1024)
    assert find(again, "x") == want
    assert find(again, "y") == [o + 1 for o in want]
    again.close()
    for name in files:  # written again, and plausible
        assert (tmp_path / "t-0" / name).stat().st_size % 12 == 0


def test_traced_records_appended_after_a_crash_are_found_with_those_before(tmp_path) -> None:
    plog = open_log(tmp_path)
    a = plog.append(batch(traces=["x"])).base_offset
    plog.append(batch(traces=[None]))
    plog.abandon()  # no close: the index file has no mark at the end
    again = open_log(tmp_path)
    b = again.append(batch(traces=["x"])).base_offset
    assert find(again, "x") == [a, b]
    again.close()


def test_records_lost_with_the_log_tail_leave_no_coverage_behind(tmp_path) -> None:
    plog = open_log(tmp_path)
    plog.append(batch(traces=["x"]))
    lost = plog.append(batch(traces=["y"]))
    plog.abandon()
    log_file = tmp_path / "t-0" / f"{0:020d}.log"
    with open(log_file, "r+b") as f:  # a power loss: the last batch never reached the disk
        f.truncate(os.path.getsize(log_file) - 5)
    again = open_log(tmp_path)
    assert again.log_end_offset == lost.base_offset
    z = again.append(batch(traces=["z"])).base_offset  # the lost batch's offset, now another record
    assert z == lost.base_offset
    assert find(again, "z") == [z] and find(again, "y") == [] and find(again, "x") == [0]
    again.close()
