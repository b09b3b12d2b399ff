"""The Kafka-style client API (issue 14 item 3), line by line, over a real server."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import Any
from unittest.mock import ANY

import pytest

from dmq.client import (
    AdminClient,
    ConsumerConfig,
    DMQConsumer,
    Producer,
    SimpleConsumer,
    TopicPartition,
    json_deserializer,
    json_serializer,
    str_deserializer,
    str_serializer,
)
from dmq.client.cli.runner import ClusterThread
from dmq.client.consumer import OffsetAndTimestamp
from dmq.client.errors import IllegalStateError, InvalidArgumentError, InvalidConfigError, SerializationError, UnknownSettingError
from tests.wall_clock import ms_after_acknowledged

TIMEOUT_S = 15.0
FAST = {"heartbeat_interval_ms": 200, "session_timeout_ms": 3000, "retry_backoff_ms": 50}
# A loopback port nothing listens on (the discard port): connections are refused at once.
DEAD = "127.0.0.1:9"


@pytest.fixture
def server(cluster_factory: Callable[..., ClusterThread]) -> ClusterThread:
    return cluster_factory(rebalance_debounce_ms=100, topics={"t": 2})


def _drain(c: DMQConsumer, n: int, timeout_s: float = TIMEOUT_S) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        got.extend(c.poll(timeout_ms=200))
    return got


def _produce(server: ClusterThread, topic: str, values: list[bytes], partition: int | None = None) -> None:
    with Producer(bootstrap_servers=server.bootstrap, linger_ms=0) as p:
        for v in values:
            p.send(topic, v, partition=partition).get(TIMEOUT_S)


# -- addresses --------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["str", "list", "comma", "old-name"])
def test_every_client_takes_bootstrap_servers_in_every_shape(server: ClusterThread, shape: str) -> None:
    # "comma" and "list" put a dead address first: the one that answers is used.
    value: Any = {"str": server.bootstrap, "list": [DEAD, server.bootstrap], "comma": f"{DEAD},{server.bootstrap}",
                  "old-name": server.bootstrap}[shape]
    name = "bootstrap" if shape == "old-name" else "bootstrap_servers"
    with Producer(**{name: value}, linger_ms=0) as p:
        p.send("t", b"v", partition=0).get(TIMEOUT_S)
    with AdminClient(**{name: value}) as admin:
        assert "t" in [t.name for t in admin.list_topics()]
    with SimpleConsumer(**{name: value}) as sc:
        assert [r.value for r in sc.consume("t", 0, 0)] == [b"v"]
    consumer_name = "metadata_service_url" if shape == "old-name" else "bootstrap_servers"
    with DMQConsumer(**{consumer_name: value}, group_id="g", **FAST) as c:
        assert c.config.bootstrap_servers == server.bootstrap == c.config.metadata_service_url
        c.subscribe("t")
        assert [r.value for r in _drain(c, 1)] == [b"v"]


@pytest.mark.parametrize(
    "make",
    [
        lambda: Producer(bootstrap_servers="127.0.0.1"),
        lambda: AdminClient(bootstrap_servers=["127.0.0.1:1", 7]),
        lambda: SimpleConsumer(bootstrap_servers=""),
        lambda: DMQConsumer(bootstrap_servers="host:99999", group_id="g"),
        lambda: Producer(bootstrap_servers="127.0.0.1:1", bootstrap="127.0.0.1:2"),
        lambda: Producer(),
    ],
)
def test_a_bad_address_names_the_setting(make: Callable[[], Any]) -> None:
    with pytest.raises(InvalidConfigError, match="bootstrap_servers"):
        make()


@pytest.mark.parametrize(
    "make, owner, suggestion",
    [
        (lambda: Producer(bootstrap_servers=DEAD, linger_msec=5), "Producer", "linger_ms"),
        (lambda: AdminClient(bootstrap_server=DEAD), "AdminClient", "bootstrap_servers"),
        (lambda: SimpleConsumer(bootstrap_servers=DEAD, max_wait=1), "SimpleConsumer", "max_wait_ms"),
        (lambda: DMQConsumer(bootstrap_servers=DEAD, group_id="g", auto_offset_rest="latest"), "ConsumerConfig",
         "auto_offset_reset"),
        (lambda: ConsumerConfig(bootstrap_servers=DEAD, groupid="g"), "ConsumerConfig", "group_id"),
    ],
)
def test_an_unknown_setting_names_itself_and_close_names(make: Callable[[], Any], owner: str, suggestion: str) -> None:
    with pytest.raises(UnknownSettingError) as info:
        make()
    assert isinstance(info.value, TypeError)  # what Python's own error was: `except TypeError` still works
    assert owner in str(info.value) and f"did you mean {suggestion!r}" in str(info.value)


def test_bad_settings_name_the_setting() -> None:
    with pytest.raises(InvalidConfigError, match="auto_offset_reset must be 'earliest' or 'latest'"):
        ConsumerConfig(bootstrap_servers=DEAD, group_id="g", auto_offset_reset="smallest")
    with pytest.raises(InvalidConfigError, match="auto_offset_reset='earliest' means subscription_mode='all'"):
        ConsumerConfig(bootstrap_servers=DEAD, group_id="g", auto_offset_reset="earliest", subscription_mode="new")
    with pytest.raises(InvalidConfigError, match="value_deserializer must be a callable"):
        ConsumerConfig(bootstrap_servers=DEAD, group_id="g", value_deserializer="json")
    with pytest.raises(InvalidConfigError, match="value_serializer must be a callable"):
        Producer(bootstrap_servers=DEAD, value_serializer="json")
    with pytest.raises(InvalidConfigError, match="linger_ms must be a number"):
        Producer(bootstrap_servers=DEAD, linger_ms="5")
    with pytest.raises(InvalidConfigError, match="partitioner must be a callable"):
        Producer(bootstrap_servers=DEAD, partitioner="murmur2")
    with pytest.raises(InvalidConfigError, match="acks must be"):
        Producer(bootstrap_servers=DEAD, acks="leader")
    assert ConsumerConfig(bootstrap_servers=DEAD, group_id="g", auto_offset_reset="latest").subscription_mode == "new"
    for make in (AdminClient, SimpleConsumer):
        with pytest.raises(InvalidConfigError, match="request_timeout_ms must be a positive integer"):
            make(bootstrap_servers=DEAD, request_timeout_ms=0)
    with pytest.raises(InvalidConfigError, match="verify_crc must be True or False"):
        SimpleConsumer(bootstrap_servers=DEAD, verify_crc="no")


def test_topics_given_to_the_consumer_like_kafka_python_are_subscribed(server: ClusterThread) -> None:
    _produce(server, "t", [b"a"], partition=0)
    with DMQConsumer("t", bootstrap_servers=server.bootstrap, group_id="kp", **FAST) as c:
        assert c.subscription() == {"t"}
        assert [r.value for r in _drain(c, 1)] == [b"a"]
    config = ConsumerConfig(bootstrap_servers=server.bootstrap, group_id="kp2", **FAST)
    with DMQConsumer(config, "t") as c:
        assert c.subscription() == {"t"}
    with pytest.raises(InvalidArgumentError, match="topic names"):
        DMQConsumer(7, bootstrap_servers=server.bootstrap, group_id="g")  # type: ignore[arg-type]


# -- serializers ------------------------------------------------------------------------------


def test_str_and_json_serializers_round_trip(server: ClusterThread) -> None:
    with Producer(bootstrap_servers=server.bootstrap, key_serializer=str_serializer,
                  value_serializer=json_serializer, linger_ms=0) as p:
        p.send("t", {"id": 1, "name": "é"}, key="k1").get(TIMEOUT_S)
        p.send("t", [1, 2], key=None, partition=0).get(TIMEOUT_S)
        p.send_many("t", [{"n": 3}], keys=["k3"]).get(TIMEOUT_S)
        with pytest.raises(SerializationError, match="value_serializer failed for a record to 't'"):
            p.send("t", {1, 2})  # a set is not JSON
        with pytest.raises(SerializationError, match="key_serializer failed"):
            p.send("t", {}, key=b"bytes-not-str")
    with DMQConsumer(bootstrap_servers=server.bootstrap, group_id="g", auto_offset_reset="earliest",
                     key_deserializer=str_deserializer, value_deserializer=json_deserializer, **FAST) as c:
        c.subscribe("t")
        got = sorted((repr(r.key), repr(r.value)) for r in _drain(c, 3))
    assert got == sorted([("'k1'", "{'id': 1, 'name': 'é'}"), ("None", "[1, 2]"), ("'k3'", "{'n': 3}")])


def test_a_failing_deserializer_names_the_record(server: ClusterThread) -> None:
    _produce(server, "t", [b"not json"], partition=1)
    with DMQConsumer(bootstrap_servers=server.bootstrap, group_id="g", value_deserializer=json_deserializer,
                     **FAST) as c:
        c.subscribe("t")
        deadline = time.monotonic() + TIMEOUT_S
        with pytest.raises(SerializationError, match=r"value_deserializer failed on t\[1\] offset 0"):
            while time.monotonic() < deadline:
                c.poll(200)
    _produce(server, "t", [b"v"], partition=0)
    with Producer(bootstrap_servers=server.bootstrap, linger_ms=0) as p:
        p.send("t", b"v", key=b"\xff", partition=0).get(TIMEOUT_S)
    with DMQConsumer(bootstrap_servers=server.bootstrap, group_id="g2", key_deserializer=str_deserializer,
                     auto_offset_reset="earliest", **FAST) as c:
        c.assign([TopicPartition("t", 0)])
        deadline = time.monotonic() + TIMEOUT_S
        returned: list[Any] = []
        with pytest.raises(SerializationError, match=r"key_deserializer failed on t\[0\] offset 1") as info:
            while time.monotonic() < deadline:
                returned.extend(c.poll(200))
        assert [(r.offset, r.key) for r in returned] == [(0, None)]  # the good record before it came out
        assert c.position(TopicPartition("t", 0)) == 1  # at the failed record
        assert "seek(TopicPartition('t', 0), 2) skips the record" in str(info.value)
        c.seek(TopicPartition("t", 0), 2)
        _produce(server, "t", [b"after"], partition=0)
        assert [r.value for r in _drain(c, 1)] == [b"after"]


# -- where a consumer starts ------------------------------------------------------------------


def test_auto_offset_reset_latest_skips_what_was_there(server: ClusterThread) -> None:
    _produce(server, "t", [b"old"], partition=0)
    with DMQConsumer(bootstrap_servers=server.bootstrap, group_id="late", auto_offset_reset="latest", **FAST) as c:
        c.subscribe("t")
        assert _drain(c, 1, timeout_s=1.0) == []
        _produce(server, "t", [b"new"], partition=0)
        assert [r.value for r in _drain(c, 1)] == [b"new"]


def test_poll_takes_timeout_ms_and_max_records(server: ClusterThread) -> None:
    _produce(server, "t", [b"%d" % i for i in range(5)], partition=0)
    with DMQConsumer(bootstrap_servers=server.bootstrap, group_id="g", **FAST) as c:
        c.subscribe("t")
        first: list[Any] = []
        deadline = time.monotonic() + TIMEOUT_S
        while not first and time.monotonic() < deadline:
            first = list(c.poll(timeout_ms=100, max_records=2))
        assert len(first) == 2
        started = time.monotonic()
        assert len(_drain(c, 3)) == 3
        assert list(c.poll(timeout_ms=300)) == []
        assert time.monotonic() - started >= 0.3
        with pytest.raises(InvalidArgumentError, match="timeout_ms"):
            c.poll(timeout=1.0)
        with pytest.raises(InvalidArgumentError, match="max_records"):
            c.poll(max_records=0)


# -- offsets look-ups ---------------------------------------------------------------------------


def test_beginning_end_offsets_and_offsets_for_times(server: ClusterThread) -> None:
    _produce(server, "t", [b"a", b"b", b"c"], partition=0)
    # Not the clock read at once: that can be c's own append ms, and then c (2) is found, not d.
    middle_ms = ms_after_acknowledged()
    _produce(server, "t", [b"d"], partition=0)
    tp0, tp1 = TopicPartition("t", 0), TopicPartition("t", 1)
    with DMQConsumer(bootstrap_servers=server.bootstrap, group_id="g", **FAST) as c:
        assert c.beginning_offsets([tp0, tp1]) == {tp0: 0, tp1: 0}
        assert c.end_offsets([tp0, tp1]) == {tp0: 4, tp1: 0}
        found = c.offsets_for_times({tp0: middle_ms, tp1: 0})
        assert found == {tp0: OffsetAndTimestamp(3, ANY), tp1: None}
        assert c.offsets_for_times({tp0: int(time.time() * 1000) + 60_000}) == {tp0: None}
        with pytest.raises(InvalidArgumentError, match="epoch ms"):
            c.offsets_for_times({tp0: -5})


# -- manual assignment and patterns -------------------------------------------------------------


def test_assign_reads_partitions_without_a_group(server: ClusterThread) -> None:
    _produce(server, "t", [b"p0-a", b"p0-b"], partition=0)
    _produce(server, "t", [b"p1-a"], partition=1)
    tp0, tp1 = TopicPartition("t", 0), TopicPartition("t", 1)
    with DMQConsumer(bootstrap_servers=server.bootstrap, group_id="manual", **FAST) as c:
        c.assign([tp1])
        assert c.assignment() == {tp1}
        assert [r.value for r in _drain(c, 1)] == [b"p1-a"]
        c.assign([tp0, tp1])
        assert [r.value for r in _drain(c, 2)] == [b"p0-a", b"p0-b"]
        c.seek(tp0, 1)
        assert [r.value for r in _drain(c, 1)] == [b"p0-b"]
        with pytest.raises(IllegalStateError, match="unsubscribe"):
            c.subscribe("t")
        with pytest.raises(InvalidArgumentError, match="does not exist"):
            c.assign([TopicPartition("t", 5)])
        assert c.metrics()["manually_assigned_partitions"] == 2
        c.unsubscribe()
        assert c.assignment() == set()
        with pytest.raises(IllegalStateError, match="assign"):
            c.poll(0)
    with DMQConsumer(bootstrap_servers=server.bootstrap, group_id="manual", auto_offset_reset="latest", **FAST) as c:
        c.assign([tp0])
        assert _drain(c, 1, timeout_s=1.0) == []
        _produce(server, "t", [b"p0-c"], partition=0)
        assert [r.value for r in _drain(c, 1)] == [b"p0-c"]


def test_pattern_subscription_follows_new_topics(server: ClusterThread) -> None:
    with AdminClient(bootstrap_servers=server.bootstrap) as admin:
        admin.create_topic("orders-eu", 1)
        admin.create_topic("audit", 1)
    _produce(server, "orders-eu", [b"eu"])
    _produce(server, "audit", [b"no"])
    with DMQConsumer(bootstrap_servers=server.bootstrap, group_id="g", metadata_max_age_ms=200, **FAST) as c:
        c.subscribe(pattern=r"orders-.*")
        assert c.subscription() == {"orders-eu"}
        assert [r.value for r in _drain(c, 1)] == [b"eu"]
        with AdminClient(bootstrap_servers=server.bootstrap) as admin:
            admin.create_topic("orders-us", 1)
        _produce(server, "orders-us", [b"us"])
        got = _drain(c, 1)
        assert [(r.topic, r.value) for r in got] == [("orders-us", b"us")]
        assert c.subscription() == {"orders-eu", "orders-us"}
        with pytest.raises(InvalidArgumentError, match="not a regular expression"):
            c.subscribe(pattern="orders-(")


# -- futures and metrics ----------------------------------------------------------------------


def test_send_future_done_callbacks_and_metrics(server: ClusterThread) -> None:
    seen: list[Any] = []
    fired = threading.Event()
    with Producer(bootstrap_servers=server.bootstrap, linger_ms=0) as p:
        f = p.send("t", b"x", partition=0)
        f.add_done_callback(lambda fut: (seen.append(fut.result().offset), fired.set()))
        assert fired.wait(TIMEOUT_S) and seen == [0]
        assert f.done() and not f.cancel() and not f.cancelled()
        # Already done: wait() answers at once, callbacks run at once.
        assert concurrent.futures.wait([f], timeout=0).not_done == set()
        late: list[Any] = []
        f.add_done_callback(late.append)
        assert late == [f]
        assert p.metrics()["records_failed"] == 0
    with DMQConsumer(bootstrap_servers=server.bootstrap, group_id="g", **FAST) as c:
        c.subscribe("t")
        assert len(_drain(c, 1)) == 1
        m = c.metrics()
        assert m["records_returned"] == 1 and m["polls"] >= 1
        assert m["assigned_partitions"] == 2 and m["joined_groups"] == 1 and m["subscribed_topics"] == 1
