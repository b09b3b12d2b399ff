"""RecordSequence (dmq.client.records), a queue lease's records: the same records, in the same
order, as building every ConsumerRecord up front (consumer_records over the batches), and it
behaves as the tuple it replaced (indexing, slices, equality, hash, len)."""

from __future__ import annotations

import gc
from collections import deque
from operator import length_hint

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dmq.client.records import ConsumerRecord, RecordSequence, consumer_records
from dmq.proto import records as r

FUZZ = settings(deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def batch_runs(draw: st.DrawFn) -> list[bytes]:
    """1-4 consecutive batches of one partition, each with or without keys, headers, timestamps."""
    offset = draw(st.integers(0, 2**40))
    out = []
    for _ in range(draw(st.integers(1, 4))):
        n = draw(st.integers(1, 12))
        out.append(
            r.encode(
                [b"v%d" % (offset + i) for i in range(n)],
                keys=draw(st.one_of(st.none(), st.lists(st.one_of(st.none(), st.binary(max_size=4)), min_size=n, max_size=n))),
                headers=draw(st.one_of(st.none(), st.just([[("h", b"%d" % i)] if i % 2 else None for i in range(n)]))),
                timestamps=draw(st.one_of(st.none(), st.lists(st.integers(0, 10**12), min_size=n, max_size=n).filter(
                    lambda ts: max(ts) - ts[0] < 2**31 and ts[0] - min(ts) <= 2**31))),
                base_offset=offset,
            )
        )
        offset += n + draw(st.sampled_from([0, 0, 0, 5]))  # a gap between batches now and then
    return out


def _eager(topic: str, partition: int, data: list[bytes], start: int, stop: int) -> tuple[ConsumerRecord, ...]:
    out: list[ConsumerRecord] = []
    for raw in data:
        out.extend(rec for rec in consumer_records(topic, partition, r.decode(raw), start) if rec.offset < stop)
    return tuple(out)


@FUZZ
@given(batch_runs(), st.data())
def test_the_same_records_as_building_them_up_front(data: list[bytes], draw: st.DataObject) -> None:
    first = r.read_header(data[0]).base_offset
    last = r.read_header(data[-1]).last_offset
    start = draw.draw(st.integers(first - 2, last))
    stop = draw.draw(st.integers(start, last + 3))
    seq = RecordSequence("t", 3, [r.decode(raw) for raw in data], start, stop)
    eager = _eager("t", 3, data, start, stop)
    assert tuple(seq) == eager and len(seq) == len(eager)
    assert seq == eager and hash(seq) == hash(eager)
    assert all(type(rec) is ConsumerRecord for rec in seq)
    for i in (0, len(eager) // 2, -1):
        if eager:
            assert seq[i] == eager[i]
    assert seq[1:] == eager[1:] and seq[::-2] == eager[::-2] and list(reversed(seq)) == list(reversed(eager))
    assert type(seq[1:]) is RecordSequence and seq[1:][1:3] == eager[2:4] and len(seq[5:5]) == 0


@FUZZ
@given(batch_runs(), st.data())
def test_cursor_counts_the_records_left_and_ends_the_iterator(data: list[bytes], draw: st.DataObject) -> None:
    """cursor(): the records iterator gives the sequence's records; its cursor's length_hint is
    how many are left at every step, and exhausting the cursor ends the records iterator."""
    seq = RecordSequence("t", 3, [r.decode(raw) for raw in data], 0, 2**41)
    whole = draw.draw(st.sampled_from([seq, seq[1:], seq[::2]]))
    rows, left = whole.cursor()
    taken = draw.draw(st.integers(0, len(whole)))
    assert length_hint(left) == len(whole)
    for i in range(taken):
        assert next(rows) == whole[i] and length_hint(left) == len(whole) - i - 1
    deque(left, maxlen=0)
    assert list(rows) == [] and length_hint(left) == 0


def test_out_of_range_index_and_comparisons() -> None:
    def batch() -> r.RecordBatch:  # one timestamp: two encodes a millisecond apart made unequal records
        return r.decode(r.encode([b"a", b"b"], base_offset=7, timestamp_ms=1_000))

    seq = RecordSequence("t", 0, [batch()], 7, 9)
    with pytest.raises(IndexError):
        seq[2]
    assert seq[-2].value == b"a" and seq[1].offset == 8
    # equal to a list of the same records too: consume() and poll() returned lists before
    assert seq == [seq[0], seq[1]] and [seq[0], seq[1]] == seq and seq != [seq[0]] and seq != [seq[1], seq[0]]
    assert RecordSequence("t", 0, [], 0, 0) == [] and [] == RecordSequence("t", 0, [], 0, 0)
    assert seq == RecordSequence("t", 0, [batch()], 7, 9)
    assert seq != RecordSequence("t", 0, [batch()], 7, 8)
    assert not RecordSequence("t", 0, [], 0, 0) and "2 records of t[0], offsets 7..8" in repr(seq)


def test_iterating_sets_off_no_garbage_collection() -> None:
    """The reason for the type: records built as a loop reaches them are freed before the next,
    so a loop over 10,000 records does not run the collector; keeping them all (a tuple, as a
    lease held before) runs it over and over."""
    data = r.encode([b"x" * 100] * 10_000, timestamp_ms=1)
    seq = RecordSequence("t", 0, [r.decode(data)], 0, 10_000)
    runs: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            runs.append(info["generation"])

    gc.collect()
    gc.callbacks.append(count)
    try:
        total = sum(len(rec.value) for rec in seq)
        lazy = len(runs)
        kept = tuple(seq)
    finally:
        gc.callbacks.remove(count)
    assert total == 1_000_000 and len(kept) == 10_000
    assert lazy == 0
    assert len(runs) >= 10  # the control: 10,000 records kept alive


@FUZZ
@given(st.integers(1, 40), st.integers(0, 30), st.one_of(st.none(), st.integers(0, 39)), st.integers(0, 30))
def test_values_of_one_size_and_of_many_decode_alike(n: int, size: int, odd: int | None, odd_size: int) -> None:
    """values() cuts values of one size with one struct call (a fast path): the same bytes as the
    per-record cut, and a single value of another size anywhere falls back to it."""
    values = [bytes([i % 256]) * size for i in range(n)]
    if odd is not None and odd < n:
        values[odd] = b"z" * odd_size
    batch = r.decode(r.encode(values))
    assert batch.values() == values and [rec.value for rec in batch] == values
    assert all(type(v) is bytes for v in batch.values())
