"""The client's one Fetch path (PartitionReader, and TopicTail on it) against real brokers:
answers taken per broker as they come, a hung or dead broker holding up only its own partitions,
leaders looked up again after NOT_LEADER, errors mapped onto the client's classes."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from dmq.client._cluster import Cluster
from dmq.client._reader import INLINE, FetchAnswer, FetchWant, PartitionReader, partition_error
from dmq.client._tail import TopicTail
from dmq.client.admin import AdminClient
from dmq.client.cli.runner import ClusterThread
from dmq.client.errors import (
    BrokerUnavailableError,
    DMQTimeoutError,
    OffsetOutOfRangeError,
    TopicNotFoundError,
    UnknownPartitionError,
)
from dmq.proto import dmq_pb2 as pb
from dmq.proto import records
from dmq.proto.offset_markers import EARLIEST, LATEST

TOPIC = "read"
TIMEOUT_S = 10.0


@pytest.fixture
def two(cluster_factory) -> Iterator[tuple[ClusterThread, Cluster]]:  # type: ignore[no-untyped-def]
    """Two brokers, each leading one partition of TOPIC, ten records in each."""
    cluster = cluster_factory(brokers=2, shared_port=False)
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic(TOPIC, 2)
    c = Cluster(cluster.bootstrap, request_timeout_ms=1500)
    assert c.leader_for(TOPIC, 0) != c.leader_for(TOPIC, 1)
    for p in range(2):
        produce(c, p, [b"%d-%d" % (p, i) for i in range(10)])
    yield cluster, c
    c.close()


@pytest.fixture
def silent() -> Iterator[str]:
    """An address that accepts connections and never answers: a hung (SIGSTOPped) broker."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield f"127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def produce(c: Cluster, partition: int, values: list[bytes]) -> None:
    stub = c.broker_stub(c.leader_for(TOPIC, partition))
    stub.Produce(pb.ProduceRequest(topic=TOPIC, partition=partition, batch=records.encode(values)), timeout=TIMEOUT_S)


def values(answer: FetchAnswer, partition: int) -> list[bytes]:
    (r,) = [r for r in answer.results if r.partition == partition]
    return [v for batch in records.decode_batches(r.records) for v in batch.values()]


def next_answer(reader: PartitionReader, timeout_s: float = TIMEOUT_S) -> FetchAnswer:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = reader.answers()
        if got:
            assert len(got) == 1, got
            return got[0]
        time.sleep(0.01)
    raise AssertionError(f"no answer within {timeout_s}s: {reader!r}")


def test_a_hung_broker_holds_up_only_its_own_partitions(two: tuple[ClusterThread, Cluster], silent: str) -> None:
    _, c = two
    # partition 1 "led" by a broker that never answers: its Fetch waits for its own deadline
    reader = PartitionReader(c, max_wait_ms=100, leader_hints={(TOPIC, 1): silent})
    try:
        reader.send([FetchWant(TOPIC, 0, 0), FetchWant(TOPIC, 1, 0)])
        assert reader.in_flight((TOPIC, 0)) and reader.in_flight((TOPIC, 1)) and reader.sent == 2
        first = next_answer(reader)
        assert first.error is None and values(first, 0) == [b"0-%d" % i for i in range(10)]
        assert first.wants[(TOPIC, 0)].offset == 0
        # the next fetch of partition 0 goes out and answers while partition 1 still hangs
        produce(c, 0, [b"0-10"])
        reader.send([FetchWant(TOPIC, 0, 10), FetchWant(TOPIC, 1, 0)])
        assert reader.sent == 3  # not a second Fetch to the hung broker
        second = next_answer(reader)
        assert second.error is None and values(second, 0) == [b"0-10"]
        assert reader.in_flight((TOPIC, 1))
        # the hung one times out (max_wait_ms + request_timeout_ms), backs off, forgets the hint
        hung = next_answer(reader, timeout_s=5)
        assert hung.address == silent and isinstance(hung.error, DMQTimeoutError) and not hung.results
        assert reader.retry_at(silent) > time.monotonic() - 1
        reader.send([FetchWant(TOPIC, 1, 0)])  # now from its real leader
        assert values(next_answer(reader), 1) == [b"1-%d" % i for i in range(10)]
    finally:
        reader.close()


def test_a_dead_broker_backs_off_while_the_other_flows(two: tuple[ClusterThread, Cluster]) -> None:
    cluster, c = two
    gone = cluster.cluster.brokers[1].address
    dead_partition = next(p for p in range(2) if c.leader_for(TOPIC, p) == gone)
    live = 1 - dead_partition
    cluster.call(cluster.cluster.stop_broker(1))
    reader = PartitionReader(c, max_wait_ms=100, retry_backoff_ms=300)
    try:
        reader.send([FetchWant(TOPIC, 0, 0), FetchWant(TOPIC, 1, 0)])
        by_address: dict[str, FetchAnswer] = {}
        deadline = time.monotonic() + TIMEOUT_S
        while len(by_address) < 2 and time.monotonic() < deadline:
            by_address.update((a.address, a) for a in reader.answers())
            time.sleep(0.01)
        assert isinstance(by_address[gone].error, BrokerUnavailableError)
        assert values(by_address[c.leader_for(TOPIC, live)], live)[:1] == [b"%d-0" % live]
        # backing off: the dead broker is not asked again yet, the live one is
        sent = reader.sent
        reader.send([FetchWant(TOPIC, 0, 10), FetchWant(TOPIC, 1, 10)])
        assert reader.sent == sent + 1 and reader.in_flight((TOPIC, live)) and not reader.in_flight((TOPIC, dead_partition))
        # one partition at a time: the retries give up after the attempts, with the broker's error
        single = PartitionReader(c, max_wait_ms=0, retry_backoff_ms=10, pool=INLINE)
        with pytest.raises(BrokerUnavailableError, match=f"Fetch from broker {gone}"):
            single.result(FetchWant(TOPIC, dead_partition, 0), attempts=2)
        started = time.monotonic()
        with pytest.raises(BrokerUnavailableError):
            single.result(FetchWant(TOPIC, dead_partition, 0), deadline=started + 0.3)
        assert time.monotonic() - started < 3
        single.close()
    finally:
        reader.close()


def test_not_leader_refreshes_the_leader_and_result_retries_there(two: tuple[ClusterThread, Cluster]) -> None:
    _, c = two
    wrong = c.leader_for(TOPIC, 1)  # a live broker that does not lead partition 0
    reader = PartitionReader(c, max_wait_ms=0, retry_backoff_ms=50, leader_hints={(TOPIC, 0): wrong})
    try:
        reader.send([FetchWant(TOPIC, 0, 0)])
        answer = next_answer(reader)
        (r,) = answer.results
        assert answer.address == wrong and r.error == pb.NOT_LEADER
        assert isinstance(partition_error(r), BrokerUnavailableError)
        # the partition waits retry_backoff_ms before it is asked again, then from its leader
        reader.send([FetchWant(TOPIC, 0, 0)])
        assert not reader.in_flight((TOPIC, 0))
        time.sleep(0.06)
        reader.send([FetchWant(TOPIC, 0, 0)])
        assert values(next_answer(reader), 0)[0] == b"0-0"
    finally:
        reader.close()
    # result(): the NOT_LEADER answer is retried at the real leader within the attempts
    single = PartitionReader(c, max_wait_ms=0, retry_backoff_ms=10, leader_hints={(TOPIC, 0): wrong}, pool=INLINE)
    try:
        r = single.result(FetchWant(TOPIC, 0, 3), attempts=2)
        assert r.error == pb.NONE and records.decode_batches(r.records)[0].base_offset <= 3
    finally:
        single.close()


def test_partition_errors_map_onto_the_clients_errors(two: tuple[ClusterThread, Cluster]) -> None:
    _, c = two
    reader = PartitionReader(c, max_wait_ms=0, pool=INLINE)
    try:
        r = reader.result(FetchWant(TOPIC, 0, 99))  # returned: out of range is the caller's policy
        assert r.error == pb.OFFSET_OUT_OF_RANGE
        err = partition_error(r)
        assert isinstance(err, OffsetOutOfRangeError)
        assert (err.log_start_offset, err.log_end_offset) == (0, 10)
        started = time.monotonic()
        with pytest.raises(UnknownPartitionError, match="partition 7 does not exist"):
            reader.result(FetchWant(TOPIC, 7, 0), attempts=4)
        with pytest.raises(TopicNotFoundError):
            reader.result(FetchWant("no-such-topic", 0, 0), attempts=4)
        assert time.monotonic() - started < 3  # raised at once, not retried
    finally:
        reader.close()


def test_topic_tail_looks_up_starts_and_warns_about_a_dead_broker(two: tuple[ClusterThread, Cluster]) -> None:
    cluster, c = two
    warnings: list[str] = []
    tail = TopicTail(c, TOPIC, {0: EARLIEST, 1: LATEST}, max_wait_ms=100, warn=warnings.append)
    try:
        got: list = []
        deadline = time.monotonic() + TIMEOUT_S
        while (len(got) < 10 or 1 in tail.resets) and time.monotonic() < deadline:
            got += tail.poll()
        assert [(r.partition, r.value) for r in got] == [(0, b"0-%d" % i) for i in range(10)]  # 1 starts at its end
        assert tail.positions == {0: 10, 1: 10}
        gone = cluster.cluster.brokers[1].address
        dead = next(p for p in range(2) if c.leader_for(TOPIC, p) == gone)
        live = 1 - dead
        cluster.call(cluster.cluster.stop_broker(1))
        produce(c, live, [b"after"])
        got = []
        deadline = time.monotonic() + TIMEOUT_S
        while (not got or not warnings) and time.monotonic() < deadline:
            got += tail.poll()
        assert [(r.partition, r.offset, r.value) for r in got] == [(live, 10, b"after")]
        assert any(w.startswith(f"cannot reach broker 1 at {gone}; reading the other partitions") for w in warnings)
    finally:
        tail.close()
    # nothing of the topic left to read: the error is raised, not waited on forever
    only_dead = TopicTail(c, TOPIC, {dead: 0}, max_wait_ms=100)
    try:
        with pytest.raises(BrokerUnavailableError, match=f"Fetch from broker {gone}"):
            deadline = time.monotonic() + TIMEOUT_S
            while time.monotonic() < deadline:
                only_dead.poll()
    finally:
        only_dead.close()
