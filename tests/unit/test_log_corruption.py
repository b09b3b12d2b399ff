"""Recovery from damaged files: torn tails, flipped bytes, garbage, bad indexes, checkpoints and
snapshots. Reopening truncates a torn tail (log it), keeps damaged batches that valid ones follow
(reported, never served: before issue 13 recovery cut them AND every valid batch after them), and
never exposes a bad batch."""

from __future__ import annotations

import os
import random

import pytest
import structlog

from dmq.broker.log import CorruptLogError, LogConfig, PartitionLog
from dmq.proto import records

CONFIG = LogConfig(segment_bytes=8192, index_interval_bytes=256)


def batch(i: int, n: int = 2, size: int = 100, **kw: int) -> bytes:
    return records.encode([bytes([i % 256]) * size] * n, timestamp_ms=1, **kw)


def build(path, count: int = 20, **kw) -> tuple[PartitionLog, list[bytes]]:  # type: ignore[no-untyped-def]
    plog = PartitionLog(path / "t-3", "t", 3, CONFIG)
    for i in range(count):
        plog.append(batch(i, **kw))
    stored = [plog.read(o, 1) for o in range(0, plog.log_end_offset, 2)]
    return plog, stored


def crash(plog: PartitionLog) -> None:
    """Stop without a clean shutdown (what a SIGKILL leaves, data already in the page cache)."""
    plog.abandon()


def reopen(path):  # type: ignore[no-untyped-def]
    with structlog.testing.capture_logs() as logs:
        plog = PartitionLog(path / "t-3", "t", 3, CONFIG)
    return plog, [e for e in logs if e["log_level"] == "warning"]


def active_file(plog: PartitionLog) -> str:
    return plog._segments[-1].log_path


def assert_prefix(plog: PartitionLog, stored: list[bytes], n_batches: int) -> None:
    """The log holds exactly the first n_batches original batches, each valid, and accepts more."""
    assert plog.log_end_offset == 2 * n_batches
    data = b"".join(plog.read(o, 1) for o in range(0, plog.log_end_offset, 2))
    assert data == b"".join(stored[:n_batches])
    for b in records.decode_batches(data):  # CRC-checked
        assert len(b) == 2
    info = plog.append(batch(99))
    assert info.base_offset == 2 * n_batches
    assert records.validate_batch(plog.read(info.base_offset, 1)).base_offset == info.base_offset


def test_torn_tail_is_truncated_and_logged(tmp_path):
    plog, stored = build(tmp_path, 10)
    path = active_file(plog)
    crash(plog)
    size = os.path.getsize(path)
    os.truncate(path, size - 37)  # the last batch lost its end
    again, warnings = reopen(tmp_path)
    assert not again.recovery.clean
    assert again.recovery.bytes_truncated == len(stored[-1]) - 37
    (w,) = warnings
    assert w["event"] == "truncated log tail"
    assert w["topic"] == "t" and w["partition"] == 3
    assert w["segment"] == os.path.basename(path)
    assert w["position"] == size - len(stored[-1])
    assert w["bytes_truncated"] == len(stored[-1]) - 37
    assert "torn batch" in w["reason"]
    assert os.path.getsize(path) == size - len(stored[-1])
    assert_prefix(again, stored, 9)
    again.close()


def flip(path: str, pos: int, mask: int = 0x40) -> None:
    """XOR the byte at pos with mask, in place."""
    with open(path, "r+b") as f:
        f.seek(pos)
        byte = f.read(1)
        f.seek(pos)
        f.write(bytes([byte[0] ^ mask]))


def crashed_ten_batches(tmp_path) -> tuple[str, list[bytes], int, list[int]]:  # type: ignore[no-untyped-def]
    """Ten batches appended, then a crash: the active file, the batches, its size and where in it
    each batch starts."""
    plog, stored = build(tmp_path, 10)
    path = active_file(plog)
    crash(plog)
    size = os.path.getsize(path)
    return path, stored, size, [size - sum(len(b) for b in stored[i:]) for i in range(10)]


def assert_damage_kept(plog: PartitionLog, stored: list[bytes], damaged: int) -> None:
    """Batch `damaged` (offsets 2d, 2d+1) is reported and never served; every other batch is
    there byte for byte; appends are refused (the partition is offline for writes)."""
    assert plog.log_end_offset == 2 * len(stored)
    for i, expected in enumerate(stored):
        if i == damaged:
            with pytest.raises(CorruptLogError) as e:
                plog.read(2 * i, 1 << 20)
            assert e.value.offset == 2 * i and "t[3]" in str(e.value) and f"offsets {2 * i}..{2 * i + 1}" in str(e.value)
            continue
        assert plog.read(2 * i, 1) == expected
    # a read running into the damage stops before it
    assert plog.read(0, 1 << 20) == b"".join(stored[:damaged])
    assert plog.status == "corrupt"
    with pytest.raises(CorruptLogError):
        plog.append(batch(99))


@pytest.mark.parametrize("where", ["middle body", "header magic"])
def test_damage_in_the_middle_is_kept_reported_and_never_served(tmp_path, where):
    path, stored, size, offsets_in_file = crashed_ten_batches(tmp_path)
    damaged, pos = {"middle body": (4, offsets_in_file[4] + 150), "header magic": (6, offsets_in_file[6] + 12)}[where]
    flip(path, pos)
    with structlog.testing.capture_logs() as logs:
        again = PartitionLog(tmp_path / "t-3", "t", 3, CONFIG)
    errors = [e for e in logs if e["log_level"] == "error"]
    assert [(e["position"], e["first_offset"], e["last_offset"]) for e in errors] == [
        (offsets_in_file[damaged], 2 * damaged, 2 * damaged + 1)
    ]
    assert errors[0]["topic"] == "t" and errors[0]["partition"] == 3
    assert again.recovery.bytes_truncated == 0 and again.recovery.damaged_batches == 1
    assert os.path.getsize(path) == size
    assert_damage_kept(again, stored, damaged)
    again.close()


@pytest.mark.parametrize("where", ["last body", "last crc"])
def test_damaged_last_batch_is_a_torn_tail_and_truncated(tmp_path, where):
    path, stored, size, offsets_in_file = crashed_ten_batches(tmp_path)
    damaged, pos = {"last body": (9, offsets_in_file[9] + 80), "last crc": (9, offsets_in_file[9] + 14)}[where]
    flip(path, pos)
    again, warnings = reopen(tmp_path)
    assert [w["position"] for w in warnings] == [offsets_in_file[damaged]]
    assert warnings[0]["bytes_truncated"] == size - offsets_in_file[damaged]
    assert_prefix(again, stored, damaged)
    again.close()


def test_garbage_after_the_last_batch_is_cut(tmp_path):
    plog, stored = build(tmp_path, 5)
    path = active_file(plog)
    crash(plog)
    with open(path, "ab") as f:
        f.write(bytes(4096))  # a preallocated / zero-filled tail
    again, warnings = reopen(tmp_path)
    assert warnings[0]["bytes_truncated"] == 4096 and "bad header" in warnings[0]["reason"]
    assert_prefix(again, stored, 5)
    again.close()


def test_wrong_base_offset_is_detected_although_not_covered_by_the_crc(tmp_path):
    plog, stored = build(tmp_path, 5)
    path = active_file(plog)
    crash(plog)
    pos = os.path.getsize(path) - len(stored[-1]) - len(stored[-2])
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write((12345).to_bytes(8, "little"))
    with structlog.testing.capture_logs() as logs:
        again = PartitionLog(tmp_path / "t-3", "t", 3, CONFIG)
    (err,) = [e for e in logs if e["log_level"] == "error"]
    assert "expected 6" in err["reason"]
    assert_damage_kept(again, stored, 3)  # before issue 13: batch 4, valid, was cut too
    again.close()


def test_truncation_in_an_earlier_unflushed_segment_drops_the_later_ones(tmp_path):
    plog, stored = build(tmp_path, 60)
    assert plog.segment_count >= 3
    first_path = plog._segments[0].log_path
    crash(plog)
    # as if the crash came before any roll was checkpointed: recovery starts at the first segment
    (tmp_path / "t-3" / "checkpoint").unlink(missing_ok=True)
    os.truncate(first_path, os.path.getsize(first_path) - 10)
    per_segment = os.path.getsize(first_path) // len(stored[0])
    again, warnings = reopen(tmp_path)
    assert again.segment_count == 1
    events = [w["event"] for w in warnings]
    assert events[0] == "truncated log tail" and events.count("deleted segment after a truncated one") >= 2
    assert_prefix(again, stored, per_segment)
    again.close()


def test_bad_index_files_are_rebuilt(tmp_path):
    plog, stored = build(tmp_path, 60)
    plog.close()
    first = tmp_path / "t-3" / "00000000000000000000.index"
    first.write_bytes(os.urandom(20))  # not a whole number of entries
    second = sorted((tmp_path / "t-3").glob("*.index"))[1]
    second.write_bytes(b"\xff" * 16)  # positions beyond the segment
    (tmp_path / "t-3" / "00000000000000000000.timeindex").write_bytes(b"\x01" * 7)
    again, _ = reopen(tmp_path)
    assert again.recovery.clean
    for i, expected in enumerate(stored):
        assert again.read(2 * i + 1, 1) == expected
    assert again.offset_for_time(0) == 0  # append times approximated from the batch timestamps
    assert_prefix(again, stored, 60)
    again.close()


def test_unreadable_checkpoint_means_a_full_scan(tmp_path):
    plog, stored = build(tmp_path, 60)
    crash(plog)
    (tmp_path / "t-3" / "checkpoint").write_text("garbage")
    again, warnings = reopen(tmp_path)
    assert again.recovery.segments_scanned == again.segment_count >= 3
    assert any(w["event"] == "ignoring unreadable checkpoint file" for w in warnings)
    assert_prefix(again, stored, 60)
    again.close()


def test_corrupt_producer_snapshot_is_rebuilt_from_the_log(tmp_path):
    plog = PartitionLog(tmp_path / "t-3", "t", 3, CONFIG)
    for seq in range(0, 40, 2):
        plog.append(batch(seq, producer_id=5, producer_epoch=1, base_sequence=seq))
        if seq == 20:
            plog.roll()  # snapshots the producer state
    plog.close()
    # the state as of the log end travels in the clean-shutdown marker; roll snapshots are files
    damaged = [tmp_path / "t-3" / ".clean_shutdown", *(tmp_path / "t-3").glob("*.snapshot")]
    assert len(damaged) >= 2
    for path in damaged:
        path.write_bytes(path.read_bytes()[:-5])
    again, warnings = reopen(tmp_path)
    events = {w["event"] for w in warnings}
    assert "producer state in the clean-shutdown marker unreadable; rebuilding" in events
    assert "ignoring unreadable producer state snapshot" in events
    assert again.recovery.clean and again.recovery.producer_batches_replayed == 20
    dup = again.append(batch(38, producer_id=5, producer_epoch=1, base_sequence=38))
    assert dup.duplicate and dup.base_offset == 38
    again.close()


def read_all(plog: PartitionLog) -> bytes:
    out, offset = [], plog.log_start_offset
    while offset < plog.log_end_offset:
        chunk = plog.read(offset, 1 << 20)
        out.append(chunk)
        offset = records.decode_batches(chunk)[-1].header.last_offset + 1
    return b"".join(out)


def test_random_damage_never_serves_a_bad_batch_and_keeps_the_valid_ones(tmp_path):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    for round_ in range(15):
        path = tmp_path / f"r{round_}"
        plog = PartitionLog(path / "t-3", "t", 3, CONFIG)
        stored = []
        for _ in range(rng.randrange(1, 30)):
            info = plog.append(records.encode([os.urandom(rng.randrange(1, 300))], timestamp_ms=1))
            stored.append(plog.read(info.base_offset, 1))
        seg_path = active_file(plog)
        crash(plog)
        size = os.path.getsize(seg_path)
        with open(seg_path, "r+b") as f:
            action = rng.choice(["truncate", "flip", "append"])
            if action == "truncate":
                f.truncate(rng.randrange(size + 1))
            elif action == "flip" and size:
                pos = rng.randrange(size)
                f.seek(pos)
                b = f.read(1)[0]
                f.seek(pos)
                f.write(bytes([b ^ (1 << rng.randrange(8))]))
            else:
                f.seek(0, 2)
                f.write(os.urandom(rng.randrange(1, 200)))
        again = PartitionLog(path / "t-3", "t", 3, CONFIG)
        where = f"seed={seed} round={round_} action={action}"
        if again.status == "ok":
            # a torn tail was cut (or the damage hit nothing): a valid prefix, writable
            data = read_all(again)
            n = len(records.decode_batches(data))  # raises if any visible batch is bad
            assert data == b"".join(stored[:n]), where
            assert again.log_end_offset == n, where
            assert again.append(batch(1)).base_offset == n, where
        else:
            # damage in the middle: every batch but the damaged one is served intact, none bad
            assert action == "flip", where
            assert again.log_end_offset == len(stored), where
            bad = 0
            for offset, expected in enumerate(stored):
                try:
                    got = again.read(offset, 1)
                except CorruptLogError as e:
                    assert e.offset == offset, where
                    bad += 1
                    continue
                assert got == expected, where
            assert bad == 1, where
        again.close()


@pytest.mark.parametrize("flipped_to", [12345, 2])
def test_wrong_base_offset_after_a_clean_shutdown_is_never_served(tmp_path, flipped_to):
    """A clean restart skips the recovery scan, so the lazy check on read must catch a damaged
    base offset too: the CRC does not cover it (the broker patches it in place on append)."""
    plog, stored = build(tmp_path, 5)
    path = active_file(plog)
    plog.close()  # clean: the next open trusts the log up to its checkpoint
    pos = os.path.getsize(path) - len(stored[-1]) - len(stored[-2])  # batch 3, offsets 6..7
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(flipped_to.to_bytes(8, "little"))
    again, _ = reopen(tmp_path)
    assert again.read(4, 1) == stored[2]
    whole = again.read(0, 1 << 20)
    assert whole == b"".join(stored[:3])  # stops before the damaged batch
    with pytest.raises(CorruptLogError):
        again.read(6, 1 << 20)
    assert again.read(8, 1) == stored[4]  # the valid batch after it stays readable
    again.close()
