"""Produce / fetch round trips over real gRPC, the AdminClient, and the Cluster metadata cache."""

from __future__ import annotations

import time

import pytest

from dmq.client import AdminClient, Producer, SimpleConsumer
from dmq.client._cluster import Cluster
from dmq.client.errors import (
    InvalidArgumentError,
    OffsetOutOfRangeError,
    TopicAlreadyExistsError,
    TopicNotFoundError,
    UnknownPartitionError,
)
from dmq.client.records import ConsumerRecord, consumer_records

WAIT_S = 20.0


@pytest.fixture
def admin(cluster):  # type: ignore[no-untyped-def]
    with AdminClient(cluster.bootstrap) as a:
        yield a


@pytest.mark.parametrize("compression", [None, "zstd", "lz4"])
def test_round_trip_with_keys_headers_and_codec(cluster, admin, compression) -> None:  # type: ignore[no-untyped-def]
    admin.create_topic("rt", 1)
    sent = [
        (b"v0", None, None),
        (b"v1", b"k1", [("trace", b"abc"), ("empty", None)]),
        (b"", b"", []),
        (b"\x00" * 5000, b"k3", [("\u00e9t\u00e9", b"\xff")]),
    ]
    with Producer(cluster.bootstrap, compression=compression) as p:
        handles = [p.send("rt", v, key=k, headers=h) for v, k, h in sent]
        p.flush(WAIT_S)
        metas = [h.get(0) for h in handles]
    assert [m.offset for m in metas] == [0, 1, 2, 3]
    with SimpleConsumer(cluster.bootstrap) as c:
        got = c.consume("rt", 0, 0)
    assert [(r.value, r.key, r.headers) for r in got] == [
        (b"v0", None, ()),
        (b"v1", b"k1", (("trace", b"abc"), ("empty", None))),
        (b"", b"", ()),
        (b"\x00" * 5000, b"k3", (("\u00e9t\u00e9", b"\xff"),)),
    ]
    assert all(isinstance(r, ConsumerRecord) and r.topic == "rt" and r.partition == 0 for r in got)
    assert [r.timestamp for r in got] == [m.timestamp for m in metas]


def test_consume_skips_records_before_the_offset_inside_a_batch(cluster, admin) -> None:  # type: ignore[no-untyped-def]
    admin.create_topic("skip", 1)
    with Producer(cluster.bootstrap, linger_ms=60_000) as p:
        fut = p.send_many("skip", [b"r%d" % i for i in range(10)])
        p.flush(WAIT_S)  # linger would hold it: futures do not send, flush does
        assert fut.offsets(0) == list(range(10))  # one batch, offsets 0..9
    with SimpleConsumer(cluster.bootstrap) as c:
        got = c.consume("skip", 0, 7)
        assert [(r.offset, r.value) for r in got] == [(7, b"r7"), (8, b"r8"), (9, b"r9")]
        assert [r.offset for r in c.consume("skip", 0, 2, max_records=3)] == [2, 3, 4]
        batches = list(c.consume_batches("skip", 0, 4, end_offset=10))
        assert len(batches) == 1 and batches[0].base_offset == 0  # a whole batch comes back
        assert [r.offset for r in batches[0].iter_from(4)] == [4, 5, 6, 7, 8, 9]
        assert [r.value for r in consumer_records("skip", 0, batches[0], 8)] == [b"r8", b"r9"]


def test_consume_at_the_log_end_waits_then_returns_nothing(cluster, admin) -> None:  # type: ignore[no-untyped-def]
    admin.create_topic("end", 1)
    with SimpleConsumer(cluster.bootstrap) as c:
        t0 = time.monotonic()
        assert c.consume("end", 0, 0, max_wait_ms=100) == []
        assert time.monotonic() - t0 >= 0.09  # it long-polled


def test_offset_out_of_range_names_the_log_bounds(cluster, admin) -> None:  # type: ignore[no-untyped-def]
    admin.create_topic("oor", 1)
    with Producer(cluster.bootstrap) as p:
        p.send_many("oor", [b"a", b"b", b"c"]).wait(WAIT_S)
    with SimpleConsumer(cluster.bootstrap) as c:
        with pytest.raises(OffsetOutOfRangeError) as info:
            c.consume("oor", 0, 50)
        assert (info.value.log_start_offset, info.value.log_end_offset) == (0, 3)
        assert "log start 0" in str(info.value) and "log end 3" in str(info.value)
        assert c.offsets("oor", 0) == (0, 3)


def test_consume_batches_streams_many_fetches_in_order(cluster, admin) -> None:  # type: ignore[no-untyped-def]
    admin.create_topic("stream", 1)
    values = [b"%06d" % i for i in range(20_000)]
    with Producer(cluster.bootstrap, batch_size=16_384) as p:
        p.send_many("stream", values).wait(WAIT_S)
    with SimpleConsumer(cluster.bootstrap, max_bytes=65_536) as c:
        batches = list(c.consume_batches("stream", 0, 0, end_offset=20_000))
        got = [r.value for b in batches for r in b]
    assert got == values
    assert len(batches) > 10


def test_unknown_topic_and_partition_errors(cluster, admin) -> None:  # type: ignore[no-untyped-def]
    admin.create_topic("two", 2)
    with SimpleConsumer(cluster.bootstrap) as c:
        with pytest.raises(TopicNotFoundError, match="nope"):
            c.consume("nope", 0, 0)
        with pytest.raises(UnknownPartitionError, match="partition 5"):
            c.consume("two", 5, 0)


# -- AdminClient ------------------------------------------------------------------------------------


def test_topic_lifecycle(cluster, admin) -> None:  # type: ignore[no-untyped-def]
    created = admin.create_topic("life", 2, config={"retention_ms": 60_000, "segment.bytes": 1 << 20})
    assert created.name == "life" and created.partition_count == 2
    assert created.config == {"retention_ms": 60_000, "segment_bytes": 1 << 20,  # and the replication defaults
                              "replication_factor": 1, "min_insync_replicas": 1, "unclean_leader_election": False}
    assert [p.partition for p in created.partitions] == [0, 1]
    assert all(p.leader_alive and p.leader_address for p in created.partitions)
    assert admin.describe_topic("life") == created
    assert "life" in [t.name for t in admin.list_topics()]
    with pytest.raises(TopicAlreadyExistsError, match="already exists"):
        admin.create_topic("life", 1)
    grown = admin.add_partitions("life", 4)
    assert grown.partition_count == 4
    with pytest.raises(InvalidArgumentError, match="greater than the current 4"):
        admin.add_partitions("life", 3)
    admin.delete_topic("life")
    with pytest.raises(TopicNotFoundError):
        admin.describe_topic("life")
    with pytest.raises(TopicNotFoundError):
        admin.delete_topic("life")


def test_admin_checks_requests_before_sending(admin) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidArgumentError, match="name"):
        admin.create_topic("bad name!", 1)
    with pytest.raises(InvalidArgumentError, match="partitions"):
        admin.create_topic("ok", 0)
    with pytest.raises(InvalidArgumentError, match="unknown settings"):
        admin.create_topic("ok", 1, config={"retention_days": 3})
    with pytest.raises(InvalidArgumentError, match="timestamp"):
        admin.list_offsets("ok", 0, "yesterday")


def test_brokers_offsets_and_logs(cluster, admin) -> None:  # type: ignore[no-untyped-def]
    admin.create_topic("offs", 2)
    brokers = admin.list_brokers()
    assert len(brokers) == 1 and brokers[0].alive and brokers[0].address == cluster.bootstrap
    before_ms = int(time.time() * 1000) - 1
    with Producer(cluster.bootstrap) as p:
        p.send_many("offs", [b"x"] * 5, partition=1).wait(WAIT_S)
    assert admin.list_offsets("offs", 1, "earliest").offset == 0
    latest = admin.list_offsets("offs", 1, "latest")
    assert (latest.offset, latest.log_start_offset, latest.log_end_offset) == (5, 0, 5)
    assert admin.list_offsets("offs", 1, before_ms).offset == 0
    assert admin.list_offsets("offs", 1, int(time.time() * 1000) + 60_000).offset == 5
    logs = {(d.topic, d.partition): d for d in admin.describe_logs("offs")}
    assert logs[("offs", 1)].log_end_offset == 5 and logs[("offs", 1)].size_bytes > 0
    assert logs[("offs", 0)].log_end_offset == 0
    assert {("offs", 0), ("offs", 1)} <= {(d.topic, d.partition) for d in admin.describe_logs()}


def test_cluster_cache_follows_added_partitions(cluster, admin) -> None:  # type: ignore[no-untyped-def]
    admin.create_topic("grow", 1)
    with Cluster(cluster.bootstrap) as c:
        assert c.partitions_for("grow") == 1
        assert c.leader_for("grow", 0) == cluster.bootstrap
        admin.add_partitions("grow", 3)
        # the cache is stale, but asking for partition 2 refreshes it once before failing
        assert c.leader_for("grow", 2) == cluster.bootstrap
        assert c.partitions_for("grow") == 3
        with pytest.raises(TopicNotFoundError):
            c.leader_for("missing", 0)
        assert "topics=" in repr(c)
    with Producer(cluster.bootstrap) as p:
        p.partitions_for("grow")
        admin.add_partitions("grow", 4)
        assert p.send("grow", b"x", partition=3).get(WAIT_S).partition == 3
