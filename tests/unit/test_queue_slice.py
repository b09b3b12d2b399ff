"""slice_records (dmq.broker.queue.manager): a pop hands out exactly the offsets it leases. Whole
batches inside the range pass byte for byte; a batch straddling a bound is cut to just the records
inside (records.slice_batch), keys, headers and timestamps kept."""

from __future__ import annotations

import pytest

from dmq.broker.queue import manager
from dmq.broker.queue.manager import slice_records
from dmq.proto import records


def _batch(base: int, n: int, *, headers: bool = False) -> bytes:
    return records.encode(
        [b"v%d" % (base + i) for i in range(n)],
        keys=[None if i % 2 else b"k%d" % (base + i) for i in range(n)],
        headers=[(("h", b"%d" % (base + i)),) for i in range(n)] if headers else None,
        timestamps=[1_000 + base + i for i in range(n)],
        base_offset=base,
    )


def _records(data: bytes) -> list[records.Record]:
    return [r for b in records.decode_batches(data) for r in b]


def test_whole_batches_pass_unchanged() -> None:
    data = _batch(0, 5) + _batch(5, 5)
    assert slice_records(data, 0, 10) == data
    assert slice_records(data, 5, 10) == _batch(5, 5)


def test_straddling_batches_are_cut_to_the_range_with_every_field() -> None:
    data = _batch(0, 5, headers=True) + _batch(5, 5, headers=True) + _batch(10, 5, headers=True)
    out = _records(slice_records(data, 3, 12))
    assert [r.offset for r in out] == list(range(3, 12))
    full = {r.offset: r for r in _records(data)}
    assert all(r == full[r.offset] for r in out)  # value, key (None too), timestamp, headers


def test_a_range_inside_one_batch() -> None:
    out = _records(slice_records(_batch(100, 1000), 500, 501))
    assert [(r.offset, r.value, r.key) for r in out] == [(500, b"v500", b"k500")]


def test_a_few_records_of_a_large_batch_keep_every_field() -> None:
    data = _batch(0, 200, headers=True)
    full = {r.offset: r for r in _records(data)}
    for start, stop in ((0, 1), (7, 10), (199, 200)):
        out = _records(slice_records(data, start, stop))
        assert [r.offset for r in out] == list(range(start, stop))
        assert all(r == full[r.offset] for r in out)


class _Log:
    """What QueueManager's kept batches look at of a PartitionLog."""

    def __init__(self) -> None:
        self.rollback_epoch = 0
        self.log_start_offset = 0


def _manager() -> manager.QueueManager:
    q = manager.QueueManager.__new__(manager.QueueManager)  # no broker: only the kept-batch table
    q._cut, q._cut_bytes = {}, 0
    return q


def test_the_batch_a_lease_ends_inside_is_kept_until_the_log_changes() -> None:
    q, plog = _manager(), _Log()
    data = _batch(0, 10) + _batch(10, 10)
    out = q._slice("t", 0, plog, data, 0, 14, None)  # type: ignore[arg-type]
    assert [r.offset for r in _records(out)] == list(range(14))
    cut = q._cut_batch("t", 0, plog, 14)  # type: ignore[arg-type]
    assert cut is not None and cut.data == _batch(10, 10)
    # the next pop reads from it and gets the same records as from the log
    assert q._slice("t", 0, plog, cut.data, 14, 17, cut) == slice_records(data, 14, 17)  # type: ignore[arg-type]
    assert q._cut_batch("t", 0, plog, 17) is cut  # type: ignore[arg-type]
    assert q._cut_batch("t", 0, plog, 3) is None  # another group, elsewhere: not this batch
    q._keep_cut(("t", 0), cut)  # kept again: counted once
    assert q._cut_bytes == len(cut.data)
    assert q._cut_batch("t", 0, _Log(), 17) is None  # another log (the topic was re-created)
    assert not q._cut and q._cut_bytes == 0
    q._keep_cut(("t", 0), cut)
    plog.rollback_epoch += 1  # the log was cut back: the bytes may differ now
    assert q._cut_batch("t", 0, plog, 17) is None and not q._cut and q._cut_bytes == 0


def test_kept_batches_stay_within_their_byte_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manager, "CUT_BATCH_CACHE_BYTES", 4 * len(_batch(0, 100)))
    q, plog = _manager(), _Log()
    for partition in range(10):
        q._slice("t", partition, plog, _batch(0, 100), 0, 50, None)  # type: ignore[arg-type]
    assert len(q._cut) == 4 and q._cut_bytes == sum(len(c.data) for c in q._cut.values())
    assert sorted(p for _, p in q._cut) == [6, 7, 8, 9]  # the oldest went
