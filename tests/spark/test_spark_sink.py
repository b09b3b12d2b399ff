"""The dmq sink: DataFrames written by Spark are read back with the plain client."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

pytestmark = pytest.mark.spark

QUERY_TIMEOUT_S = 120


def test_batch_write_is_read_back_by_a_consumer(spark, dmq, topic_name):
    topic = dmq.create(topic_name(), partitions=3)
    rows = [(f"value-{i}".encode(), None if i % 4 == 0 else f"key-{i % 5}".encode()) for i in range(200)]
    df = spark.createDataFrame(rows, "value binary, key binary").repartition(2)
    df.write.format("dmq").option("bootstrap", dmq.bootstrap).option("topic", topic).option(
        "compression", "zstd"
    ).mode("append").save()

    got = dmq.read_all(topic)
    assert sorted((r.value, r.key) for r in got) == sorted(rows)
    # a key always lands in the same partition
    by_key: dict[bytes, set[int]] = {}
    for r in got:
        if r.key is not None:
            by_key.setdefault(r.key, set()).add(r.partition)
    assert all(len(ps) == 1 for ps in by_key.values())


def test_write_with_topic_partition_headers_and_timestamp_columns(spark, dmq, topic_name):
    a = dmq.create(topic_name("a"), partitions=2)
    b = dmq.create(topic_name("b"), partitions=2)
    ts = dt.datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=dt.timezone.utc)  # microseconds are dropped
    rows = [
        ("v1", "k1", a, 1, [("h1", b"x"), ("h2", None)], ts),
        ("v2", None, b, 0, [], ts),
        ("v3", None, b, None, None, ts),
    ]
    schema = (
        "value string, key string, topic string, partition int, "
        "headers array<struct<key:string,value:binary>>, timestamp timestamp"
    )
    df = spark.createDataFrame(rows, schema).coalesce(1)
    df.write.format("dmq").option("bootstrap", dmq.bootstrap).mode("append").save()

    got = {r.value: r for r in dmq.read_all(a) + dmq.read_all(b)}
    assert set(got) == {b"v1", b"v2", b"v3"}
    assert (got[b"v1"].topic, got[b"v1"].partition, got[b"v1"].key) == (a, 1, b"k1")
    assert got[b"v1"].headers == (("h1", b"x"), ("h2", None))
    assert (got[b"v2"].topic, got[b"v2"].partition, got[b"v2"].headers) == (b, 0, ())
    assert got[b"v3"].topic == b
    assert {r.timestamp for r in got.values()} == {int(ts.timestamp() * 1000)}  # ...678 ms

    # the topic option overrides the column
    df.select("value", "topic").write.format("dmq").option("bootstrap", dmq.bootstrap).option("topic", a).mode(
        "append"
    ).save()
    assert sorted(r.value for r in dmq.read_all(a)) == [b"v1", b"v1", b"v2", b"v3"]


def test_write_stream_copies_a_topic(spark, dmq, topic_name, tmp_path):
    source = dmq.create(topic_name("src"), partitions=2)
    target = dmq.create(topic_name("dst"), partitions=1)
    dmq.send(source, [{"value": f"m{i}".encode(), "key": f"k{i}".encode()} for i in range(40)])
    q = (
        spark.readStream.format("dmq")
        .option("bootstrap", dmq.bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("key", "value")
        .writeStream.format("dmq")
        .option("bootstrap", dmq.bootstrap)
        .option("topic", target)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert q.awaitTermination(QUERY_TIMEOUT_S)
    finally:
        q.stop()
    got = dmq.read_all(target)
    assert sorted((r.key, r.value) for r in got) == sorted((f"k{i}".encode(), f"m{i}".encode()) for i in range(40))


@pytest.mark.parametrize(
    ("schema", "rows", "options", "mode", "message"),
    [
        ("key binary", [(b"k",)], {"topic": "t"}, "append", "needs a 'value' column"),
        ("value binary, offset long", [(b"v", 1)], {"topic": "t"}, "append", "does not know the columns"),
        ("value binary", [(b"v",)], {}, "append", "needs a topic"),
        ("value binary", [(b"v",)], {"topic": "t"}, "overwrite", "not supported by the dmq sink"),
        ("value int", [(1,)], {"topic": "t"}, "append", "column 'value' must be binary or string"),
    ],
)
def test_bad_writes_fail_with_a_clear_message(spark, dmq, schema, rows, options, mode, message):
    w: Any = spark.createDataFrame(rows, schema).write.format("dmq").option("bootstrap", dmq.bootstrap)
    for k, v in options.items():
        w = w.option(k, v)
    with pytest.raises(Exception, match=message):
        w.mode(mode).save()
