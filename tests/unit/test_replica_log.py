"""A replica's log operations (PartitionLog.append_replica / truncate_to) and the leader-epoch
checkpoint file: real files in tmp_path; a crash is PartitionLog.abandon() (no clean close)."""

from __future__ import annotations

import pytest

from dmq.broker.log import InvalidBatchError, LogConfig, PartitionLog, StorageUnavailableError
from dmq.broker.replication.checkpoint import EPOCHS_FILE, decode_epochs, encode_epochs, load_epochs, save_epochs
from dmq.broker.replication.epochs import EpochEntry, LeaderEpochCache
from dmq.proto import records


def _open(path, name: str, **config) -> PartitionLog:
    return PartitionLog(path / name, "t", 0, LogConfig(**config))


def _all_bytes(plog: PartitionLog) -> bytes:
    out, offset = bytearray(), plog.log_start_offset
    while offset < plog.log_end_offset:
        chunk = plog.read(offset, 1 << 20)
        out += chunk
        last = list(records.iter_headers(chunk))[-1][1]
        offset = last.base_offset + last.record_count
    return bytes(out)


def _fill(leader: PartitionLog, batches: int, size: int = 50) -> None:
    for i in range(batches):
        leader.append(records.encode([f"r{i}".encode(), b"y" * size], producer_id=3, producer_epoch=0,
                                     base_sequence=2 * i))
    leader.append(records.encode([b"traced"], headers=[[(records.TRACE_HEADER, b"trace-1")]]))


def test_replica_append_keeps_the_leaders_bytes_offsets_and_producer_state(tmp_path):
    leader, follower = _open(tmp_path, "l"), _open(tmp_path, "f")
    _fill(leader, 4)
    assert follower.append_replica(_all_bytes(leader)) == leader.log_end_offset == 9
    assert _all_bytes(follower) == _all_bytes(leader)
    # promoted, it answers an idempotent retry as the leader would have: a duplicate
    retry = follower.append(records.encode([b"r3", b"y" * 50], producer_id=3, producer_epoch=0, base_sequence=6))
    assert retry.duplicate and retry.base_offset == 6
    # and its trace index has the replicated record
    found, _ = follower.find_trace("trace-1", 10)
    assert [o for o, _ in found] == [8]


def test_replica_append_refuses_a_gap_and_a_damaged_batch(tmp_path):
    leader, follower = _open(tmp_path, "l"), _open(tmp_path, "f")
    _fill(leader, 2)
    data = _all_bytes(leader)
    first = list(records.iter_headers(data))[1][0]  # the second batch, at offset 2
    with pytest.raises(InvalidBatchError, match="starts at offset 2, the log ends at 0"):
        follower.append_replica(data[first:])
    damaged = bytearray(data)
    damaged[-3] ^= 0xFF
    with pytest.raises(InvalidBatchError):
        follower.append_replica(bytes(damaged))
    assert follower.log_end_offset == 4  # the batches before the damaged one went in
    assert _all_bytes(follower) == data[: len(_all_bytes(follower))]


@pytest.mark.parametrize("crash", [False, True])
def test_truncate_to_cuts_across_segments_and_survives_a_crash(tmp_path, crash):
    plog = _open(tmp_path, "p", segment_bytes=1024)
    _fill(plog, 10, size=400)
    assert plog.segment_count > 2
    keep = _all_bytes(plog)
    cut_at = 7  # inside the batch 6..7: the whole batch goes
    dropped = plog.truncate_to(cut_at)
    assert (plog.log_end_offset, dropped) == (6, 15)
    assert _all_bytes(plog) == keep[: len(_all_bytes(plog))]
    if crash:
        plog.abandon()
    else:
        plog.close()
    again = _open(tmp_path, "p", segment_bytes=1024)
    assert again.log_end_offset == 6
    # the producer state forgot the cut batches: sequence 6 is new again, not a duplicate
    info = again.append(records.encode([b"n", b"m"], producer_id=3, producer_epoch=0, base_sequence=6))
    assert not info.duplicate and info.base_offset == 6
    again.close()


def test_the_epoch_checkpoint_round_trips_and_a_damaged_one_reads_as_empty(tmp_path):
    cache = LeaderEpochCache([EpochEntry(0, 0), EpochEntry(2, 10), EpochEntry(5, 42)])
    assert decode_epochs(encode_epochs(cache).decode()).entries == cache.entries
    plog = _open(tmp_path, "p")
    assert load_epochs(plog).entries == []
    save_epochs(plog, cache)
    assert load_epochs(plog).entries == cache.entries
    path = tmp_path / "p" / EPOCHS_FILE
    path.write_text(path.read_text().replace("42", "43"))
    assert load_epochs(plog).entries == []  # checksum mismatch: truncation falls back to the high watermark
    plog.close()


@pytest.mark.parametrize("crash_at", [None, "before_new_segment", "after"])
def test_restart_at_drops_the_log_and_continues_at_the_leaders_start(tmp_path, monkeypatch, crash_at):
    plog = _open(tmp_path, "p", segment_bytes=1024)
    _fill(plog, 6, size=400)
    if crash_at == "before_new_segment":
        # the checkpoint naming the new start is on disk, the new segment never came
        monkeypatch.setattr(PartitionLog, "_create_empty", lambda self, start: (_ for _ in ()).throw(OSError(5, "EIO")))
        with pytest.raises(StorageUnavailableError):
            plog.restart_at(100)
        monkeypatch.undo()
    else:
        plog.restart_at(100)
        assert (plog.log_start_offset, plog.log_end_offset, plog.size_bytes) == (100, 100, 0)
    if crash_at is None:
        plog.close()
    else:
        plog.abandon()
    again = _open(tmp_path, "p", segment_bytes=1024)
    assert (again.log_start_offset, again.log_end_offset) == (100, 100)
    assert sorted(p.name for p in (tmp_path / "p").glob("*.log")) == [f"{100:020d}.log"]
    # the leader's batches continue at 100; the producer from before is forgotten
    leader = _open(tmp_path, "l")
    leader.append(records.encode([b"x"] * 100))
    leader.append(records.encode([b"n"], producer_id=3, producer_epoch=0, base_sequence=0))
    assert again.append_replica(leader.read(100, 1 << 20)) == 101
    assert again.read(100, 1 << 20) == leader.read(100, 1 << 20)
    again.close()
    leader.close()
