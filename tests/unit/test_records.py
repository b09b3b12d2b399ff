"""Record-batch codec: round trips, the exact wire layout, header patching, and every error path."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dmq.proto import records as r
from dmq.proto.records import (
    HEADER,
    HEADER_SIZE,
    BatchTooLargeError,
    Codec,
    CorruptBatchError,
    Record,
    RecordsError,
    RecordTooLargeError,
    TruncatedBatchError,
)

FIELDS = [
    "base_offset", "batch_length", "magic", "crc", "attributes", "record_count", "first_timestamp",
    "max_timestamp", "producer_id", "producer_epoch", "base_sequence", "body_length",
]


def rebuild(batch: bytes, body: bytes | None = None, *, fix_crc: bool = True, **fields: int) -> bytes:
    """A copy of `batch` with header fields and/or stored body replaced; CRC recomputed unless told."""
    h = dict(zip(FIELDS, HEADER.unpack_from(batch)))
    if body is None:
        body = batch[HEADER_SIZE:]
    elif "batch_length" not in fields:
        h["batch_length"] = HEADER_SIZE - 12 + len(body)
    h.update(fields)
    out = bytearray(HEADER.pack(*h.values()) + body)
    if fix_crc and "crc" not in fields:
        struct.pack_into("<I", out, 13, zlib.crc32(out[17:]))
    return bytes(out)


def body_of(batch: bytes) -> bytes:
    return batch[HEADER_SIZE:]


# --- exact layout ---------------------------------------------------------------------------------


def test_wire_layout_matches_the_documented_format_byte_for_byte():
    batch = r.encode(
        [b"v0", b"val1", b""],
        keys=[b"k", None, b"kk"],
        headers=[None, [("h\u00e9", None), ("x", b"12")], []],
        timestamps=[1000, 998, 1005],
        producer_id=7,
        producer_epoch=3,
        base_sequence=40,
        base_offset=99,
    )
    i32 = lambda *xs: struct.pack(f"<{len(xs)}i", *xs)  # noqa: E731
    record1_headers = b"\x02" + b"\x03h\xc3\xa9" + b"\x00" + b"\x01x" + b"\x0312"
    body = (
        i32(0, -2, 5)  # timestamp deltas from first_timestamp 1000
        + i32(0, 1, 1, 3)  # key offsets (null key: empty slot)
        + i32(0, 2, 6, 6)  # value offsets
        + i32(0, 0, len(record1_headers), len(record1_headers))  # header offsets
        + bytes([0b101])  # key validity, LSB first: records 0 and 2 have keys
        + b"kkk"
        + b"v0val1"
        + record1_headers
    )
    tail = struct.pack("<hiqqqhii", 0x10, 3, 1000, 1005, 7, 3, 40, len(body))
    crc = zlib.crc32(tail + body)
    expected = struct.pack("<qiBI", 99, HEADER_SIZE - 12 + len(body), 2, crc) + tail + body
    assert batch == expected


def test_header_struct_is_the_contract():
    assert HEADER.format == "<qiBIhiqqqhii"
    assert HEADER.size == HEADER_SIZE == 57
    assert r.MAGIC == 2
    assert [c.value for c in Codec] == [0, 1, 2]
    assert issubclass(RecordsError, ValueError)
    for cls in (TruncatedBatchError, CorruptBatchError, BatchTooLargeError, RecordTooLargeError):
        assert issubclass(cls, RecordsError)


# --- round trips ----------------------------------------------------------------------------------

header_lists = st.one_of(
    st.none(),
    st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=8))), max_size=3),
)


@st.composite
def batches(draw):
    n = draw(st.integers(1, 40))
    values = draw(st.lists(st.binary(max_size=40), min_size=n, max_size=n))
    keys = draw(st.one_of(st.none(), st.lists(st.one_of(st.none(), st.binary(max_size=10)), min_size=n, max_size=n)))
    headers = draw(st.one_of(st.none(), st.lists(header_lists, min_size=n, max_size=n)))
    first = draw(st.integers(0, 2**45))
    timestamps = draw(
        st.one_of(st.none(), st.lists(st.integers(first - 2**31, first + 2**31 - 1), min_size=n - 1, max_size=n - 1))
    )
    if timestamps is not None:
        timestamps = [first] + timestamps
    codec = draw(st.sampled_from(list(Codec)))
    return values, keys, headers, timestamps, codec


@settings(deadline=None, max_examples=150)
@given(batches(), st.integers(0, 2**40), st.integers(-1, 2**40))
def test_round_trip(spec, base_offset, producer_id):
    values, keys, headers, timestamps, codec = spec
    n = len(values)
    batch = r.encode(
        values, keys, headers, timestamps, timestamp_ms=1234, codec=codec, producer_id=producer_id,
        producer_epoch=5, base_sequence=17, base_offset=base_offset,
    )
    h = r.validate_batch(batch)
    assert h.total_size == len(batch)
    assert (h.record_count, h.base_offset, h.last_offset) == (n, base_offset, base_offset + n - 1)
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.last_sequence) == (producer_id, 5, 17, 17 + n - 1)
    assert h.codec == codec
    assert h.has_headers == any(headers or ())

    want_ts = timestamps if timestamps is not None else [1234] * n
    assert (h.first_timestamp, h.max_timestamp) == (want_ts[0], max(want_ts))
    want_keys = keys if keys is not None else [None] * n
    want_headers = [tuple(hs) if hs else () for hs in headers] if headers is not None else [()] * n
    expected = [
        Record(base_offset + i, want_ts[i], want_keys[i], values[i], want_headers[i]) for i in range(n)
    ]

    decoded = r.decode(batch)
    got = list(decoded)
    assert got == expected
    assert all(type(rec) is Record and type(rec.value) is bytes for rec in got)
    assert decoded.values() == values
    assert decoded.keys() == want_keys
    assert decoded.timestamps() == want_ts
    assert decoded.headers() == want_headers
    assert list(decoded) == expected  # iterating twice gives the same records
    assert len(decoded) == n


@settings(deadline=None, max_examples=60)
@given(batches())
def test_to_arrow_wraps_the_columns(spec):
    pa = pytest.importorskip("pyarrow")
    values, keys, _headers, timestamps, codec = spec
    n = len(values)
    batch = r.encode(values, keys, None, timestamps, timestamp_ms=5, codec=codec, base_offset=10)
    rb = r.decode(batch).to_arrow()
    rb.validate(full=True)
    assert rb.schema.names == ["offset", "timestamp", "key", "value"]
    assert rb.schema.field("key").type == pa.binary() and rb.schema.field("offset").type == pa.int64()
    assert rb.column("offset").to_pylist() == list(range(10, 10 + n))
    assert rb.column("timestamp").to_pylist() == (timestamps or [5] * n)
    assert rb.column("key").to_pylist() == (keys or [None] * n)
    assert rb.column("value").to_pylist() == values


def test_to_arrow_does_not_copy_values():
    pytest.importorskip("pyarrow")
    batch = bytearray(r.encode([b"abc", b"defg"], keys=[b"k", b"l"]))
    rb = r.decode(batch).to_arrow()
    value_data = rb.column("value").buffers()[2]
    i = batch.index(b"abcdefg")
    batch[i] = ord("X")  # the Arrow buffer is a view of the batch bytes
    assert value_data.to_pybytes()[:1] == b"X"


def test_keys_mixing_nulls_across_bitmap_bytes():
    n = 21
    keys = [None if i % 3 == 0 else bytes([i]) for i in range(n)]
    batch = r.decode(r.encode([b"v"] * n, keys=keys))
    assert bytes(batch.key_validity) == bytes([0b10110110, 0b01101101, 0b00011011])
    assert batch.keys() == keys


def test_raw_arrays_are_int32_views():
    batch = r.decode(r.encode([b"a", b"bc"], keys=[b"x", b"yz"], timestamps=[10, 13]))
    assert batch.timestamp_deltas.format == "i" and batch.timestamp_deltas.tolist() == [0, 3]
    assert batch.key_offsets.tolist() == [0, 1, 3]
    assert batch.value_offsets.tolist() == [0, 1, 3]
    assert batch.header_offsets is None
    assert bytes(batch.key_blob) == b"xyz" and bytes(batch.value_blob) == b"abc"
    assert bytes(batch.header_blob) == b""
    assert repr(batch) == "RecordBatch(offsets=0..1, records=2, codec=NONE, body_length=39)"


def test_iter_from_skips_records_before_the_offset():
    batch = r.decode(r.encode([b"a", b"b", b"c"], base_offset=100))
    assert [rec.value for rec in batch.iter_from(101)] == [b"b", b"c"]
    assert [rec.value for rec in batch.iter_from(50)] == [b"a", b"b", b"c"]
    assert list(batch.iter_from(103)) == []


def test_default_timestamp_is_now():
    import time

    before = time.time_ns() // 1_000_000
    h = r.read_header(r.encode([b"x"]))
    assert before <= h.first_timestamp == h.max_timestamp <= time.time_ns() // 1_000_000


def test_log_append_time_attribute_gives_every_record_max_timestamp():
    batch = r.encode([b"a", b"b"], timestamps=[5, 7])
    flagged = rebuild(batch, attributes=r.ATTR_LOG_APPEND_TIME, max_timestamp=99)
    assert [rec.timestamp for rec in r.decode(flagged)] == [99, 99]


@pytest.mark.parametrize("max_timestamp", [4, 6, 8])
def test_max_timestamp_must_be_the_largest_record_timestamp(max_timestamp):
    spread = r.encode([b"a", b"b"], timestamps=[5, 7])
    same = r.encode([b"a", b"b"], timestamps=[5, 5])
    for batch in (spread, same):
        if max_timestamp == r.read_header(batch).max_timestamp:
            continue
        bad = r.decode(rebuild(batch, max_timestamp=max_timestamp))
        with pytest.raises(CorruptBatchError, match=f"record timestamps span .* max_timestamp is {max_timestamp}"):
            list(bad)


def test_compression_shrinks_repetitive_bodies_and_levels_apply():
    values = [b"x" * 100] * 500
    plain = r.encode(values)
    for codec in (Codec.ZSTD, Codec.LZ4):
        small = r.encode(values, codec=codec)
        assert len(small) < len(plain) // 10
        assert r.decode(small).values() == values
    fast = r.encode(values, codec=Codec.ZSTD, compression_level=1)
    assert r.decode(fast).values() == values


def test_memoryview_and_bytearray_inputs_and_positions():
    a = r.encode([b"first"], base_offset=0)
    b = r.encode([b"second"], base_offset=1, codec=Codec.LZ4)
    buf = bytearray(a + b)
    assert r.decode(memoryview(buf), len(a)).values() == [b"second"]
    assert [x.values() for x in r.decode_batches(buf)] == [[b"first"], [b"second"]]
    assert r.decode_batches(b"") == []


# --- header-level API (the broker's) --------------------------------------------------------------


def test_patch_base_offset_keeps_the_crc_valid():
    a = r.encode([b"x"] * 3)
    b = r.encode([b"y"] * 2, codec=Codec.ZSTD)
    buf = bytearray(a + b)
    r.patch_base_offset(buf, 0, 1000)
    r.patch_base_offset(memoryview(buf), len(a), 1003)
    assert r.validate_batch(buf, 0).base_offset == 1000
    h = r.validate_batch(buf, len(a))
    assert (h.base_offset, h.last_offset) == (1003, 1004)
    assert [rec.offset for batch in r.decode_batches(buf) for rec in batch] == [1000, 1001, 1002, 1003, 1004]
    with pytest.raises(TruncatedBatchError):
        r.patch_base_offset(bytearray(7), 0, 1)


def test_count_records_sums_the_headers_of_concatenated_batches():
    batches = [r.encode([b"a"] * n) for n in (1, 7, 3)]
    assert r.count_records(b"".join(batches)) == 11
    assert r.count_records(b"") == 0
    assert r.count_records(batches[0][: r.HEADER_SIZE - 1]) == 0  # no whole header: nothing to count


def test_iter_headers_walks_concatenated_batches():
    parts = [r.encode([b"v"] * k, base_offset=10 * k, codec=Codec(k % 3)) for k in (1, 2, 3)]
    buf = b"".join(parts)
    got = list(r.iter_headers(buf))
    assert [pos for pos, _ in got] == [0, len(parts[0]), len(parts[0]) + len(parts[1])]
    assert [(h.base_offset, h.record_count) for _, h in got] == [(10, 1), (20, 2), (30, 3)]
    assert list(r.iter_headers(buf, len(parts[0]) + len(parts[1]))) == got[2:]
    assert list(r.iter_headers(b"")) == []


def test_iter_headers_yields_complete_batches_then_reports_the_torn_tail():
    a, b = r.encode([b"a"]), r.encode([b"b"])
    torn = a + b[:-3]
    it = r.iter_headers(torn)
    assert next(it)[0] == 0
    with pytest.raises(TruncatedBatchError, match=f"position {len(a)}"):
        next(it)


def test_read_header_needs_only_the_header_bytes():
    batch = r.encode([b"v" * 100])
    h = r.read_header(batch[:HEADER_SIZE])
    assert h.total_size == len(batch)
    with pytest.raises(TruncatedBatchError):
        r.validate_batch(batch[:HEADER_SIZE])


# --- error paths ------------------------------------------------------------------------------------

GOOD = r.encode([b"value-%d" % i for i in range(5)], keys=[b"k"] * 5, headers=[[("a", b"b")]] * 5)


@pytest.mark.parametrize("fn", [r.read_header, r.validate_batch, r.decode])
def test_truncated_header(fn):
    with pytest.raises(TruncatedBatchError, match="a header needs 57"):
        fn(GOOD[:56])
    with pytest.raises(TruncatedBatchError):
        fn(GOOD, len(GOOD))


@pytest.mark.parametrize("fn", [r.validate_batch, r.decode])
def test_truncated_body(fn):
    with pytest.raises(TruncatedBatchError, match=f"needs {len(GOOD)} bytes"):
        fn(GOOD[:-1])


@pytest.mark.parametrize(
    ("fields", "error", "match"),
    [
        ({"magic": 1}, CorruptBatchError, "magic 1, expected 2"),
        ({"record_count": 0}, CorruptBatchError, "record_count 0 must be >= 1"),
        ({"record_count": -5}, CorruptBatchError, "record_count -5"),
        ({"record_count": 10**6}, CorruptBatchError, "body_length .* too small for record_count"),
        ({"batch_length": 44}, CorruptBatchError, "batch_length 44 below the minimum 45"),
        ({"attributes": 0x80}, CorruptBatchError, "reserved bits"),
        ({"attributes": 0x13}, CorruptBatchError, "unknown codec 3"),
        ({"body_length": 10}, CorruptBatchError, "body_length 10"),
        ({"base_offset": 2**63 - 3}, CorruptBatchError, "overflows int64"),
        ({"body_length": 17 * 2**20}, BatchTooLargeError, "body_length 17825792 .* max_batch_bytes 16777216"),
        ({"batch_length": 17 * 2**20}, BatchTooLargeError, "total size .* max_batch_bytes 16777216"),
    ],
)
def test_bad_header_fields(fields, error, match):
    bad = rebuild(GOOD, **fields)
    for fn in (r.read_header, r.validate_batch, r.decode):
        with pytest.raises(error, match=match):
            fn(bad)


def test_uncompressed_body_length_must_match_the_stored_body():
    bad = rebuild(GOOD, body_length=len(body_of(GOOD)) - 1)
    with pytest.raises(CorruptBatchError, match="uncompressed body is .* but body_length says"):
        r.read_header(bad)


def test_bad_crc():
    bad = bytearray(GOOD)
    bad[-1] ^= 0x01
    r.read_header(bad)  # read_header does not look at the CRC
    with pytest.raises(CorruptBatchError, match="crc .* does not match"):
        r.validate_batch(bad)
    with pytest.raises(CorruptBatchError, match="crc"):
        r.decode(bad)
    assert r.decode(bad, verify_crc=False).values()[4] == b"value-4"


def test_max_batch_bytes_is_a_parameter():
    with pytest.raises(BatchTooLargeError, match=f"total size {len(GOOD)} bytes exceeds max_batch_bytes 100"):
        r.validate_batch(GOOD, max_batch_bytes=100)
    with pytest.raises(BatchTooLargeError):
        list(r.iter_headers(GOOD, max_batch_bytes=100))
    with pytest.raises(BatchTooLargeError):
        r.decode(GOOD, max_batch_bytes=100)


def _arrays(n: int, ko: list[int], vo: list[int], key_blob: bytes, value_blob: bytes, bitmap: bytes) -> bytes:
    return struct.pack(f"<{n}i", *[0] * n) + struct.pack(f"<{n + 1}i", *ko) + struct.pack(
        f"<{n + 1}i", *vo
    ) + bitmap + key_blob + value_blob


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (_arrays(3, [0, 2, 1, 3], [0, 1, 2, 3], b"abc", b"xyz", b"\x07"), "key_offsets are not monotonic"),
        (_arrays(3, [0, 0, 0, 0], [0, 2, 1, 3], b"", b"xyz", b"\x00"), "value_offsets are not monotonic"),
        (_arrays(3, [1, 1, 1, 1], [0, 1, 2, 3], b"", b"xyz", b"\x00"), r"key_offsets\[0\] is 1, must be 0"),
        (_arrays(3, [0, 0, 0, 0], [0, 1, 2, 9], b"", b"xyz", b"\x00"), r"value_offsets\[3\] = 9 runs past the body end"),
        (_arrays(3, [0, 0, 0, -4], [0, 1, 2, 3], b"", b"xyz", b"\x00"), r"key_offsets\[3\] = -4"),
        (_arrays(3, [0, 0, 0, 0], [0, 1, 2, 3], b"", b"xyz", b"\x00") + b"extra", "arrays and blobs take .* body_length is"),
    ],
)
def test_inconsistent_body(body, match):
    bad = rebuild(GOOD, body, attributes=0, record_count=3, body_length=len(body))
    with pytest.raises(CorruptBatchError, match=match):
        list(r.decode(bad))
    with pytest.raises(CorruptBatchError, match=match):
        r.decode(bad).to_arrow()


def test_values_whose_ends_look_one_size_are_cut_by_their_offsets():
    body = _arrays(4, [0] * 5, [0, 1, 1, 3, 4], b"", b"wxyz", b"\x00")
    batch = r.decode(rebuild(GOOD, body, attributes=0, record_count=4, body_length=len(body)))
    assert batch.values() == [b"w", b"", b"xy", b"z"]
    # the middle not monotonic
    body = _arrays(4, [0] * 5, [0, 1, 3, 2, 4], b"", b"wxyz", b"\x00")
    batch = r.decode(rebuild(GOOD, body, attributes=0, record_count=4, body_length=len(body)))
    with pytest.raises(CorruptBatchError, match="value_offsets are not monotonic"):
        batch.values()


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40), st.integers(0, 5), st.lists(st.integers(0, 3), max_size=3), st.data())
def test_values_round_trip_same_size_or_not(n, size, odd, data):
    """Values of one size (cut by one struct call) and with a few of another size (cut by offsets)."""
    values = [bytes([i % 256]) * size for i in range(n)]
    for grow in odd:
        i = data.draw(st.integers(0, n - 1))
        values[i] += b"+" * grow
    assert r.decode(r.encode(values)).values() == values
    assert [rec.value for rec in r.decode(r.encode(values))] == values


def test_monotonic_offsets_are_checked_on_first_use_not_in_decode():
    body = _arrays(3, [0, 2, 1, 3], [0, 1, 2, 3], b"abc", b"xyz", b"\x07")
    batch = r.decode(rebuild(GOOD, body, attributes=0, record_count=3, body_length=len(body)))
    assert batch.values() == [b"x", b"y", b"z"]
    with pytest.raises(CorruptBatchError, match="key_offsets are not monotonic"):
        batch.keys()


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        (b"\x01\x01", "runs past the end"),
        (b"\x01\x05ab", "key_length 5 runs past"),
        (b"\x01\x01\xff\x00", "not UTF-8"),
        (b"\x01\x01a\x09ab", "value_length 8 runs past"),
        (b"\x01\x01a\x00zz", "2 unused bytes"),
        (b"\x00", "header_count 0"),
        (b"\x01\x80\x80\x80\x80\x80\x01", "longer than 5 bytes"),
    ],
)
def test_corrupt_record_headers(entry, match):
    body = (
        struct.pack("<1i", 0) + struct.pack("<2i", 0, 0) + struct.pack("<2i", 0, 1)
        + struct.pack("<2i", 0, len(entry)) + b"\x00" + b"v" + entry
    )
    bad = rebuild(GOOD, body, attributes=r.ATTR_HAS_HEADERS, record_count=1, body_length=len(body))
    batch = r.decode(bad)
    with pytest.raises(CorruptBatchError, match=match):
        list(batch)


def _with_stored_body(codec: Codec, stored: bytes, body_length: int) -> bytes:
    return rebuild(GOOD, stored, attributes=int(codec) | r.ATTR_HAS_HEADERS, body_length=body_length)


def test_compressed_body_errors():
    import lz4.frame
    import zstandard

    body = body_of(GOOD)
    n = len(body)
    z = zstandard.ZstdCompressor().compress(body)
    cases = [
        (_with_stored_body(Codec.ZSTD, z, n + 1), "zstd frame content size .* does not match body_length"),
        (_with_stored_body(Codec.ZSTD, z + b"junk", n), "4 bytes after the zstd frame"),
        (_with_stored_body(Codec.ZSTD, z[:-3], n), "zstd"),
        (_with_stored_body(Codec.ZSTD, b"not zstd at all", n), "zstd"),
        (_with_stored_body(Codec.ZSTD, zstandard.ZstdCompressor(write_content_size=False).compress(body), n), "content size"),
        (_with_stored_body(Codec.LZ4, lz4.frame.compress(body), n - 1), "lz4 body does not end within body_length"),
        (_with_stored_body(Codec.LZ4, lz4.frame.compress(body) + b"xx", n), "2 bytes after the lz4 frame"),
        (_with_stored_body(Codec.LZ4, lz4.frame.compress(body)[:-6], n), "lz4"),
        (_with_stored_body(Codec.LZ4, b"garbage", n), "lz4"),
        (_with_stored_body(Codec.LZ4, lz4.frame.compress(body[:-1], store_size=False), n), "decompresses to"),
    ]
    for bad, match in cases:
        with pytest.raises(CorruptBatchError, match=match):
            r.decode(bad)


@pytest.mark.parametrize("codec", [Codec.ZSTD, Codec.LZ4])
def test_decompression_is_bounded_by_body_length(codec):
    """A small frame that inflates to 64 MiB claims a 1 KiB body: rejected without inflating it."""
    import lz4.frame
    import zstandard

    bomb_size = 64 * 2**20
    zeros = bytes(bomb_size)
    if codec == Codec.ZSTD:
        frame = zstandard.ZstdCompressor(write_content_size=False).compress(zeros)
        frames = [frame, zstandard.ZstdCompressor().compress(zeros)]
    else:
        frames = [lz4.frame.compress(zeros, store_size=False), lz4.frame.compress(zeros)]
    for frame in frames:
        assert len(frame) < 400_000
        bad = rebuild(GOOD, frame, attributes=int(codec), record_count=1, body_length=1024)
        with pytest.raises(CorruptBatchError):
            r.decode(bad)
        # and a claim above the limit is refused from the header alone
        bad = rebuild(GOOD, frame, attributes=int(codec), record_count=1, body_length=bomb_size)
        with pytest.raises(BatchTooLargeError, match="body_length 67108864"):
            r.decode(bad)


def test_encode_argument_errors():
    with pytest.raises(RecordsError, match="values is empty"):
        r.encode([])
    with pytest.raises(RecordsError, match="2 keys for 1 values"):
        r.encode([b"a"], keys=[b"a", b"b"])
    with pytest.raises(RecordsError, match="0 header lists for 1 values"):
        r.encode([b"a"], headers=[])
    with pytest.raises(RecordsError, match="2 timestamps for 1 values"):
        r.encode([b"a"], timestamps=[1, 2])
    with pytest.raises(RecordsError, match="within 2\\*\\*31 ms"):
        r.encode([b"a", b"b"], timestamps=[0, 2**31])
    with pytest.raises(RecordsError, match="within 2\\*\\*31 ms"):
        r.encode([b"a", b"b"], timestamps=[0, -(2**31) - 1])
    with pytest.raises(RecordsError, match="int milliseconds"):
        r.encode([b"a", b"b"], timestamps=[1, 2.5])  # type: ignore[list-item]
    with pytest.raises(RecordsError, match="bytes-like"):
        r.encode([b"a", None])  # type: ignore[list-item]
    with pytest.raises(RecordsError, match="bytes-like"):
        r.encode(["text"])  # type: ignore[list-item]
    with pytest.raises(RecordsError, match="unknown codec"):
        r.encode([b"a"], codec=7)  # type: ignore[arg-type]
    with pytest.raises(RecordsError, match="out of range"):
        r.encode([b"a"], producer_epoch=2**15)
    with pytest.raises(RecordsError, match="offsets are int32"):
        r.encode([b"a"], max_batch_bytes=2**31)


def test_record_too_large_names_the_record_and_the_limit():
    values = [b"x" * 10, b"y" * 10, b"z" * 10]
    r.encode(values, keys=[b"kk"] * 3, max_record_bytes=12)
    with pytest.raises(RecordTooLargeError, match="record 1: key \\+ value \\+ headers is 13 bytes, above max_record_bytes 12"):
        r.encode(values, keys=[b"kk", b"kkk", b""], max_record_bytes=12)
    with pytest.raises(RecordTooLargeError, match="record 2"):
        r.encode(values, headers=[None, None, [("a", b"")]], max_record_bytes=12)
    with pytest.raises(RecordTooLargeError, match="record 0: .* is 11 bytes"):
        r.encode([b"x" * 11], max_record_bytes=10)


def test_batch_too_large_names_the_limit():
    with pytest.raises(BatchTooLargeError, match="above max_batch_bytes 1000"):
        r.encode([b"x" * 100] * 10, max_batch_bytes=1000)
    # incompressible data grows slightly when compressed: the stored size is checked too
    import os

    values = [os.urandom(2000)]
    size = len(r.encode(values))
    assert len(r.encode(values, codec=Codec.LZ4)) > size
    with pytest.raises(BatchTooLargeError, match=f"batch is .* above max_batch_bytes {size}"):
        r.encode(values, codec=Codec.LZ4, max_batch_bytes=size)


def test_non_buffer_input_is_a_records_error():
    with pytest.raises(RecordsError, match="bytes-like"):
        r.decode("not bytes")  # type: ignore[arg-type]
    with pytest.raises(RecordsError, match="pos -1"):
        r.read_header(GOOD, -1)
