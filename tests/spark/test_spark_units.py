"""The Spark source's pure parts, without a Spark session: options, planning maths, Arrow building."""

from __future__ import annotations

import pickle
import struct
import zlib

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dmq.client.spark.arrow import ArrowBuilder, arrow_schema, source_schema
from dmq.client.spark.options import (
    OffsetSpec,
    OptionError,
    SinkOptions,
    parse_sink_options,
    parse_source_options,
)
from dmq.client.spark.reader import (
    DMQStreamReader,
    FetchSizer,
    OffsetRange,
    ReadSettings,
    from_json,
    rate_limit,
    split_ranges,
    to_json,
)
from dmq.client.spark.sink import check_sink_schema
from dmq.proto import records

BOOT = {"bootstrap": "127.0.0.1:9092"}


# -- options -----------------------------------------------------------------------------------


def test_source_defaults_follow_the_kafka_source():
    batch = parse_source_options({**BOOT, "subscribe": "a, b,a"}, streaming=False)
    assert batch.topics == ("a", "b")
    assert (batch.starting, batch.ending) == (OffsetSpec("earliest"), OffsetSpec("latest"))
    assert (batch.include_headers, batch.fail_on_data_loss) == (False, True)
    stream = parse_source_options({**BOOT, "subscribe": "a"}, streaming=True)
    assert stream.starting == OffsetSpec("latest")


def test_options_are_case_insensitive_and_typed():
    opts = parse_source_options(
        {
            "BOOTSTRAP": "h:1",
            "assign": '{"t": [2, 0, 2]}',
            "startingoffsets": '{"t": {"0": 5, "2": -2}}',
            "MaxOffsetsPerTrigger": "10",
            "minPartitions": "4",
            "includeHeaders": "TRUE",
            "failOnDataLoss": "false",
            "groupId": "app",
            "checkpointLocation": "/tmp/x",  # Spark's own, ignored
        },
        streaming=True,
    )
    assert opts.assign == {"t": (0, 2)}
    assert opts.starting == OffsetSpec("specific", {("t", 0): 5, ("t", 2): -2})
    assert (opts.max_offsets_per_trigger, opts.min_partitions) == (10, 4)
    assert (opts.include_headers, opts.fail_on_data_loss, opts.group_id) == (True, False, "app")
    assert parse_source_options({**BOOT, "subscribe": "a", "startingTimestamp": "123"}, streaming=False).starting == (
        OffsetSpec("timestamp", timestamp_ms=123)
    )


@pytest.mark.parametrize(
    ("options", "streaming", "message"),
    [
        ({"subscribe": "a"}, False, "'bootstrap' is required"),
        ({"bootstrap": "nohost", "subscribe": "a"}, False, "must be host:port"),
        ({**BOOT}, False, "exactly one of the options 'subscribe'"),
        ({**BOOT, "subscribe": "a,,b"}, False, "comma-separated list"),
        ({**BOOT, "assign": "[1]"}, False, "JSON object of topic -> partitions"),
        ({**BOOT, "assign": '{"a": [-1]}'}, False, "partition numbers >= 0"),
        ({**BOOT, "assign": "{bad"}, False, "not valid JSON"),
        ({**BOOT, "subscribe": "a", "startingOffsets": "latest"}, False, "cannot be latest in a batch"),
        ({**BOOT, "subscribe": "a", "startingOffsets": '{"a": {"0": -1}}'}, False, "cannot be latest \\(-1\\)"),
        ({**BOOT, "subscribe": "a", "endingOffsets": "earliest"}, False, "'endingOffsets' cannot be earliest"),
        ({**BOOT, "subscribe": "a", "endingOffsets": '{"a": {"0": -2}}'}, False, "cannot be earliest \\(-2\\)"),
        ({**BOOT, "subscribe": "a", "startingOffsets": "soon"}, False, "must be 'earliest', 'latest'"),
        ({**BOOT, "subscribe": "a", "startingOffsets": '{"b": {"0": 1}}'}, False, "names topics that are not read"),
        ({**BOOT, "subscribe": "a", "startingOffsets": '{"a": {"x": 1}}'}, False, "is not a number"),
        ({**BOOT, "subscribe": "a", "startingOffsets": '{"a": {"0": -3}}'}, False, "integer >= 0"),
        ({**BOOT, "assign": '{"a": [0, 1]}', "startingOffsets": '{"a": {"0": 1}}'}, False, "missing: a\\[1\\]"),
        ({**BOOT, "subscribe": "a", "startingOffsets": "earliest", "startingTimestamp": "1"}, False, "contradict"),
        ({**BOOT, "subscribe": "a", "endingOffsets": "latest", "endingTimestamp": "1"}, False, "contradict"),
        ({**BOOT, "subscribe": "a", "startingTimestamp": "-5"}, False, "must be >= 0"),
        ({**BOOT, "subscribe": "a", "endingOffsets": "latest"}, True, "for batch queries only"),
        ({**BOOT, "subscribe": "a", "endingTimestamp": "5"}, True, "for batch queries only"),
        ({**BOOT, "subscribe": "a", "maxOffsetsPerTrigger": "5"}, False, "for streaming queries only"),
        ({**BOOT, "subscribe": "a", "groupId": "g"}, False, "for streaming queries only"),
        ({**BOOT, "subscribe": "a", "maxOffsetsPerTrigger": "0"}, True, "must be >= 1"),
        ({**BOOT, "subscribe": "a", "minPartitions": "many"}, False, "must be an integer"),
        ({**BOOT, "subscribe": "a", "includeHeaders": "yes"}, False, "'true' or 'false'"),
        ({**BOOT, "subscribe": "a", "topic": "x"}, False, "'topic' is not a source option"),
        ({**BOOT, "subscribe": "a", "kafka.bootstrap.servers": "x"}, False, "repeats 'bootstrap'"),
        ({"bootstrap": "h:1,h:2", "subscribe": "a"}, False, "takes one address"),
        ({**BOOT, "subscribe": "a", "kafka.group.id": "x"}, False, "does not apply to DMQ.*groupId"),
    ],
)
def test_bad_source_options(options, streaming, message):
    with pytest.raises(OptionError, match=message):
        parse_source_options(options, streaming=streaming)


def test_the_address_option_takes_the_client_and_kafka_names():
    for name in ("bootstrap_servers", "kafka.bootstrap.servers", "bootstrap.servers", "BOOTSTRAP_SERVERS"):
        assert parse_source_options({name: "h:1", "subscribe": "a"}, streaming=False).bootstrap == "h:1"
        assert parse_sink_options({name: "h:1", "topic": "t"}).bootstrap == "h:1"


def test_security_options_become_client_keywords_and_hide_the_token():
    opts = parse_source_options({**BOOT, "subscribe": "a", "SSLCAFILE": "/ca.pem", "sslCertfile": "/c.pem",
                                 "sslKeyfile": "/c.key", "token": "tok.en.value"}, streaming=False)
    assert dict(opts.credentials) == {"ssl_cafile": "/ca.pem", "ssl_certfile": "/c.pem", "ssl_keyfile": "/c.key",
                                      "token": "tok.en.value"}
    settings = ReadSettings.of(opts)
    assert settings.credentials == opts.credentials  # travels to the executors with the plan
    assert pickle.loads(pickle.dumps(settings)) == settings
    assert "tok.en.value" not in repr(opts) + repr(settings)
    assert parse_source_options({**BOOT, "subscribe": "a"}, streaming=False).credentials == ()
    sink = parse_sink_options({**BOOT, "topic": "t", "token": "x.y.z"})
    assert dict(sink.credentials) == {"token": "x.y.z"} and "x.y.z" not in repr(sink)


@pytest.mark.parametrize(("options", "message"), [
    ({"sslCertfile": "/c.pem"}, "'sslCertfile' and 'sslKeyfile' go together"),
    ({"sslKeyfile": "/c.key"}, "'sslCertfile' and 'sslKeyfile' go together"),
    ({"token": " "}, "'token' must not be empty"),
    ({"sslCafile": ""}, "'sslCafile' must not be empty"),
])
def test_bad_security_options(options, message):
    with pytest.raises(OptionError, match=message):
        parse_source_options({**BOOT, "subscribe": "a", **options}, streaming=False)
    with pytest.raises(OptionError, match=message):
        parse_sink_options({**BOOT, "topic": "t", **options})


def test_security_options_override_the_environment_setting_by_setting(monkeypatch):
    from dmq.client._security import client_security

    monkeypatch.setenv("DMQ_TOKEN", "from.the.env")
    monkeypatch.setenv("DMQ_SSL_CAFILE", "/env-ca.pem")
    opts = parse_source_options({**BOOT, "subscribe": "a", "token": "from.the.option"}, streaming=False)
    security = client_security(dict(opts.credentials))  # what SourceClient and PartitionFetcher use
    assert (security.token, security.ssl_cafile) == ("from.the.option", "/env-ca.pem")


def test_sink_options():
    assert parse_sink_options({**BOOT, "topic": "t", "compression": "ZSTD", "lingerMs": "3"}) == SinkOptions(
        "127.0.0.1:9092", "t", "zstd", 3, None
    )
    with pytest.raises(OptionError, match="'subscribe' is not a sink option"):
        parse_sink_options({**BOOT, "subscribe": "t"})
    with pytest.raises(OptionError, match="compression"):
        parse_sink_options({**BOOT, "compression": "gzip"})


def test_sink_schema_checks():
    from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructField, StructType

    def schema(*fields: tuple[str, object]) -> StructType:
        return StructType([StructField(name, t) for name, t in fields])  # type: ignore[arg-type]

    def headers(key: str, value: str) -> ArrayType:
        return ArrayType(StructType([StructField(key, StringType()), StructField(value, BinaryType())]))

    opts = SinkOptions("h:1", "t")
    check_sink_schema(schema(("value", StringType()), ("key", BinaryType()), ("partition", IntegerType())), opts)
    check_sink_schema(
        schema(("value", BinaryType()), ("topic", StringType()), ("headers", headers("key", "value"))),
        SinkOptions("h:1"),
    )
    with pytest.raises(OptionError, match="'headers' must be array<struct<key:string,value:binary>>"):
        check_sink_schema(schema(("value", BinaryType()), ("headers", headers("k", "v"))), opts)
    with pytest.raises(OptionError, match="'partition' must be"):
        check_sink_schema(schema(("value", BinaryType()), ("partition", StringType())), opts)


# -- planning ----------------------------------------------------------------------------------


def test_split_ranges_like_kafka():
    ranges = [OffsetRange("t", 0, 0, 90, "h:1"), OffsetRange("t", 1, 5, 15, "h:1"), OffsetRange("t", 2, 7, 7)]
    assert split_ranges(ranges, None) == ranges[:2]  # empty ranges are dropped
    pieces = split_ranges(ranges, 10)
    assert [(r.partition, r.start, r.until) for r in pieces] == [
        (0, 0, 10), (0, 10, 20), (0, 20, 30), (0, 30, 40), (0, 40, 50), (0, 50, 60), (0, 60, 70), (0, 70, 80),
        (0, 80, 90), (1, 5, 15),
    ]
    assert all(r.leader == "h:1" for r in pieces)
    assert split_ranges(ranges, 2) == ranges[:2]


@settings(deadline=None, max_examples=200)
@given(
    sizes=st.lists(st.integers(0, 10_000), min_size=1, max_size=8),
    min_partitions=st.integers(1, 64),
)
def test_split_ranges_cover_each_range_exactly(sizes, min_partitions):
    ranges = [OffsetRange("t", p, 100, 100 + n) for p, n in enumerate(sizes)]
    pieces = split_ranges(ranges, min_partitions)
    for r in ranges:
        mine = [x for x in pieces if x.partition == r.partition]
        covered = [o for x in mine for o in range(x.start, x.until)]
        assert covered == list(range(r.start, r.until))


@settings(deadline=None, max_examples=300)
@given(
    backlog=st.dictionaries(st.integers(0, 6), st.tuples(st.integers(0, 1000), st.integers(0, 1000)), min_size=1),
    max_rows=st.integers(1, 3000),
)
def test_rate_limit_takes_at_most_max_rows_and_never_moves_back(backlog, max_rows):
    start = {("t", p): a for p, (a, _) in backlog.items()}
    end = {("t", p): a + n for p, (a, n) in backlog.items()}
    limited = rate_limit(start, end, max_rows)
    taken = {tp: limited[tp] - start[tp] for tp in end}
    assert all(0 <= taken[tp] <= end[tp] - start[tp] for tp in end)
    total = sum(end[tp] - start[tp] for tp in end)
    assert sum(taken.values()) == min(max_rows, total)


def test_fetch_sizer_asks_for_the_rows_left_not_the_whole_limit():
    limit = 16 * 1024 * 1024
    sizer = FetchSizer(limit)
    # nothing seen yet: a guess per row, at least MIN_BYTES, at most the limit
    assert sizer.next_bytes(1) == FetchSizer.MIN_BYTES
    assert sizer.next_bytes(10_000) == 10_000 * FetchSizer.GUESS_BYTES_PER_RECORD
    assert sizer.next_bytes(10**9) == limit
    # 1000 records of 1 KiB in 10 batches seen: rows left x 1 KiB + one average batch
    sizer.observe(1_024_000, 1000, 10)
    assert sizer.next_bytes(500) == 500 * 1024 + 102_400
    assert sizer.next_bytes(0) == 102_400
    assert sizer.next_bytes(10**6) == limit
    # a limit below MIN_BYTES is still the limit
    assert FetchSizer(4096).next_bytes(1) == 4096


@settings(deadline=None, max_examples=300)
@given(
    limit=st.integers(1024, 64 * 1024 * 1024),
    seen=st.lists(st.tuples(st.integers(1, 2**24), st.integers(1, 10**5), st.integers(1, 100)), max_size=5),
    remaining=st.integers(0, 10**9),
)
def test_fetch_sizer_stays_within_its_bounds(limit, seen, remaining):
    sizer = FetchSizer(limit)
    for answer_bytes, n_records, batches in seen:
        sizer.observe(answer_bytes, n_records, max(1, min(batches, n_records)))
    assert min(FetchSizer.MIN_BYTES, limit) <= sizer.next_bytes(remaining) <= limit


def test_rate_limit_reads_new_partitions_from_zero():
    assert rate_limit({("t", 0): 10}, {("t", 0): 20, ("t", 1): 10}, 4) == {("t", 0): 12, ("t", 1): 2}


def test_offsets_json_round_trip_is_canonical():
    offsets = {("b", 1): 5, ("a", 10): 3, ("a", 2): 7}
    data = to_json(offsets)
    assert list(data) == ["a", "b"]
    assert from_json(data) == offsets
    assert to_json(from_json(data)) == data


def test_stream_reader_pickles_without_its_client():
    reader = DMQStreamReader(parse_source_options({**BOOT, "subscribe": "a"}, streaming=True))
    reader._client = object()  # type: ignore[assignment]  # stands for an open client
    copy = pickle.loads(pickle.dumps(reader))
    assert copy._client is None and copy.opts == reader.opts


# -- Arrow -------------------------------------------------------------------------------------


def _log_append_time(batch: bytes, append_ms: int) -> bytes:
    """Turn a batch into a log-append-time one the way a broker configured so would."""
    b = bytearray(batch)
    attributes = struct.unpack_from("<h", b, 17)[0] | 0x08
    struct.pack_into("<h", b, 17, attributes)
    struct.pack_into("<q", b, 31, append_ms)  # max_timestamp
    struct.pack_into("<I", b, 13, zlib.crc32(b[17:]))
    return bytes(b)


def test_arrow_batch_matches_the_records_and_the_schema():
    batches = []
    expected = []
    base = 0
    for i, codec in enumerate([records.Codec.NONE, records.Codec.ZSTD, records.Codec.LZ4, records.Codec.NONE]):
        n = 3 + i
        values = [f"v{base + j}".encode() * j for j in range(n)]
        keys = [None if j % 2 else f"k{j}".encode() for j in range(n)]
        headers = [[("h", b"%d" % j)] if j % 3 == 0 else None for j in range(n)] if i % 2 else None
        stamps = [1_000 + base + j for j in range(n)]
        raw = records.encode(values, keys, headers, stamps, codec=codec, base_offset=base)
        if i == 3:
            raw = _log_append_time(raw, 99_999)
            stamps = [99_999] * n
        batches.append(raw)
        for j in range(n):
            hs = [(h, v) for h, v in headers[j]] if headers and headers[j] else None
            expected.append((keys[j], values[j], base + j, stamps[j] * 1000, 1 if i == 3 else 0, hs))
        base += n
    decoded = records.decode_batches(b"".join(batches))

    rb = ArrowBuilder("topic-é", 7, include_headers=True).build(decoded, 0, base)
    assert rb.schema.equals(arrow_schema(True))
    assert rb.num_rows == base
    cols = rb.to_pydict()
    got = list(
        zip(
            cols["key"],
            cols["value"],
            cols["offset"],
            rb.column("timestamp").cast(pa.int64()).to_pylist(),
            cols["timestampType"],
            [None if h is None else [(x["key"], x["value"]) for x in h] for h in cols["headers"]],
        )
    )
    assert got == expected
    assert set(cols["topic"]) == {"topic-é"} and set(cols["partition"]) == {7}

    part = ArrowBuilder("t", 0, include_headers=False).build(decoded, 4, 9)
    assert part.column("offset").to_pylist() == list(range(4, 9))
    assert part.schema.equals(arrow_schema(False))
    assert ArrowBuilder("t", 0, False).build(decoded, base, base + 5) is None


def test_arrow_schema_is_what_spark_expects():
    from pyspark.sql.pandas.types import to_arrow_schema

    for headers in (False, True):
        assert to_arrow_schema(source_schema(headers), timezone="UTC").equals(arrow_schema(headers))


def test_corrupt_offsets_are_refused_before_arrow_reads_them():
    raw = bytearray(records.encode([b"aaaa", b"bb", b"c"]))
    n = 3
    value_offsets_at = records.HEADER_SIZE + 4 * n + 4 * (n + 1)
    struct.pack_into("<ii", raw, value_offsets_at + 4, 7, 2)  # 0, 7, 2, 7: not monotonic
    struct.pack_into("<I", raw, 13, zlib.crc32(raw[17:]))
    decoded = records.decode_batches(bytes(raw))
    with pytest.raises(records.CorruptBatchError):
        ArrowBuilder("t", 0, False).build(decoded, 0, 3)


def test_sink_turns_rows_into_arrow_batches():
    from pyspark.sql import Row

    from dmq.client.spark.sink import as_arrow_batches

    rb = pa.RecordBatch.from_pydict({"value": [b"a"]})
    rows = [Row(value=bytearray(b"v%d" % i), key=None, headers=[Row(key="h", value=b"x")]) for i in range(3)]
    out = list(as_arrow_batches(iter([rb, *rows])))
    assert out[0] is rb
    assert out[1].to_pylist() == [{"value": b"v%d" % i, "key": None, "headers": [{"key": "h", "value": b"x"}]} for i in range(3)]


# -- Spark worker set-up -----------------------------------------------------------------------

FREEZE_CHILD = """
import gc, json, sys, weakref
from dmq.client.spark._worker import prepare_worker

gc.disable()  # no automatic collection: whether the cycle is freed depends on prepare_worker alone

class Node:
    pass

a, b = Node(), Node()
a.other, b.other = b, a  # a reference cycle only the collector can free
dead = weakref.ref(a)
del a, b
first = prepare_worker()
second = prepare_worker()
print(json.dumps({"first": first, "second": second, "frozen": gc.get_freeze_count(), "cycle_freed": dead() is None}))
"""


@pytest.mark.parametrize("in_worker", [True, False])
def test_prepare_worker_freezes_the_import_time_heap_once_and_only_in_spark_workers(in_worker):
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYTHON_WORKER_FACTORY_SECRET"}
    if in_worker:
        env["PYTHON_WORKER_FACTORY_SECRET"] = "set-by-spark"
    out = subprocess.run(
        [sys.executable, "-c", FREEZE_CHILD], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    got = json.loads(out.stdout)
    if in_worker:
        assert (got["first"], got["second"]) == (True, False)  # once per process
        assert got["frozen"] > 1000  # the imported modules' objects
        assert got["cycle_freed"]  # garbage was collected before the freeze, not kept forever
    else:
        assert got == {"first": False, "second": False, "frozen": 0, "cycle_freed": False}


LOGGING_CHILD = """
import json, logging
from dmq.client._log import get_logger
from dmq.client.spark._worker import prepare_worker

prepare_worker()
get_logger("dmq.client.spark.reader").warning("fetch retried", topic="t")
get_logger("dmq.client.spark.reader").info("fetched", topic="t")
library = logging.getLogger("dmq")
print(json.dumps({"level": library.level, "handlers": [type(h).__name__ for h in library.handlers]}))
"""


@pytest.mark.parametrize(("in_worker", "level_env"), [(True, None), (True, "debug"), (False, None)])
def test_prepare_worker_shows_the_library_log_in_spark_workers_only(in_worker, level_env):
    import json
    import logging
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON_WORKER_FACTORY_SECRET", "DMQ_SPARK_LOG_LEVEL")}
    if in_worker:
        env["PYTHON_WORKER_FACTORY_SECRET"] = "set-by-spark"
    if level_env:
        env["DMQ_SPARK_LOG_LEVEL"] = level_env
    out = subprocess.run(
        [sys.executable, "-c", LOGGING_CHILD], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    got = json.loads(out.stdout)
    # The worker set-up never reaches for the CLI's structlog set-up (a library may not import the CLI).
    assert "structlog" not in out.stderr
    if not in_worker:  # an application's process: the library stays silent, its logging untouched
        assert got == {"level": logging.NOTSET, "handlers": ["NullHandler"]}
        assert out.stderr == ""
        return
    assert "StreamHandler" in got["handlers"]
    assert "WARNING dmq.client.spark.reader: fetch retried topic='t'" in out.stderr
    if level_env == "debug":
        assert got["level"] == logging.DEBUG
        assert "fetched topic='t'" in out.stderr
    else:
        assert got["level"] == logging.WARNING
        assert "fetched topic='t'" not in out.stderr
