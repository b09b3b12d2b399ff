"""Planning and reading against a real cluster, driving the readers directly (no Spark session):
the cases that are slow or awkward to reach through Spark."""

from __future__ import annotations

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from dmq.client.spark import reader as spark_reader
from dmq.client.spark.options import OptionError, parse_source_options
from dmq.client.spark.reader import (
    DataLossError,
    DMQBatchReader,
    DMQStreamReader,
    FetchSizer,
    OffsetRange,
    read_range,
)


def stream_reader(bootstrap: str, **options: str) -> DMQStreamReader:
    return DMQStreamReader(parse_source_options({"bootstrap": bootstrap, **options}, streaming=True))


def batch_reader(bootstrap: str, **options: str) -> DMQBatchReader:
    return DMQBatchReader(parse_source_options({"bootstrap": bootstrap, **options}, streaming=False))


def rows(reader: DMQStreamReader | DMQBatchReader, parts: list[OffsetRange]) -> list[tuple[int, int]]:
    out = []
    for part in parts:
        for rb in reader.read(part):
            out.extend(zip(rb.column("partition").to_pylist(), rb.column("offset").to_pylist()))
    return sorted(out)


def test_a_stream_waits_for_a_missing_topic_and_reads_it_from_zero(dmq, topic_name):
    topic = topic_name()
    reader = stream_reader(dmq.bootstrap, subscribe=topic)  # startingOffsets latest
    try:
        start = reader.initialOffset()
        assert start == {}
        assert reader.latestOffset(start, ReadAllAvailable()) == {}
        dmq.create(topic, partitions=2)
        dmq.send_values(topic, [b"a", b"b"], partition=1)
        end = reader.latestOffset(start, ReadAllAvailable())
        assert end == {topic: {"0": 0, "1": 2}}
        assert rows(reader, list(reader.partitions(start, end))) == [(1, 0), (1, 1)]
    finally:
        reader.stop()


def test_deleted_topics_follow_fail_on_data_loss(dmq, topic_name):
    topic = dmq.create(topic_name())
    dmq.send_values(topic, [b"x"] * 3)
    strict = stream_reader(dmq.bootstrap, subscribe=topic, startingOffsets="earliest")
    lenient = stream_reader(dmq.bootstrap, subscribe=topic, startingOffsets="earliest", failOnDataLoss="false")
    try:
        start = strict.initialOffset()
        assert lenient.initialOffset() == start == {topic: {"0": 0}}
        dmq.admin.delete_topic(topic)
        with pytest.raises(DataLossError, match="no longer exists"):
            strict.latestOffset(start, ReadAllAvailable())
        assert lenient.latestOffset(start, ReadAllAvailable()) == {}
    finally:
        strict.stop()
        lenient.stop()


def test_rate_limited_offsets_and_the_read_limit_api(dmq, topic_name):
    topic = dmq.create(topic_name(), partitions=2)
    dmq.send_values(topic, [b"x"] * 9, partition=0)
    dmq.send_values(topic, [b"y"] * 3, partition=1)
    reader = stream_reader(dmq.bootstrap, subscribe=topic, startingOffsets="earliest", maxOffsetsPerTrigger="4")
    try:
        assert reader.getDefaultReadLimit() == ReadMaxRows(4)
        start = reader.initialOffset()
        first = reader.latestOffset(start, ReadMaxRows(4))
        assert first == {topic: {"0": 3, "1": 1}}
        # the engine may override the default limit, e.g. to read everything at once
        assert reader.latestOffset(first, ReadAllAvailable()) == {topic: {"0": 9, "1": 3}}
        assert reader.reportLatestOffset() == {topic: {"0": 9, "1": 3}}
    finally:
        reader.stop()


def test_batch_planning_errors(dmq, topic_name):
    topic = dmq.create(topic_name(), partitions=2)
    dmq.send_values(topic, [b"x"] * 5, partition=0)
    with pytest.raises(OptionError, match="must give an offset for every partition read; missing: .*\\[1\\]"):
        batch_reader(dmq.bootstrap, subscribe=topic, startingOffsets=f'{{"{topic}": {{"0": 1}}}}').plan()
    with pytest.raises(OptionError, match="past the log end 5"):
        batch_reader(
            dmq.bootstrap, subscribe=topic, endingOffsets=f'{{"{topic}": {{"0": 6, "1": -1}}}}'
        ).plan()
    with pytest.raises(OptionError, match="after its ending offset"):
        batch_reader(
            dmq.bootstrap,
            subscribe=topic,
            startingOffsets=f'{{"{topic}": {{"0": 4, "1": 0}}}}',
            endingOffsets=f'{{"{topic}": {{"0": 2, "1": 0}}}}',
        ).plan()
    with pytest.raises(OptionError, match="names partitions \\[7\\]"):
        batch_reader(dmq.bootstrap, assign=f'{{"{topic}": [0, 7]}}').plan()


def test_read_range_reads_across_many_fetches_and_trims_to_the_range(dmq, topic_name):
    topic = dmq.create(topic_name())
    for chunk in range(20):
        dmq.send_values(topic, [b"%d-%d" % (chunk, i) + b"." * 200 for i in range(50)])
    settings = batch_reader(dmq.bootstrap, subscribe=topic, fetchMaxBytes="4096").settings
    batches = list(read_range(settings, OffsetRange(topic, 0, 123, 877, "")))
    assert len(batches) > 10  # small fetches: one Arrow batch each
    offsets = [o for rb in batches for o in rb.column("offset").to_pylist()]
    assert offsets == list(range(123, 877))
    values = [v for rb in batches for v in rb.column("value").to_pylist()]
    assert values[0].startswith(b"2-23.") and values[-1].startswith(b"17-26.")


class CountingFetcher(spark_reader.PartitionFetcher):
    """Counts the Fetch answers a read took, and their record bytes."""

    answers: list[int] = []

    def result(self, future, offset, max_bytes):
        answer = super().result(future, offset, max_bytes)
        CountingFetcher.answers.append(len(answer.records))
        return answer


def test_a_small_range_fetches_about_its_own_bytes_not_fetch_max_bytes(dmq, topic_name, monkeypatch):
    topic = dmq.create(topic_name())
    for chunk in range(40):
        dmq.send_values(topic, [b"%d-%d" % (chunk, i) + b"." * 200 for i in range(50)])  # 40 batches of ~10 KB
    monkeypatch.setattr(spark_reader, "PartitionFetcher", CountingFetcher)
    monkeypatch.setattr(CountingFetcher, "answers", [])
    settings = batch_reader(dmq.bootstrap, subscribe=topic).settings  # fetchMaxBytes 16 MiB
    batches = list(read_range(settings, OffsetRange(topic, 0, 1010, 1013, "")))
    assert [o for rb in batches for o in rb.column("offset").to_pylist()] == [1010, 1011, 1012]
    # MIN_BYTES (64 KiB) from offset 1010: a handful of the ~10 KB batches, not the 30 that remain
    assert len(CountingFetcher.answers) == 1 and CountingFetcher.answers[0] <= FetchSizer.MIN_BYTES

    # large records: the first guess (128 B a row) is short, the next asks use what was seen
    big = dmq.create(topic_name())
    for i in range(30):
        dmq.send_values(big, [b"%03d" % i + b"x" * 20_000])  # one 20 KB record per batch
    CountingFetcher.answers = []
    batches = list(read_range(settings, OffsetRange(big, 0, 2, 27, "")))
    assert [o for rb in batches for o in rb.column("offset").to_pylist()] == list(range(2, 27))
    assert [v[:3] for rb in batches for v in rb.column("value").to_pylist()] == [b"%03d" % i for i in range(2, 27)]
    assert len(CountingFetcher.answers) <= 3
    assert sum(CountingFetcher.answers) <= 27 * 20_200  # at most the batches up to the range's end


def test_each_range_is_read_from_its_partitions_leader(dmq3, topic_name):
    topic = dmq3.create(topic_name(), partitions=3)
    for p in range(3):
        dmq3.send_values(topic, [b"%d-%d" % (p, i) for i in range(4)], partition=p)
    leaders = {p.partition: p.leader_address for p in dmq3.admin.describe_topic(topic).partitions}
    assert len(set(leaders.values())) == 3  # one partition per broker
    reader = batch_reader(dmq3.bootstrap, subscribe=topic)
    parts = reader.plan()
    assert {r.partition: r.leader for r in parts} == leaders
    assert rows(reader, parts) == [(p, o) for p in range(3) for o in range(4)]
    # a stale leader hint (the partition "moved"): NOT_LEADER, fresh metadata, read again
    wrong = OffsetRange(topic, 0, 0, 4, leaders[1])
    assert rows(reader, [wrong]) == [(0, o) for o in range(4)]


def test_stopping_a_read_early_cancels_the_fetch_in_flight(dmq, topic_name):
    topic = dmq.create(topic_name())
    for _ in range(10):
        dmq.send_values(topic, [b"." * 1000] * 5)  # ten batches of ~5 KB
    settings = batch_reader(dmq.bootstrap, subscribe=topic, fetchMaxBytes="2048").settings
    batches = read_range(settings, OffsetRange(topic, 0, 0, 50, ""))
    assert next(batches).num_rows < 50  # one fetch did not hold it all: the next one is in flight
    batches.close()  # what a LIMIT or a failed task does
