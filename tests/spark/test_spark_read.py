"""Batch reads through a real local Spark session against a real DMQ cluster."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

pytestmark = pytest.mark.spark


def read(spark: Any, bootstrap: str, **options: Any) -> Any:
    r = spark.read.format("dmq").option("bootstrap", bootstrap)
    for k, v in options.items():
        r = r.option(k, v if isinstance(v, str) else json.dumps(v) if isinstance(v, dict) else str(v))
    return r.load()


def rows_of(df: Any) -> list[tuple[Any, ...]]:
    cols = ["key", "value", "topic", "partition", "offset", "unix_millis(timestamp) AS ts", "timestampType"]
    return sorted((tuple(r) for r in df.selectExpr(*cols).collect()), key=lambda t: (t[3], t[4]))


def _now_ms_after(previous_ms: int) -> int:
    """The clock reading once it has passed `previous_ms` (the broker's append times are ms)."""
    deadline = time.monotonic() + 1.0
    while True:
        now = int(time.time() * 1000)
        if now > previous_ms or time.monotonic() > deadline:
            return now


def test_batch_read_equals_what_was_produced_column_by_column(spark, dmq, topic_name):
    topic = dmq.create(topic_name(), partitions=3)
    rows = []
    created_ms = int(time.time() * 1000) - 60_000
    for i in range(300):
        rows.append(
            {
                "value": b"v" * (i % 7) + str(i).encode(),
                "key": None if i % 5 == 0 else f"k{i % 11}".encode(),
                "partition": i % 3 if i % 4 == 0 else None,  # else the key or the sticky choice
                "timestamp_ms": created_ms + i if i % 2 else None,
            }
        )
    rows.append({"value": b"", "key": b""})  # empty value and empty (not null) key
    metas = dmq.send(topic, rows)
    expected = sorted(
        ((r.get("key"), r["value"], topic, m.partition, m.offset, m.timestamp, 0) for r, m in zip(rows, metas)),
        key=lambda t: (t[3], t[4]),
    )

    df = read(spark, dmq.bootstrap, subscribe=topic)
    assert [f.name for f in df.schema.fields] == [
        "key", "value", "topic", "partition", "offset", "timestamp", "timestampType",
    ]
    assert df.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,timestamp:timestamp,"
        "timestampType:int>"
    )
    got = [(None if k is None else bytes(k), bytes(v), *rest) for k, v, *rest in rows_of(df)]
    assert len(got) == len(expected)
    for column, name in enumerate(["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]):
        assert [g[column] for g in got] == [e[column] for e in expected], name
    # one input partition per topic-partition
    assert df.rdd.getNumPartitions() == 3


def test_offset_ranges_select_exactly_the_right_rows(spark, dmq, topic_name):
    topic = dmq.create(topic_name(), partitions=2)
    for p in range(2):
        for chunk in range(4):  # several record batches per partition
            dmq.send_values(topic, [f"{p}-{chunk * 10 + j}".encode() for j in range(10)], partition=p)

    df = read(
        spark,
        dmq.bootstrap,
        subscribe=topic,
        startingOffsets={topic: {"0": 5, "1": -2}},
        endingOffsets={topic: {"0": 23, "1": 40}},
    )
    got = sorted((r.partition, r.offset, bytes(r.value)) for r in df.select("partition", "offset", "value").collect())
    expected = [(0, o, f"0-{o}".encode()) for o in range(5, 23)] + [(1, o, f"1-{o}".encode()) for o in range(40)]
    assert got == expected

    # assign reads only the named partitions; -1 ends at the log end
    df = read(
        spark,
        dmq.bootstrap,
        assign={topic: [1]},
        startingOffsets={topic: {"1": 38}},
        endingOffsets={topic: {"1": -1}},
    )
    assert sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect()) == [(1, 38), (1, 39)]

    # minPartitions splits the ranges; the rows stay the same
    df = read(spark, dmq.bootstrap, subscribe=topic, minPartitions=8)
    assert df.rdd.getNumPartitions() == 8
    offsets = sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())
    assert offsets == [(p, o) for p in range(2) for o in range(40)]

    # an empty range reads nothing (and does not fail)
    df = read(spark, dmq.bootstrap, subscribe=topic, startingOffsets={topic: {"0": 40, "1": 40}})
    assert df.count() == 0


def test_timestamps_select_by_append_time(spark, dmq, topic_name):
    topic = dmq.create(topic_name(), partitions=2)
    rounds: list[list[Any]] = []
    marks = []
    last = 0
    for r in range(3):
        marks.append(_now_ms_after(last))
        rounds.append(dmq.send(topic, [{"value": f"r{r}-{i}".encode(), "partition": i % 2} for i in range(6)]))
        last = int(time.time() * 1000)
    last_offsets = {p: max(m.offset for m in rounds[2] if m.partition == p) + 1 for p in range(2)}

    def values(**opts: Any) -> list[bytes]:
        df = read(spark, dmq.bootstrap, subscribe=topic, **opts)
        return sorted(bytes(r.value) for r in df.select("value").collect())

    def produced(*which: int) -> list[bytes]:
        return sorted(f"r{r}-{i}".encode() for r in which for i in range(6))

    assert values(startingTimestamp=marks[1]) == produced(1, 2)
    assert values(endingTimestamp=marks[2]) == produced(0, 1)
    assert values(startingTimestamp=marks[1], endingTimestamp=marks[2]) == produced(1)
    # a time after everything: nothing (the log end), not an error
    assert values(startingTimestamp=last + 60_000) == []
    assert last_offsets == {0: 9, 1: 9}


def test_headers_round_trip(spark, dmq, topic_name):
    topic = dmq.create(topic_name())
    rows = [
        {"value": b"a", "headers": [("trace", b"t-1"), ("empty", b""), ("none", None)]},
        {"value": b"b"},
        {"value": b"c", "headers": [("k", b"\x00\xff"), ("k", b"second")]},
    ]
    dmq.send(topic, rows)
    dmq.send(topic, [{"value": b"d"}])  # a batch without the headers bit

    df = read(spark, dmq.bootstrap, subscribe=topic, includeHeaders="true")
    assert df.schema["headers"].dataType.simpleString() == "array<struct<key:string,value:binary>>"
    got = {
        bytes(r.value): None if r.headers is None else [(h.key, None if h.value is None else bytes(h.value)) for h in r.headers]
        for r in df.select("value", "headers").collect()
    }
    assert got == {
        b"a": [("trace", b"t-1"), ("empty", b""), ("none", None)],
        b"b": None,
        b"c": [("k", b"\x00\xff"), ("k", b"second")],
        b"d": None,
    }
    # without includeHeaders there is no headers column
    assert "headers" not in read(spark, dmq.bootstrap, subscribe=topic).columns


def test_records_below_the_log_start_follow_fail_on_data_loss(spark, dmq, cluster, topic_name):
    topic = dmq.create(topic_name(), config={"segment_bytes": 2048, "retention_bytes": 4096})
    for chunk in range(12):
        dmq.send_values(topic, [b"x" * 100 + f"{chunk}-{i}".encode() for i in range(5)])
    broker = cluster.cluster.brokers[0]

    async def enforce() -> int:
        return broker.logs.enforce_retention()

    cluster.call(enforce())
    start = dmq.admin.list_offsets(topic, 0, "earliest").offset
    end = dmq.admin.list_offsets(topic, 0, "latest").offset
    assert 0 < start < end == 60

    with pytest.raises(Exception, match="were deleted") as info:
        read(spark, dmq.bootstrap, subscribe=topic, startingOffsets={topic: {"0": 0}}).count()
    assert "failOnDataLoss=false" in str(info.value)

    df = read(spark, dmq.bootstrap, subscribe=topic, startingOffsets={topic: {"0": 0}}, failOnDataLoss="false")
    assert sorted(r.offset for r in df.select("offset").collect()) == list(range(start, end))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "a", "bogus": "1"}, "unknown option 'bogus'"),
        ({"subscribe": "a", "assign": '{"a": [0]}'}, "exactly one of the options 'subscribe'"),
        ({"subscribe": "a", "startingOffsets": "latest"}, "cannot be latest in a batch query"),
        ({"subscribe": "a", "startingOffsets": "earliest", "startingTimestamp": "5"}, "contradict each other"),
        ({"subscribe": "a", "maxOffsetsPerTrigger": "5"}, "for streaming queries only"),
    ],
)
def test_bad_options_fail_with_a_clear_message(spark, options, message):
    r = spark.read.format("dmq").option("bootstrap", "127.0.0.1:1")
    for k, v in options.items():
        r = r.option(k, v)
    with pytest.raises(Exception, match=message):
        r.load().collect()


def test_a_missing_topic_fails_a_batch_read(spark, dmq, topic_name):
    with pytest.raises(Exception, match="not found|does not exist"):
        read(spark, dmq.bootstrap, subscribe=topic_name("missing")).collect()
