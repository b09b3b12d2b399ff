"""DMQConsumer behaves as kafka-python's KafkaConsumer where the README says it follows it
(issue 26 item 11), over a real server: ``for msg in consumer`` (ended by consumer_timeout_ms),
poll()'s first positional argument is timeout_ms, poll()'s result answers ``.items()`` and
``[tp]`` as kafka-python's dict while iterating it yields records, partitions_for_topic(),
topics(), and offsets_for_times() giving OffsetAndTimestamp."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import pytest

from dmq.client import AdminClient, DMQConsumer, Producer, TopicPartition
from dmq.client.cli.runner import ClusterThread
from dmq.client.consumer import ConsumerRecords, OffsetAndTimestamp
from dmq.client.errors import InvalidArgumentError, InvalidConfigError
from dmq.client.records import ConsumerRecord

pytestmark = pytest.mark.timeout(120)

TIMEOUT_S = 15.0
FAST = {"heartbeat_interval_ms": 200, "session_timeout_ms": 3000, "retry_backoff_ms": 50}
TP0, TP1 = TopicPartition("t", 0), TopicPartition("t", 1)


@pytest.fixture
def server(cluster_factory: Callable[..., ClusterThread]) -> ClusterThread:
    cluster = cluster_factory(rebalance_debounce_ms=100)
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("t", 2)
        admin.create_topic("other", 3)
    return cluster


def _produce(server: ClusterThread, values: list[bytes], partition: int) -> None:
    with Producer(bootstrap_servers=server.bootstrap, linger_ms=0) as p:
        for v in values:
            p.send("t", v, partition=partition).get(TIMEOUT_S)


def _first_poll(c: DMQConsumer, **kwargs: Any) -> ConsumerRecords:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        records = c.poll(200, **kwargs)
        if records:
            return records
    raise AssertionError("no records within TIMEOUT_S")


@pytest.mark.slow
def test_for_msg_in_consumer_ends_after_consumer_timeout_ms(server: ClusterThread) -> None:
    with DMQConsumer("t", bootstrap_servers=server.bootstrap, group_id="g", consumer_timeout_ms=2000,
                     auto_offset_reset="earliest", **FAST) as c:
        # Joined before the loop: consumer_timeout_ms counts from the start of an iteration, the
        # group join included (as in kafka-python), and on a loaded machine a join can outlast it
        # (the loop then ends before the records arrive: seen with 500 ms at load average 22).
        deadline = time.monotonic() + TIMEOUT_S
        while not c.assignment() and time.monotonic() < deadline:
            assert not c.poll(100)  # nothing produced yet
        assert c.assignment() == {TP0, TP1}
        _produce(server, [b"a", b"b", b"c"], partition=0)
        values = [msg.value for msg in c]  # kafka-python's loop: ends once no record came for 2 s
        assert values == [b"a", b"b", b"c"]
        started = time.monotonic()
        assert list(c) == []  # iterating again waits consumer_timeout_ms for a record, then ends
        assert time.monotonic() - started >= 2.0


def test_leaving_the_loop_commits_only_the_records_it_gave(server: ClusterThread) -> None:
    """A batch fetched for the iterator is handed out one record at a time: close() after a break
    commits the position after the last record given, not after the batch."""
    _produce(server, [b"%d" % i for i in range(6)], partition=0)
    settings = dict(bootstrap_servers=server.bootstrap, group_id="g", consumer_timeout_ms=10_000, **FAST)
    with DMQConsumer("t", **settings) as c:  # type: ignore[arg-type]
        seen = [msg.value for msg in itertools.islice(c, 2)]
        assert c.position(TP0) == 2
    with DMQConsumer("t", **settings) as c:  # type: ignore[arg-type]
        rest = [msg.value for msg in itertools.islice(c, 4)]
    assert seen + rest == [b"%d" % i for i in range(6)]


def test_consumer_timeout_ms_is_checked(server: ClusterThread) -> None:
    with pytest.raises(InvalidConfigError, match="consumer_timeout_ms"):
        DMQConsumer(bootstrap_servers=server.bootstrap, group_id="g", consumer_timeout_ms=-1)


def test_poll_first_positional_argument_is_timeout_ms(server: ClusterThread) -> None:
    with DMQConsumer("t", bootstrap_servers=server.bootstrap, group_id="g", **FAST) as c:
        c.poll(0)
        started = time.monotonic()
        assert list(c.poll(50)) == []  # 50 ms (as kafka-python), not 50 s
        took_s = time.monotonic() - started
        assert 0.05 <= took_s < 5.0, took_s
        _produce(server, [b"%d" % i for i in range(5)], partition=0)
        assert len(_first_poll(c, max_records=2)) == 2
        assert len(c.poll(5000, 1)) == 1  # poll(timeout_ms, max_records), positionally
        with pytest.raises(InvalidArgumentError, match="timeout_ms"):
            c.poll(timeout=1.0)  # seconds, the old meaning: refused with a pointer to timeout_ms
        with pytest.raises(InvalidArgumentError, match="timeout_ms"):
            c.poll(-1)


def test_poll_result_is_a_dict_of_partitions_that_iterates_records(server: ClusterThread) -> None:
    _produce(server, [b"a0", b"a1"], partition=0)
    _produce(server, [b"b0"], partition=1)
    with DMQConsumer("t", bootstrap_servers=server.bootstrap, group_id="g", **FAST) as c:
        got: dict[TopicPartition, list[bytes]] = {}
        deadline = time.monotonic() + TIMEOUT_S
        while sum(map(len, got.values())) < 3 and time.monotonic() < deadline:
            records = c.poll(200)
            for tp, msgs in records.items():  # kafka-python's loop
                assert all(isinstance(m, ConsumerRecord) and (m.topic, m.partition) == tp for m in msgs)
                assert records[tp] == msgs and records.get(tp) == msgs and tp in records
                got.setdefault(tp, []).extend(m.value for m in msgs)
            assert set(records.keys()) == {tp for tp, _ in records.items()}
            assert [list(v) for v in records.values()] == [records[tp] for tp in records.keys()]
            assert [r.value for r in records] == [m.value for msgs in records.values() for m in msgs]
        assert got == {TP0: [b"a0", b"a1"], TP1: [b"b0"]}
        empty = c.poll(0)
        assert dict(empty.items()) == {} and empty.get(TP0) is None and TP0 not in empty
        with pytest.raises(KeyError):
            empty[TP0]  # as kafka-python's dict


def test_partitions_for_topic_and_topics(server: ClusterThread) -> None:
    with DMQConsumer(bootstrap_servers=server.bootstrap, group_id="g", **FAST) as c:
        assert c.partitions_for_topic("t") == {0, 1}
        assert c.partitions_for_topic("other") == {0, 1, 2}
        assert c.partitions_for_topic("missing") is None  # kafka-python's None for an unknown topic
        assert c.topics() == {"t", "other"}
        with AdminClient(server.bootstrap) as admin:
            admin.create_topic("later", 1)
        assert c.topics() == {"t", "other", "later"}  # asked again, not the cache


def test_offsets_for_times_gives_offset_and_timestamp(server: ClusterThread) -> None:
    _produce(server, [b"a", b"b"], partition=0)
    with DMQConsumer("t", bootstrap_servers=server.bootstrap, group_id="g", **FAST) as c:
        first = next(iter(_first_poll(c)))
        found = c.offsets_for_times({TP0: 0, TP1: 0})
        assert found[TP1] is None  # nothing in partition 1
        assert isinstance(found[TP0], OffsetAndTimestamp)
        assert found[TP0] == OffsetAndTimestamp(0, first.timestamp)  # the found record's own timestamp
        assert (found[TP0].offset, found[TP0].timestamp) == (0, first.timestamp)
