"""slice_records (dmq.broker.queue.manager): a pop hands out exactly the offsets it leases. Whole
batches inside the range pass byte for byte; a batch straddling a bound is cut to just the records
inside (records.slice_batch), keys, headers and timestamps kept."""

from __future__ import annotations

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
