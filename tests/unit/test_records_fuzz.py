"""Hostile bytes into the record-batch decoders: only RecordsError subclasses may come out.

Each input goes through every entry point (read_header, validate_batch, iter_headers, decode with
and without CRC checks, full iteration and to_arrow). Mutated batches get their CRC recomputed too,
so the body checks are reached rather than stopped at the CRC.
"""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dmq.proto import records as r
from dmq.proto.records import HEADER_SIZE, Codec, RecordsError

try:
    import pyarrow
except ImportError:  # pragma: no cover - pyarrow is a dev dependency
    pyarrow = None

SMALL_LIMIT = 1 << 20  # keeps hostile size claims cheap to refuse


def consume(buf: bytes | bytearray) -> None:
    """Run every decoder over buf; any exception other than RecordsError fails the test."""
    for fn in (r.read_header, r.validate_batch):
        try:
            fn(buf, max_batch_bytes=SMALL_LIMIT)
        except RecordsError:
            pass
    try:
        list(r.iter_headers(buf, max_batch_bytes=SMALL_LIMIT))
    except RecordsError:
        pass
    for verify in (True, False):
        try:
            batches = r.decode_batches(buf, verify_crc=verify, max_batch_bytes=SMALL_LIMIT)
        except RecordsError:
            continue
        for batch in batches:
            try:
                records = list(batch)
            except RecordsError:
                continue
            assert len(records) == len(batch)
            assert all(type(rec.value) is bytes for rec in records)
            if pyarrow is not None:
                try:
                    rb = batch.to_arrow()
                except RecordsError:
                    continue
                rb.validate(full=True)  # offsets we accepted must be safe for Arrow to read


def with_fixed_crc(buf: bytearray) -> bytearray:
    if len(buf) >= HEADER_SIZE:
        struct.pack_into("<I", buf, 13, zlib.crc32(buf[17:]))
    return buf


def sample_batches() -> list[bytes]:
    out = []
    for codec in Codec:
        out.append(r.encode([b"a", b"bb", b""], codec=codec, timestamp_ms=1))
        out.append(
            r.encode(
                [b"value-%d" % i for i in range(11)],
                keys=[None if i % 4 == 0 else b"k%d" % i for i in range(11)],
                headers=[[("h\u00e9", None), ("n", b"%d" % i)] if i % 2 else None for i in range(11)],
                timestamps=[1000 + 7 * i - 30 * (i % 3) for i in range(11)],
                codec=codec,
                producer_id=5,
                producer_epoch=1,
                base_sequence=9,
            )
        )
    return out


SAMPLES = sample_batches()
FUZZ = settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes(data):
    consume(data)


@FUZZ
@given(st.binary(max_size=200), st.sampled_from(SAMPLES))
def test_random_body_under_a_valid_looking_header(data, sample):
    """Headers are valid, the rest is noise: reaches the body and decompression checks."""
    buf = bytearray(sample[:HEADER_SIZE] + data)
    struct.pack_into("<i", buf, 8, len(buf) - 12)
    consume(bytes(with_fixed_crc(buf)))


@FUZZ
@given(
    st.sampled_from(SAMPLES),
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 7)), min_size=1, max_size=4),
    st.booleans(),
)
def test_bit_flips(sample, flips, fix_crc):
    buf = bytearray(sample)
    for where, bit in flips:
        buf[where % len(buf)] ^= 1 << bit
    consume(bytes(with_fixed_crc(buf) if fix_crc else buf))


@FUZZ
@given(st.sampled_from(SAMPLES), st.integers(0, 10**6), st.binary(min_size=1, max_size=8), st.booleans())
def test_overwrites(sample, where, patch, fix_crc):
    buf = bytearray(sample)
    where %= len(buf)
    buf[where : where + len(patch)] = patch
    consume(bytes(with_fixed_crc(buf) if fix_crc else buf))


@FUZZ
@given(st.sampled_from(SAMPLES), st.integers(0, 10**6), st.booleans())
def test_truncations_and_concatenations(sample, cut, fix_crc):
    cut %= len(sample)
    torn = bytearray(sample[:cut])
    consume(bytes(with_fixed_crc(torn) if fix_crc else torn))
    consume(sample + sample[:cut])
    with pytest.raises(RecordsError):
        r.validate_batch(sample[:cut])


@pytest.mark.parametrize("sample", SAMPLES, ids=range(len(SAMPLES)))
def test_samples_are_valid(sample):
    """The mutation tests start from good batches (otherwise they would test nothing useful)."""
    consume(sample)
    assert len(list(r.decode(sample))) == r.read_header(sample).record_count


HEADER_CHARS = r.HEADER.format.lstrip("<")


def _field(fmt: str) -> st.SearchStrategy[int]:
    bits = struct.calcsize(fmt) * 8
    lo, hi = (0, 2**bits - 1) if fmt.isupper() else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    # edges and small values find more bugs than uniform draws over 64 bits
    return st.one_of(
        st.integers(lo, hi), st.sampled_from([lo, hi, 0, 1, 2]), st.integers(max(lo, -64), min(hi, 300))
    )


@FUZZ
@given(st.sampled_from(SAMPLES), st.data())
def test_random_header_fields_over_a_real_body(sample, data):
    """Every header field drawn at random (magic kept at 2 half the time), CRC recomputed."""
    fields = [data.draw(_field(f"<{c}"), label=c) for c in HEADER_CHARS]
    if data.draw(st.booleans(), label="keep magic"):
        fields[2] = 2
    buf = bytearray(r.HEADER.pack(*fields) + sample[HEADER_SIZE:])
    consume(bytes(with_fixed_crc(buf)))

