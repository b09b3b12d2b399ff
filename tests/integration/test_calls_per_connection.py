"""Fairness between connections (issue 13): one connection's calls are capped at the server.

A client that keeps many calls in flight used to have all of them queued in gRPC core's shared
queue of new calls, so every other client waited behind them (see dmq.proto.server.grpc_options). With
the servers' options a connection has at most DEFAULT_MAX_CALLS_PER_CONNECTION calls open at the
server; the rest wait in the client's own channel (not refused), and other connections are served.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from dmq.client import AdminClient, ConsumerConfig, DMQConsumer, Producer
from dmq.proto.grpc_options import channel_options
from dmq.proto.server.grpc_options import server_options

CALLS = 24
CAP = 8  # a small cap, set explicitly, to see the mechanism; the default is larger (below)


class _Held:
    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.open = 0
        self.peak = 0

    def handlers(self) -> grpc.GenericRpcHandler:
        async def hold(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            self.open += 1
            self.peak = max(self.peak, self.open)
            try:
                await self.release.wait()
            finally:
                self.open -= 1
            return request

        async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            return request

        return grpc.method_handlers_generic_handler(
            "test.Fair",
            {
                "Hold": grpc.unary_unary_rpc_method_handler(hold),
                "Echo": grpc.unary_unary_rpc_method_handler(echo),
            },
        )


def test_one_connection_gets_a_bounded_share_and_its_excess_calls_wait_not_fail() -> None:
    async def run() -> None:
        held = _Held()
        server = grpc.aio.server(options=server_options(max_calls_per_connection=CAP))
        server.add_generic_rpc_handlers((held.handlers(),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        greedy = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=channel_options())
        other = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=channel_options())
        try:
            hold = greedy.unary_unary("/test.Fair/Hold")
            calls = [asyncio.ensure_future(hold(b"%d" % i, timeout=20)) for i in range(CALLS)]
            for _ in range(100):  # bounded: until the server holds as many as it will take
                await asyncio.sleep(0.05)
                if held.open >= CAP:
                    break
            await asyncio.sleep(0.3)  # room for more to arrive, if the server would take them
            assert held.open == CAP, f"the server holds {held.open} calls of one connection"
            # another connection is served at once while the greedy one waits for room
            assert await other.unary_unary("/test.Fair/Echo")(b"hi", timeout=5) == b"hi"
            held.release.set()
            answers = await asyncio.gather(*calls)  # none refused: the excess waited in the channel
            assert sorted(answers) == sorted(b"%d" % i for i in range(CALLS))
            assert held.peak == CAP
        finally:
            held.release.set()
            await greedy.close()
            await other.close()
            await server.stop(None)

    asyncio.run(run())


@pytest.mark.slow
def test_a_consumer_of_many_topics_keeps_every_membership(cluster) -> None:  # type: ignore[no-untyped-def]
    """The default cap stays above what a well-behaved client holds open for good: one watch
    stream per subscribed topic on its coordinator channel. At a cap of 8, a consumer of 12
    topics had its heartbeats queued behind its own watches, was evicted from 4+ groups again
    and again, and read records twice."""
    topics = [f"many{i}" for i in range(12)]
    with AdminClient(cluster.bootstrap) as admin:
        for t in topics:
            admin.create_topic(t, partitions=1)
    with Producer(cluster.bootstrap) as producer:
        for t in topics:
            producer.send(t, t.encode())
        producer.flush(10)
    consumer = DMQConsumer(ConsumerConfig(metadata_service_url=cluster.bootstrap, group_id="many",
                                          session_timeout_ms=3000, heartbeat_interval_ms=500))
    try:
        consumer.subscribe(topics)
        got: list[bytes] = []
        deadline = time.monotonic() + 12  # four session timeouts: an evicted member shows
        while time.monotonic() < deadline:
            got += [r.value for r in consumer.poll(200)]
        assert sorted(got) == sorted(t.encode() for t in topics)
        assert len(consumer.assignment()) == len(topics)
    finally:
        consumer.close(timeout=5)
