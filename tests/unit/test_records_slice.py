"""records.slice_batch: some records of a batch as a batch of their own (what a queue pop hands
out when its lease ends inside a stored batch). The cut batch must decode, CRC checked, to exactly
those records (offset, timestamp, key, value, headers); from hostile bytes only RecordsError may
come out, and a batch whose records decode must never be cut into different ones."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dmq.proto import records as r
from dmq.proto.records import ATTR_LOG_APPEND_TIME, HEADER_SIZE, Codec, RecordsError

FUZZ = settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])

_keys = st.one_of(st.none(), st.binary(max_size=12))
_headers = st.one_of(
    st.none(), st.lists(st.tuples(st.text(min_size=1, max_size=5), st.one_of(st.none(), st.binary(max_size=6))), max_size=3)
)


@st.composite
def batches(draw: st.DrawFn) -> tuple[bytes, list[r.Record]]:
    """(a batch, its records as decode() builds them)."""
    n = draw(st.integers(1, 40))
    values = draw(st.lists(st.binary(max_size=20), min_size=n, max_size=n))
    keys = draw(st.one_of(st.none(), st.lists(_keys, min_size=n, max_size=n)))
    headers = draw(st.one_of(st.none(), st.lists(_headers, min_size=n, max_size=n)))
    first = draw(st.integers(0, 2**40))
    timestamps = draw(
        st.one_of(st.none(), st.lists(st.integers(first - 2**20, first + 2**20), min_size=n, max_size=n))
    )
    data = r.encode(
        values, keys=keys, headers=headers, timestamps=timestamps, timestamp_ms=first,
        codec=draw(st.sampled_from(Codec)), base_offset=draw(st.integers(0, 2**40)),
        producer_id=7, producer_epoch=1, base_sequence=3,
    )
    if draw(st.booleans()):  # log append time: every record's timestamp is max_timestamp
        buf = bytearray(data)
        attributes = struct.unpack_from("<h", buf, 17)[0] | ATTR_LOG_APPEND_TIME
        struct.pack_into("<h", buf, 17, attributes)
        struct.pack_into("<q", buf, 31, draw(st.integers(0, 2**40)))
        struct.pack_into("<I", buf, 13, zlib.crc32(buf[17:]))
        data = bytes(buf)
    return data, list(r.decode(data))


@FUZZ
@given(batches(), st.data())
def test_a_cut_batch_holds_exactly_the_records_in_its_range(sample: tuple[bytes, list[r.Record]], data: st.DataObject) -> None:
    raw, full = sample
    base, n = full[0].offset, len(full)
    start = data.draw(st.integers(base - 3, base + n - 1))
    stop = data.draw(st.integers(max(start, base) + 1, base + n + 3))
    cut = r.slice_batch(r.decode(raw), start, stop)
    (batch,) = r.decode_batches(cut)  # CRC checked
    assert list(batch) == [rec for rec in full if start <= rec.offset < stop]
    h = batch.header
    assert h.codec == Codec.NONE and h.producer_id == -1 and h.base_sequence == -1
    assert h.max_timestamp == max(rec.timestamp for rec in batch)
    if not h.log_append_time:
        assert h.first_timestamp == batch.record_at(h.base_offset).timestamp
    r.validate_batch(cut)


def test_a_range_without_records_of_the_batch_is_refused() -> None:
    batch = r.decode(r.encode([b"a", b"b"], base_offset=10))
    for start, stop in ((0, 10), (12, 20), (11, 11)):
        with pytest.raises(RecordsError):
            r.slice_batch(batch, start, stop)


def test_a_cut_of_a_large_batch_is_the_same_as_encoding_its_records() -> None:
    values = [b"%05d" % i * 20 for i in range(10_000)]
    raw = r.encode(values, keys=[b"k%d" % i if i % 3 else None for i in range(10_000)], timestamp_ms=5, base_offset=100)
    cut = r.slice_batch(r.decode(raw), 3_100, 4_100)
    part = [rec for rec in r.decode(raw) if 3_100 <= rec.offset < 4_100]
    assert cut == r.encode(
        [p.value for p in part], keys=[p.key for p in part], timestamps=[p.timestamp for p in part], base_offset=3_100
    )


def _with_fixed_crc(buf: bytearray) -> bytes:
    struct.pack_into("<I", buf, 13, zlib.crc32(buf[17:]))
    return bytes(buf)


@FUZZ
@given(batches(), st.data())
def test_hostile_bodies_never_get_out_as_other_records(sample: tuple[bytes, list[r.Record]], data: st.DataObject) -> None:
    """Overwrite body bytes (CRC fixed, so the body checks are reached): slicing raises only
    RecordsError, and when the mutated batch still decodes whole, the cut holds its records."""
    raw, _ = sample
    buf = bytearray(raw)
    if len(buf) <= HEADER_SIZE:
        return
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(HEADER_SIZE, len(buf) - 1))
        buf[at] = data.draw(st.integers(0, 255))
    mutated = _with_fixed_crc(buf)
    try:
        batch = r.decode(mutated)
    except RecordsError:
        return
    try:
        whole = list(batch)
    except RecordsError:
        whole = None
    base, n = batch.header.base_offset, batch.header.record_count
    start = data.draw(st.integers(base, base + n - 1))
    stop = data.draw(st.integers(start + 1, base + n))
    try:
        cut = r.slice_batch(batch, start, stop)
    except RecordsError:
        assert whole is None  # a batch whose records all decode is cut without complaint
        return
    try:
        got = list(r.decode(cut))
    except RecordsError:
        assert whole is None  # only a batch that was corrupt already may give a corrupt cut
        return
    if whole is not None:
        assert got == [rec for rec in whole if start <= rec.offset < stop]


@FUZZ
@given(batches(), st.integers(-(2**63), 2**63 - 1), st.integers(-(2**63), 2**63 - 1), st.data())
def test_hostile_timestamps_in_the_header(
    sample: tuple[bytes, list[r.Record]], first: int, largest: int, data: st.DataObject
) -> None:
    """first_timestamp / max_timestamp rewritten (CRC fixed): RecordsError or the records the batch decodes to."""
    buf = bytearray(sample[0])
    struct.pack_into("<qq", buf, 23, first, largest)
    batch = r.decode(_with_fixed_crc(buf))
    try:
        whole: list[r.Record] | None = list(batch)
    except RecordsError:
        whole = None
    base, n = batch.header.base_offset, batch.header.record_count
    start = data.draw(st.integers(base, base + n - 1))
    try:
        cut = r.slice_batch(batch, start, base + n)
    except RecordsError:
        assert whole is None
        return
    if whole is not None:
        assert list(r.decode(cut)) == whole[start - base :]
