"""The Producer against real brokers: leaders across a 3-broker cluster, idempotent retries after a
lost response, acks levels, send_many, a dead broker, and close()."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any

import grpc
import pytest

from dmq.client import AdminClient, Producer, SimpleConsumer
from dmq.client._cluster import Cluster
from dmq.client._partitioner import crc32_partition
from dmq.client.errors import BrokerUnavailableError, DMQTimeoutError
from dmq.proto import dmq_pb2 as pb
from dmq.proto import records

WAIT_S = 20.0


def read_all(bootstrap: str, topic: str, partition: int, *, at_least: int = 0) -> list[records.Record]:
    """Every record of the partition, once its log end reaches `at_least` (bounded by WAIT_S)."""
    with SimpleConsumer(bootstrap, max_wait_ms=0) as c:
        deadline = time.monotonic() + WAIT_S
        end = c.offsets(topic, partition)[1]
        while end < at_least and time.monotonic() < deadline:
            time.sleep(0.02)
            end = c.offsets(topic, partition)[1]
        return [r for b in c.consume_batches(topic, partition, 0, end_offset=end) for r in b] if end else []


def test_each_partition_is_written_to_and_read_from_its_leader(cluster3) -> None:  # type: ignore[no-untyped-def]
    with AdminClient(cluster3.bootstrap) as admin:
        topic = admin.create_topic("spread", 6)
        leaders = {p.partition: p.leader_address for p in topic.partitions}
        assert len(set(leaders.values())) == 3  # round robin over the three brokers
        with Producer(cluster3.bootstrap) as p:
            keys = [b"key-%d" % i for i in range(300)]
            metas = p.send_many("spread", [b"v-" + k for k in keys], keys=keys).get(WAIT_S)
            single = p.send("spread", b"explicit", partition=5).get(WAIT_S)
        assert {m.partition for m in metas} == set(range(6))
        assert single.partition == 5
        logs = admin.describe_logs("spread")
    # every partition's data lives on the broker that leads it
    assert {(d.partition, d.broker_address) for d in logs} == set(leaders.items())
    by_partition: dict[int, list[bytes]] = defaultdict(list)
    for k in keys:
        by_partition[crc32_partition(k, 6)].append(b"v-" + k)
    by_partition[5].append(b"explicit")
    with SimpleConsumer(cluster3.bootstrap) as c:
        for part in range(6):
            assert [r.value for r in read_all(cluster3.bootstrap, "spread", part)] == by_partition[part]
            assert [r.value for r in c.consume("spread", part, 1, max_records=2)] == by_partition[part][1:3]


def test_a_resent_batch_with_the_same_sequence_is_stored_once(cluster) -> None:  # type: ignore[no-untyped-def]
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("dedup", 1)
    with Cluster(cluster.bootstrap) as c:
        stub = c.broker_stub(c.leader_for("dedup", 0))

        def produce(values: list[bytes], seq: int) -> pb.ProduceResponse:
            batch = records.encode(values, producer_id=77, producer_epoch=0, base_sequence=seq)
            return stub.Produce(pb.ProduceRequest(topic="dedup", partition=0, batch=batch), timeout=WAIT_S)

        first = produce([b"a", b"b", b"c"], 0)
        again = produce([b"a", b"b", b"c"], 0)
        nxt = produce([b"d"], 3)
    assert (first.base_offset, first.duplicate) == (0, False)
    assert (again.base_offset, again.duplicate) == (0, True)
    assert (nxt.base_offset, nxt.duplicate) == (3, False)
    assert [r.value for r in read_all(cluster.bootstrap, "dedup", 0)] == [b"a", b"b", b"c", b"d"]


class _LostResponse(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "injected: connection reset after the broker appended"


class _LosingCall:
    """Wraps a real in-flight Produce: reports UNAVAILABLE once the broker has answered."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def add_done_callback(self, fn: Any) -> None:
        self._real.add_done_callback(lambda _: fn(self))

    def result(self, timeout: float | None = None) -> Any:
        self._real.result(timeout)  # the broker did append
        raise _LostResponse()

    def cancel(self) -> bool:
        return self._real.cancel()


class LossyCluster(Cluster):
    """Loses the response of the Produce calls whose batch starts at one of `lose_sequences`."""

    def __init__(self, bootstrap: str, lose_sequences: set[int]) -> None:
        super().__init__(bootstrap)
        self.lose = lose_sequences
        self.lost = 0

    def raw_produce(self, address: str) -> Any:
        real = super().raw_produce(address)
        outer = self

        class Produce:
            def future(self, request: bytes, timeout: float | None = None) -> Any:
                call = real.future(request, timeout=timeout)
                batch = pb.ProduceRequest.FromString(request).batch
                seq = records.read_header(batch).base_sequence
                if seq in outer.lose:
                    outer.lose.discard(seq)
                    outer.lost += 1
                    return _LosingCall(call)
                return call

        return Produce()


def test_a_batch_retried_after_a_lost_response_keeps_its_original_offsets(cluster) -> None:  # type: ignore[no-untyped-def]
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("lossy", 1)
    lossy = LossyCluster(cluster.bootstrap, lose_sequences={5})
    try:
        with Producer(cluster.bootstrap, cluster=lossy, retry_backoff_ms=10, linger_ms=60_000) as p:
            first = p.send_many("lossy", [b"r%d" % i for i in range(5)])
            p.flush(WAIT_S)
            second = p.send_many("lossy", [b"r%d" % i for i in range(5, 10)])
            p.flush(WAIT_S)
            assert first.offsets(0) == [0, 1, 2, 3, 4]
            # the batch starting at sequence 5 was stored, its answer lost, and it was sent
            # again: the broker recognised it and answered with the offsets it already has
            assert second.offsets(0) == [5, 6, 7, 8, 9]
        assert lossy.lost == 1
    finally:
        lossy.close()
    assert [r.value for r in read_all(cluster.bootstrap, "lossy", 0)] == [b"r%d" % i for i in range(10)]


@pytest.mark.parametrize("acks", ["all", 1, 0])
def test_acks_levels_all_deliver(cluster, acks) -> None:  # type: ignore[no-untyped-def]
    topic = f"acks-{acks}"
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic(topic, 1)
    with Producer(cluster.bootstrap, acks=acks) as p:
        many = p.send_many(topic, [b"m%d" % i for i in range(100)])
        one = p.send(topic, b"last")
        p.flush(WAIT_S)
        expected_last = -1 if acks == 0 else 100
        assert one.get(0).offset == expected_last
        assert many.offsets(0)[:2] == ([-1, -1] if acks == 0 else [0, 1])
    # acks=0: flush() returns once the batches are sent, not stored, so wait for the log end
    stored = read_all(cluster.bootstrap, topic, 0, at_least=101)
    assert [r.value for r in stored] == [b"m%d" % i for i in range(100)] + [b"last"]


def test_send_many_keeps_per_key_order(cluster) -> None:  # type: ignore[no-untyped-def]
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("bulk", 3)
    keys = [b"k%d" % (i % 13) for i in range(6000)]
    values = [b"%d" % i for i in range(6000)]
    with Producer(cluster.bootstrap, batch_size=8192) as p:
        for i in range(0, 6000, 1000):
            p.send_many("bulk", values[i : i + 1000], keys=keys[i : i + 1000])
        p.flush(WAIT_S)
    seen: dict[bytes, list[int]] = defaultdict(list)
    total = 0
    for part in range(3):
        for r in read_all(cluster.bootstrap, "bulk", part):
            assert crc32_partition(r.key, 3) == part
            seen[r.key].append(int(r.value))
            total += 1
    assert total == 6000
    assert all(v == sorted(v) for v in seen.values())


def test_callbacks_and_close_flush_what_is_buffered(cluster) -> None:  # type: ignore[no-untyped-def]
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("cb", 1)
    got: list[int] = []
    all_in = threading.Event()

    def cb(meta: Any, err: Any) -> None:
        assert err is None
        got.append(meta.offset)
        if len(got) == 50:
            all_in.set()

    p = Producer(cluster.bootstrap, linger_ms=60_000)
    for i in range(50):
        p.send("cb", b"%d" % i, callback=cb)
    p.close(WAIT_S)  # linger would hold them; close sends them first
    assert all_in.wait(WAIT_S)
    assert got == list(range(50))
    assert len(read_all(cluster.bootstrap, "cb", 0)) == 50


def test_a_dead_broker_fails_only_its_partitions(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cluster = cluster_factory(brokers=2, shared_port=False)
    with AdminClient(cluster.bootstrap) as admin:
        leaders = {p.partition: p.leader_address for p in admin.create_topic("half", 2).partitions}
    gone_address = cluster.cluster.brokers[1].address
    cluster.call(cluster.cluster.stop_broker(1))
    with Producer(
        cluster.bootstrap, request_timeout_ms=1000, delivery_timeout_ms=2000, retry_backoff_ms=50
    ) as p:
        dead = next(part for part, addr in leaders.items() if addr == gone_address)
        alive = 1 - dead
        t0 = time.monotonic()
        lost = p.send("half", b"x", partition=dead)
        ok = p.send("half", b"y", partition=alive)
        assert ok.get(WAIT_S).offset == 0
        with pytest.raises((DMQTimeoutError, BrokerUnavailableError)):
            lost.get(WAIT_S)
        assert time.monotonic() - t0 < 10
