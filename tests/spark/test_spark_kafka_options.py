"""The Kafka source's remaining options: subscribePattern, offsets by timestamp, `kafka.` aliases,
and a clear error for Kafka options that do not apply to DMQ (units, then real servers)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from dmq.client import DMQConsumer
from dmq.client.spark.options import OptionError, parse_sink_options, parse_source_options

BOOT = {"bootstrap": "127.0.0.1:9092"}
QUERY_TIMEOUT_S = 120


# -- options, without a session -------------------------------------------------------------------


def test_subscribe_pattern_is_a_third_way_to_name_topics():
    opts = parse_source_options({**BOOT, "subscribePattern": r"orders\..*"}, streaming=True)
    assert opts.pattern == r"orders\..*" and opts.topics == () and opts.assign is None
    with pytest.raises(OptionError, match="exactly one of the options 'subscribe', 'subscribePattern'"):
        parse_source_options({**BOOT, "subscribe": "a", "subscribePattern": "a.*"}, streaming=False)
    with pytest.raises(OptionError, match="'subscribePattern' is not a valid regular expression"):
        parse_source_options({**BOOT, "subscribePattern": "orders(["}, streaming=False)
    # offsets JSON may only name topics the pattern matches
    with pytest.raises(OptionError, match="does not match"):
        parse_source_options({**BOOT, "subscribePattern": "a.*", "startingOffsets": '{"b": {"0": 1}}'},
                             streaming=False)


def test_offsets_by_timestamp_parse_per_partition():
    opts = parse_source_options(
        {**BOOT, "subscribe": "a", "startingOffsetsByTimestamp": '{"a": {"0": 1000, "1": 2000}}',
         "endingOffsetsByTimestamp": '{"a": {"0": 5000, "1": 6000}}'}, streaming=False)
    assert (opts.starting.kind, opts.starting.offsets) == ("timestamps", {("a", 0): 1000, ("a", 1): 2000})
    assert (opts.ending.kind, opts.ending.offsets) == ("timestamps", {("a", 0): 5000, ("a", 1): 6000})
    stream = parse_source_options({**BOOT, "subscribe": "a", "startingOffsetsByTimestamp": '{"a": {"0": 7}}'},
                                  streaming=True)
    assert stream.starting.kind == "timestamps"


@pytest.mark.parametrize(
    ("options", "streaming", "message"),
    [
        ({"startingOffsetsByTimestamp": '{"a": {"0": -1}}'}, False, r"timestamp of a\[0\] must be an integer >= 0"),
        ({"startingOffsetsByTimestamp": '{"b": {"0": 1}}'}, False, "names topics that are not read"),
        ({"startingOffsetsByTimestamp": '{"a": {"0": 1}}', "startingTimestamp": "5"}, False, "give only one"),
        ({"startingOffsetsByTimestamp": '{"a": {"0": 1}}', "startingOffsets": "earliest"}, False, "give only one"),
        ({"endingOffsetsByTimestamp": '{"a": {"0": 1}}'}, True, "for batch queries only"),
        ({"endingOffsetsByTimestamp": "[1]"}, False, "JSON object of topic"),
    ],
)
def test_bad_timestamp_options(options, streaming, message):
    with pytest.raises(OptionError, match=message):
        parse_source_options({**BOOT, "subscribe": "a", **options}, streaming=streaming)


def test_kafka_prefixed_names_are_aliases_of_the_dmq_settings():
    opts = parse_source_options(
        {"kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "a",
         "kafka.ssl.ca.location": "/ca.pem", "kafka.ssl.certificate.location": "/c.pem",
         "kafka.ssl.key.location": "/c.key", "kafka.sasl.oauthbearer.token": "tok.en.value",
         "kafka.fetch.max.bytes": "2097152", "kafkaConsumer.pollTimeoutMs": "5000",
         "kafka.security.protocol": "SSL", "kafka.sasl.mechanism": "OAUTHBEARER"}, streaming=False)
    assert dict(opts.credentials) == {"ssl_cafile": "/ca.pem", "ssl_certfile": "/c.pem", "ssl_keyfile": "/c.key",
                                      "token": "tok.en.value"}
    assert (opts.fetch_max_bytes, opts.poll_timeout_ms) == (2 * 1024 * 1024, 5000)
    assert "tok.en.value" not in repr(opts)
    # Java's truststore, when it is a PEM file
    pem = parse_source_options({**BOOT, "subscribe": "a", "kafka.ssl.truststore.location": "/ca.pem",
                                "kafka.ssl.truststore.type": "PEM"}, streaming=False)
    assert dict(pem.credentials) == {"ssl_cafile": "/ca.pem"}
    sink = parse_sink_options({**BOOT, "topic": "t", "kafka.linger.ms": "5", "kafka.batch.size": "1000",
                               "kafka.compression.type": "zstd", "kafka.ssl.ca.location": "/ca.pem"})
    assert (sink.linger_ms, sink.batch_size, sink.compression) == (5, 1000, "zstd")
    assert dict(sink.credentials) == {"ssl_cafile": "/ca.pem"}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"kafka.ssl.ca.location": "/a.pem", "sslCafile": "/b.pem"}, "'kafka.ssl.ca.location' repeats 'sslCafile'"),
        ({"kafka.ssl.truststore.location": "/t.jks"}, "PEM"),
        ({"kafka.ssl.truststore.location": "/t.jks", "kafka.ssl.truststore.type": "JKS"}, "PEM"),
        ({"kafka.ssl.keystore.location": "/k.jks"}, "kafka.ssl.certificate.location"),
        ({"kafka.security.protocol": "SASL_SSL"}, "'kafka.security.protocol' must be PLAINTEXT or SSL"),
        ({"kafka.security.protocol": "PLAINTEXT", "sslCafile": "/ca.pem"}, "contradicts"),
        ({"kafka.sasl.mechanism": "SCRAM-SHA-512"}, "OAUTHBEARER"),
        ({"kafka.sasl.jaas.config": "x"}, "does not apply to DMQ"),
        ({"kafka.group.id": "g"}, "'groupId'"),
        ({"kafka.key.deserializer": "x"}, "does not apply to DMQ"),
        ({"fetchOffset.numRetries": "3"}, "does not apply to DMQ"),
        ({"startingOffsetsByTimestampStrategy": "latest"}, "does not apply to DMQ"),
        ({"kafka.no.such.setting": "1"}, "unknown option 'kafka.no.such.setting'.*kafka.ssl.ca.location"),
    ],
)
def test_kafka_options_that_do_not_apply_fail_with_the_reason(options, message):
    with pytest.raises(OptionError, match=message):
        parse_source_options({**BOOT, "subscribe": "a", **options}, streaming=False)


# -- real servers, real Spark session -------------------------------------------------------------


def read(spark: Any, bootstrap: str, **options: Any) -> Any:
    r = spark.read.format("dmq").option("bootstrap", bootstrap)
    for k, v in options.items():
        r = r.option(k, v if isinstance(v, str) else json.dumps(v))
    return r.load()


def _clock_past(previous_ms: int) -> int:
    """The clock reading once it has passed `previous_ms` (append times are whole ms)."""
    while True:
        now = int(time.time() * 1000)
        if now > previous_ms:
            return now
        time.sleep(0.001)


@pytest.mark.spark
def test_subscribe_pattern_reads_every_matching_topic(spark, dmq, topic_name):
    prefix = topic_name("pat")
    a = dmq.create(f"{prefix}-a", partitions=2)
    b = dmq.create(f"{prefix}-b")
    other = dmq.create(f"{prefix}x-c")
    for t in (a, b, other):
        dmq.send_values(t, [f"{t}:{i}".encode() for i in range(5)])
    df = read(spark, dmq.bootstrap, subscribePattern=f"{prefix}-.*")
    got = sorted((r.topic, bytes(r.value)) for r in df.select("topic", "value").collect())
    assert got == sorted((t, f"{t}:{i}".encode()) for t in (a, b) for i in range(5))
    # a pattern that matches nothing reads nothing (Kafka's behaviour), it is not an error
    assert read(spark, dmq.bootstrap, subscribePattern=f"{prefix}-nothing.*").count() == 0


@pytest.mark.spark
def test_a_stream_with_subscribe_pattern_picks_up_a_topic_created_after_it_started(spark, dmq, topic_name, tmp_path):
    prefix = topic_name("spat")
    first = dmq.create(f"{prefix}-1")
    dmq.send_values(first, [b"1:a", b"1:b"])
    seen: list[tuple[str, bytes]] = []

    def sink(df: Any, batch_id: int) -> None:
        seen.extend((r.topic, bytes(r.value)) for r in df.select("topic", "value").collect())

    df = (spark.readStream.format("dmq").option("bootstrap", dmq.bootstrap)
          .option("subscribePattern", f"{prefix}-.*").option("startingOffsets", "earliest").load())
    q = df.writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "cp")).start()
    try:
        q.processAllAvailable()
        assert sorted(seen) == [(first, b"1:a"), (first, b"1:b")]
        second = dmq.create(f"{prefix}-2", partitions=2)  # created after the stream started
        dmq.send_values(second, [b"2:a", b"2:b", b"2:c"])
        dmq.send_values(first, [b"1:c"])
        want = sorted([(first, b"1:a"), (first, b"1:b"), (first, b"1:c"),
                       (second, b"2:a"), (second, b"2:b"), (second, b"2:c")])
        deadline = time.monotonic() + QUERY_TIMEOUT_S
        while sorted(seen) != want and time.monotonic() < deadline:
            q.processAllAvailable()
        assert sorted(seen) == want
    finally:
        q.stop()
    assert q.exception() is None


@pytest.mark.spark
def test_timestamp_options_agree_with_offsets_for_times(spark, dmq, topic_name):
    topic = dmq.create(topic_name(), partitions=2)
    marks: list[int] = []
    last = 0
    for r in range(3):
        marks.append(_clock_past(last))
        dmq.send(topic, [{"value": f"r{r}-{i}".encode(), "partition": i % 2} for i in range(6)])
        last = int(time.time() * 1000)
    with DMQConsumer(bootstrap_servers=dmq.bootstrap, group_id="times") as consumer:
        def found(ts: dict[int, int]) -> dict[int, int]:
            answers = consumer.offsets_for_times({(topic, p): t for p, t in ts.items()})
            return {p: (a.offset if a is not None else 9) for (_, p), a in answers.items()}  # 9: the log end

        def offsets(**opts: Any) -> list[tuple[int, int]]:
            df = read(spark, dmq.bootstrap, subscribe=topic, **opts)
            return sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())

        def between(start: dict[int, int], end: dict[int, int]) -> list[tuple[int, int]]:
            return [(p, o) for p in range(2) for o in range(start[p], end[p])]

        per_partition = {0: marks[1], 1: marks[2]}
        start = found(per_partition)
        assert offsets(startingOffsetsByTimestamp={topic: {str(p): t for p, t in per_partition.items()}}) == \
            between(start, {0: 9, 1: 9})
        end = found({0: marks[2], 1: marks[1]})
        assert offsets(endingOffsetsByTimestamp={topic: {"0": marks[2], "1": marks[1]}}) == between({0: 0, 1: 0}, end)
        both = found({0: marks[1], 1: marks[1]})
        assert offsets(startingTimestamp=str(marks[1])) == between(both, {0: 9, 1: 9})
        # the same answers the consumer gives, and the rows really are the rounds they should be
        assert start == {0: 3, 1: 6} and end == {0: 6, 1: 3} and both == {0: 3, 1: 3}
        # a time after every record: the log end, so nothing is read
        assert offsets(startingOffsetsByTimestamp={topic: {"0": last + 60_000, "1": last + 60_000}}) == []
    with pytest.raises(Exception, match=r"must give a timestamp for every partition read; missing: .*\[1\]"):
        read(spark, dmq.bootstrap, subscribe=topic, startingOffsetsByTimestamp={topic: {"0": 5}}).count()
