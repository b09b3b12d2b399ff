"""dmq.client.aio over real servers on loopback (the cluster fixtures run them on their own
thread and loop; the clients here run on the test's loop)."""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
import pytest

from dmq.client.aio import AsyncAdminClient, AsyncConsumer, AsyncProducer
from dmq.client.consumer import TopicPartition
from dmq.client.errors import (
    ClientClosedError,
    InvalidArgumentError,
    InvalidConfigError,
    TopicAlreadyExistsError,
    TopicNotFoundError,
    UnknownSettingError,
)
from dmq.proto import dmq_pb2 as pb
from dmq.proto.wire import frame_produce_request
from tests.aio.conftest import FAST, create, produce

pytestmark = pytest.mark.timeout(60)


async def drain(consumer: AsyncConsumer, want: int, seen: list, timeout_s: float = 20.0, max_records: int = 500) -> None:
    deadline = time.monotonic() + timeout_s
    while len(seen) < want and time.monotonic() < deadline:
        batch = await consumer.getmany(timeout_ms=200, max_records=max_records)
        for records in batch.values():
            seen.extend((r.partition, r.offset, r.value) for r in records)


async def test_produce_then_consume_with_async_for(server):
    await create(server.bootstrap, "orders", 3)
    stored = await produce(server.bootstrap, "orders", 300)
    assert len(set(stored)) == 300
    got = []
    async with AsyncConsumer("orders", bootstrap_servers=[server.bootstrap], group_id="app", **FAST) as consumer:
        async for record in consumer:
            got.append(record)
            if len(got) == 300:
                break
    assert sorted(int(r.value) for r in got) == list(range(300))
    assert {(r.partition, r.offset) for r in got} == set(stored)
    for p in range(3):  # per partition, in offset order
        offsets = [r.offset for r in got if r.partition == p]
        assert offsets == sorted(offsets)


async def test_idempotent_retry_of_a_batch_is_stored_once(server):
    """A batch sent again with its sequence (a retry whose first answer was lost) is answered
    as a duplicate with the original offset, not appended twice."""
    await create(server.bootstrap, "idem", 1)
    async with AsyncProducer(server.bootstrap, linger_ms=1) as producer:
        assert producer.producer_id >= 0  # idempotent by default with acks="all"
        handle = await producer.send("idem", b"once")
        first = await handle
        batch = handle._batch
        assert batch.base_sequence == 0 and batch.payload is not None
        cluster = producer._cluster
        address = cluster.leader_for("idem", 0)
        again = await cluster.raw_produce(address)(frame_produce_request("idem", 0, pb.ACKS_ALL, batch.payload), timeout=5)
        assert again.duplicate and again.base_offset == first.offset
        after = await producer.send_and_wait("idem", b"next")
        assert after.offset == first.offset + 1


async def test_commit_then_resume_after_stop(server):
    await create(server.bootstrap, "resume", 1)
    await produce(server.bootstrap, "resume", 50)
    tp = TopicPartition("resume", 0)
    settings = dict(FAST, enable_auto_commit=False)
    async with AsyncConsumer("resume", bootstrap_servers=server.bootstrap, group_id="app", **settings) as consumer:
        for _ in range(20):
            record = await consumer.getone()
        assert record.offset == 19
        await consumer.commit()
        assert await consumer.committed(tp) == 20
        assert await consumer.position(tp) == 20
        await consumer.getone()  # handed out but not committed: without auto-commit, read again below
    async with AsyncConsumer("resume", bootstrap_servers=server.bootstrap, group_id="app", **settings) as consumer:
        record = await consumer.getone()
        assert record.offset == 20
        assert await consumer.committed(tp) == 20


async def test_rebalance_hand_off_loses_and_repeats_nothing(server):
    """A second member joins while the first is consuming: the partitions that move are
    committed by the first before it acknowledges, and the second starts exactly there."""
    n = 2000
    await create(server.bootstrap, "handoff", 4)
    await produce(server.bootstrap, "handoff", n)
    seen1: list = []
    seen2: list = []
    kw = dict(bootstrap_servers=server.bootstrap, group_id="app", **FAST)
    async with AsyncConsumer("handoff", **kw) as c1:
        while len(seen1) < 200:
            for records in (await c1.getmany(timeout_ms=200, max_records=50)).values():
                seen1.extend((r.partition, r.offset, r.value) for r in records)
        assert len(c1.assignment()) == 4
        async with AsyncConsumer("handoff", **kw) as c2:

            async def run(consumer: AsyncConsumer, seen: list) -> None:
                deadline = time.monotonic() + 20
                while len(seen1) + len(seen2) < n and time.monotonic() < deadline:
                    for records in (await consumer.getmany(timeout_ms=100, max_records=20)).values():
                        seen.extend((r.partition, r.offset, r.value) for r in records)
                    await asyncio.sleep(0.005)  # both members get turns while the group rebalances

            await asyncio.gather(run(c1, seen1), run(c2, seen2))
            assert c1.assignment() and c2.assignment()
            assert c1.assignment() | c2.assignment() == {TopicPartition("handoff", p) for p in range(4)}
            assert not c1.assignment() & c2.assignment()
    both = seen1 + seen2
    assert seen2, "the second member got nothing"
    assert len(both) == len(set(both)) == n, f"{len(both) - len(set(both))} duplicates, {n - len(set(both))} never returned"
    assert sorted(int(v) for _, _, v in both) == list(range(n))


async def test_stop_leaves_the_group_promptly(server):
    """With a 30 s session timeout, only LeaveGroup explains the other member getting every
    partition within a few seconds of stop()."""
    await create(server.bootstrap, "leave", 4)
    kw = dict(bootstrap_servers=server.bootstrap, group_id="app", **FAST)
    async with AsyncConsumer("leave", **kw) as c1:
        c2 = AsyncConsumer("leave", **kw)
        await c2.start()
        deadline = time.monotonic() + 10
        while not (len(c1.assignment()) == 2 and len(c2.assignment()) == 2) and time.monotonic() < deadline:
            await asyncio.gather(c1.getmany(timeout_ms=100), c2.getmany(timeout_ms=100))
        assert len(c1.assignment()) == len(c2.assignment()) == 2
        await c2.stop()
        stopped = time.monotonic()
        while len(c1.assignment()) < 4 and time.monotonic() - stopped < 10:
            await c1.getmany(timeout_ms=100)
        assert len(c1.assignment()) == 4
        assert time.monotonic() - stopped < 10  # far below the 30 s session timeout
        with pytest.raises(ClientClosedError):
            await c2.getmany()


async def test_admin_topics(server):
    async with AsyncAdminClient(server.bootstrap) as admin:
        created = await admin.create_topic("t1", 2, {"retention_ms": 60_000})
        assert created.partition_count == 2
        # the given setting, and the replication settings the coordinator chose (one broker: 1)
        assert created.config == {"retention_ms": 60_000, "replication_factor": 1, "min_insync_replicas": 1,
                                  "unclean_leader_election": False}
        with pytest.raises(TopicAlreadyExistsError):
            await admin.create_topic("t1", 2)
        assert [t.name for t in await admin.list_topics()] == ["t1"]
        assert (await admin.describe_topic("t1")).partition_count == 2
        assert len(await admin.list_brokers()) == 1
        await admin.delete_topic("t1")
        with pytest.raises(TopicNotFoundError):
            await admin.describe_topic("t1")
        with pytest.raises(InvalidArgumentError, match="partitions"):
            await admin.create_topic("t2", 0)


async def test_unknown_topic(server):
    async with AsyncProducer(server.bootstrap, max_block_ms=2_000) as producer:
        with pytest.raises(TopicNotFoundError, match="nope"):
            await producer.send("nope", b"x")
    consumer = AsyncConsumer("nope", bootstrap_servers=server.bootstrap, group_id="app")
    with pytest.raises(TopicNotFoundError, match="nope"):
        await consumer.start()
    with pytest.raises(ClientClosedError):  # a failed start() stops it
        await consumer.getmany()


@pytest.mark.parametrize(
    ("make", "setting"),
    [
        (lambda: AsyncProducer("127.0.0.1:1", acks=5), "acks"),
        (lambda: AsyncProducer("127.0.0.1:1", linger_ms=-1), "linger_ms"),
        (lambda: AsyncProducer("127.0.0.1:1", batch_size=0), "batch_size"),
        (lambda: AsyncProducer("nowhere"), "bootstrap_servers"),
        (lambda: AsyncProducer(["127.0.0.1:x"]), "bootstrap_servers"),
        (lambda: AsyncConsumer("t", bootstrap_servers="127.0.0.1:1", group_id="g", session_timeout_ms=-1), "session_timeout_ms"),
        (lambda: AsyncConsumer("t", bootstrap_servers="127.0.0.1:1", group_id="g", fetch_wait=5), "fetch_wait"),
        (lambda: AsyncConsumer("t", bootstrap_servers="127.0.0.1:1"), "group_id"),
        (lambda: AsyncConsumer("t", group_id="g"), "bootstrap_servers"),
        (lambda: AsyncAdminClient("127.0.0.1:1", request_timeout_ms=0), "request_timeout_ms"),
    ],
)
def test_bad_settings_name_the_setting(make, setting):
    with pytest.raises(InvalidConfigError, match=setting):
        make()


async def test_an_unknown_consumer_setting_is_named_with_close_names():
    """As the sync clients: UnknownSettingError listing the close names (it was a plain error)."""
    with pytest.raises(UnknownSettingError, match="auto_offset_reset"):
        AsyncConsumer("t", bootstrap_servers="127.0.0.1:1", group_id="g", auto_offset_rest="earliest")


async def test_no_thread_per_client_or_call(server, monkeypatch):
    """Producing and consuming start no thread: everything is a task on this loop. (Threads
    the servers start, from their own thread, do not count.)"""
    await create(server.bootstrap, "threads", 2)
    here = threading.current_thread()
    started: list[str] = []
    original = threading.Thread.start

    def start(self: threading.Thread) -> None:
        if threading.current_thread() is here:
            started.append(self.name)
        original(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    await produce(server.bootstrap, "threads", 100)
    seen: list = []
    async with AsyncConsumer("threads", bootstrap_servers=server.bootstrap, group_id="app", **FAST) as consumer:
        await drain(consumer, 100, seen)
    assert len(seen) == 100
    assert not started, f"threads started by the client: {started}"


async def test_listener_seek_and_partition_filter(server):
    await create(server.bootstrap, "seek", 2)
    async with AsyncProducer(server.bootstrap, linger_ms=1) as producer:
        for p in (0, 1):
            for i in range(10):
                await producer.send("seek", b"%d-%d" % (p, i), partition=p)
    assigned: list = []

    class Listener:
        async def on_partitions_assigned(self, partitions):  # a coroutine callback is awaited
            await asyncio.sleep(0)
            assigned.append(set(partitions))

        def on_partitions_revoked(self, partitions):
            pass

    tp0, tp1 = TopicPartition("seek", 0), TopicPartition("seek", 1)
    async with AsyncConsumer("seek", bootstrap_servers=server.bootstrap, group_id="app", listener=Listener(), **FAST) as c:
        only1 = await c.getmany(tp1, timeout_ms=5_000)
        assert set(only1) == {tp1} and [r.offset for r in only1[tp1]] == list(range(10))
        assert assigned == [{tp0, tp1}]
        c.seek(tp0, 7)
        assert await c.position(tp0) == 7
        got = await c.getmany(tp0, timeout_ms=5_000)
        assert [r.value for r in got[tp0]] == [b"0-7", b"0-8", b"0-9"]
        with pytest.raises(InvalidArgumentError):
            c.seek(tp0, -1)
        await c.seek_to_beginning(tp0)
        assert (await c.getone()).offset == 0  # buffers a chunk of tp0 for getone()
        c.pause(tp0)  # the buffered, unreturned records are fetched again after resume()
        assert c.paused() == {tp0}
        assert await c.getmany(timeout_ms=300) == {}
        c.resume(tp0)
        got = await c.getmany(timeout_ms=5_000)
        assert [r.offset for r in got[tp0]] == list(range(1, 10))
        await c.seek_to_end()
        assert await c.position(tp0) == 10 and await c.position(tp1) == 10


class _NeverAnswer(grpc.GenericRpcHandler):
    """Every unary call is accepted and never answered (a hung coordinator)."""

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        async def hang(_request: bytes, _context: grpc.aio.ServicerContext) -> bytes:
            await asyncio.Event().wait()
            return b""

        return grpc.unary_unary_rpc_method_handler(hang)


async def test_getmany_keeps_its_timeout_while_the_coordinator_hangs():
    """A coordinator that accepts connections and calls but never answers: each group call waits
    for its request_timeout_ms, in the background; getmany() still returns within its own
    timeout. (One that never completes a connection fails start() with NoBrokersAvailableError:
    test_wrong_address.py.)"""
    hung = grpc.aio.server()
    hung.add_generic_rpc_handlers((_NeverAnswer(),))
    port = hung.add_insecure_port("127.0.0.1:0")
    await hung.start()
    consumer = AsyncConsumer("t", bootstrap_servers=f"127.0.0.1:{port}", group_id="g", request_timeout_ms=1_500,
                             fetch_max_wait_ms=100, heartbeat_interval_ms=300, retry_backoff_ms=20)
    try:
        await asyncio.wait_for(consumer.start(), 10)  # the find times out (retriable): retried by getmany()
        for _ in range(5):
            started = time.monotonic()
            assert await consumer.getmany(timeout_ms=100) == {}
            assert time.monotonic() - started < 1.0  # not a group call's 1.5 s
    finally:
        await asyncio.wait_for(consumer.stop(timeout=2), 10)
        await hung.stop(0)
