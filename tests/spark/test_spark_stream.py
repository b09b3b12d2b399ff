"""Streaming reads (micro-batch) through a real local Spark session against a real DMQ cluster."""

from __future__ import annotations

import threading
from typing import Any

import grpc
import pytest

from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc

pytestmark = pytest.mark.spark

QUERY_TIMEOUT_S = 120


class Collector:
    """foreachBatch target: remembers each micro-batch's rows (it runs on the driver)."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, list[tuple[int, int, bytes]]]] = []
        self._lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = [(r.partition, r.offset, bytes(r.value)) for r in df.select("partition", "offset", "value").collect()]
        with self._lock:
            self.batches.append((batch_id, rows))

    @property
    def rows(self) -> list[tuple[int, int, bytes]]:
        return [row for _, rows in self.batches for row in rows]


def stream(spark: Any, bootstrap: str, topic: str, **options: Any) -> Any:
    r = spark.readStream.format("dmq").option("bootstrap", bootstrap).option("subscribe", topic)
    for k, v in options.items():
        r = r.option(k, str(v))
    return r.load()


def run_available_now(df: Any, sink: Collector, checkpoint: str) -> None:
    q = df.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    try:
        assert q.awaitTermination(QUERY_TIMEOUT_S), "the availableNow query did not finish"
    finally:
        q.stop()
    assert q.exception() is None, q.exception()


def test_each_record_is_read_once_across_rounds_and_restarts(spark, dmq, topic_name, tmp_path):
    topic = dmq.create(topic_name(), partitions=2)
    checkpoint = str(tmp_path / "checkpoint")
    sink = Collector()
    produced: list[bytes] = []

    def produce(tag: str) -> None:
        values = [f"{tag}-{i}".encode() for i in range(10)]
        for p in range(2):
            dmq.send_values(topic, values[p::2], partition=p)
        produced.extend(values)

    produce("one")
    run_available_now(stream(spark, dmq.bootstrap, topic, startingOffsets="earliest"), sink, checkpoint)
    assert sorted(v for _, _, v in sink.rows) == sorted(produced)

    # second round with a long-running query, stopped after processAllAvailable
    produce("two")
    q = (
        stream(spark, dmq.bootstrap, topic, startingOffsets="earliest")
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:
        q.processAllAvailable()
    finally:
        q.stop()
    assert sorted(v for _, _, v in sink.rows) == sorted(produced)

    # restarted from the checkpoint with nothing new: nothing is read again
    run_available_now(stream(spark, dmq.bootstrap, topic, startingOffsets="earliest"), sink, checkpoint)
    produce("three")
    run_available_now(stream(spark, dmq.bootstrap, topic, startingOffsets="earliest"), sink, checkpoint)
    offsets = [(p, o) for p, o, _ in sink.rows]
    assert len(offsets) == len(set(offsets)) == 30
    assert sorted(v for _, _, v in sink.rows) == sorted(produced)


def test_max_offsets_per_trigger_bounds_each_micro_batch(spark, dmq, topic_name, tmp_path):
    topic = dmq.create(topic_name(), partitions=3)
    for p, n in enumerate((30, 15, 5)):
        dmq.send_values(topic, [f"{p}-{i}".encode() for i in range(n)], partition=p)
    sink = Collector()
    df = stream(spark, dmq.bootstrap, topic, startingOffsets="earliest", maxOffsetsPerTrigger=7)
    run_available_now(df, sink, str(tmp_path / "checkpoint"))

    sizes = [len(rows) for _, rows in sink.batches if rows]
    assert sizes and max(sizes) <= 7
    assert sum(sizes) == 50 and len(sizes) == 8  # ceil(50 / 7): every batch but the last is full
    assert sorted((p, o) for p, o, _ in sink.rows) == [(p, o) for p, n in enumerate((30, 15, 5)) for o in range(n)]


def test_latest_start_and_new_partitions_read_from_offset_zero(spark, dmq, topic_name, tmp_path):
    topic = dmq.create(topic_name(), partitions=1)
    dmq.send_values(topic, [b"before-%d" % i for i in range(5)], partition=0)
    checkpoint = str(tmp_path / "checkpoint")
    sink = Collector()
    run_available_now(stream(spark, dmq.bootstrap, topic), sink, checkpoint)  # startingOffsets latest
    assert sink.rows == []

    dmq.send_values(topic, [b"after-%d" % i for i in range(3)], partition=0)
    dmq.admin.add_partitions(topic, 2)
    dmq.send_values(topic, [b"new-%d" % i for i in range(4)], partition=1)
    run_available_now(stream(spark, dmq.bootstrap, topic), sink, checkpoint)
    assert sorted((p, o, v) for p, o, v in sink.rows) == [(0, 5 + i, b"after-%d" % i) for i in range(3)] + [
        (1, i, b"new-%d" % i) for i in range(4)
    ]


def test_group_id_gets_the_finished_offsets(spark, dmq, topic_name, tmp_path):
    topic = dmq.create(topic_name(), partitions=2)
    for p in range(2):
        dmq.send_values(topic, [b"x"] * (3 + p), partition=p)
    df = stream(spark, dmq.bootstrap, topic, startingOffsets="earliest", groupId="spark-app")
    run_available_now(df, Collector(), str(tmp_path / "checkpoint"))

    with grpc.insecure_channel(dmq.bootstrap) as channel:
        group = pb_grpc.GroupCoordinatorStub(channel).FindOrCreateGroup(
            pb.FindOrCreateGroupRequest(topic=topic, app_id="spark-app"), timeout=10
        )
        committed = pb_grpc.BrokerStub(channel).FetchCommittedOffsets(
            pb.FetchCommittedOffsetsRequest(
                group_id=group.group_id, partitions=[pb.TopicPartition(topic=topic, partition=p) for p in range(2)]
            ),
            timeout=10,
        )
    assert {o.partition: o.offset for o in committed.offsets} == {0: 3, 1: 4}


def test_streaming_rejects_batch_only_options(spark, dmq, topic_name, tmp_path):
    df = stream(spark, dmq.bootstrap, topic_name(), endingOffsets="latest")
    q = df.writeStream.foreachBatch(Collector()).option("checkpointLocation", str(tmp_path / "c")).start()
    try:
        with pytest.raises(Exception, match="for batch queries only"):
            q.awaitTermination(QUERY_TIMEOUT_S)
    finally:
        q.stop()
