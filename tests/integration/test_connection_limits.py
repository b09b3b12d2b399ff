"""Connection limits (issue 13): per client address (interceptor), idle connections closed."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dmq.proto import error_details
from dmq.proto.grpc_options import channel_options
from dmq.proto.server.connections import PerAddressConnectionLimit, split_peer
from dmq.proto.server.grpc_options import connection_limit, server_options
from dmq.proto.server.metrics import RpcTimings, new_registry


def _echo_handlers() -> grpc.GenericRpcHandler:
    async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return request

    async def repeat(request: bytes, context: grpc.aio.ServicerContext):
        for _ in range(3):
            yield request

    return grpc.method_handlers_generic_handler(
        "test.Echo",
        {
            "Echo": grpc.unary_unary_rpc_method_handler(echo),
            "Repeat": grpc.unary_stream_rpc_method_handler(repeat),
        },
    )


async def _server(limit: PerAddressConnectionLimit | None, **options: int) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server(options=server_options(**options), interceptors=[limit] if limit else None)
    server.add_generic_rpc_handlers((_echo_handlers(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def test_calls_beyond_the_per_address_limit_are_refused_naming_it() -> None:
    async def run() -> None:
        limit = PerAddressConnectionLimit(3, recent_s=0.5)
        server, address = await _server(limit)
        channels = [grpc.aio.insecure_channel(address, options=channel_options()) for _ in range(4)]
        try:
            for ch in channels[:3]:
                assert await ch.unary_unary("/test.Echo/Echo")(b"hi", timeout=5) == b"hi"
                assert [m async for m in ch.unary_stream("/test.Echo/Repeat")(b"r", timeout=5)] == [b"r"] * 3
            assert limit.connections("127.0.0.1") == 3
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await channels[3].unary_unary("/test.Echo/Echo")(b"hi", timeout=5)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "too many connections from 127.0.0.1" in info.value.details()
            assert "max_connections_per_address" in info.value.details()
            # a wait-and-retry refusal, never "batch too large" to a producer
            assert error_details.reason_of(info.value.trailing_metadata()) == error_details.BUSY
            # the connections already in use keep working
            assert await channels[0].unary_unary("/test.Echo/Echo")(b"again", timeout=5) == b"again"
            await channels[1].close()
            await asyncio.sleep(0.7)  # channel 1's connection is no longer in use
            assert await channels[3].unary_unary("/test.Echo/Echo")(b"now", timeout=5) == b"now"
        finally:
            for ch in channels:
                await ch.close()
            await server.stop(0)

    asyncio.run(run())


def test_with_timings_every_call_is_timed_its_own_refusals_included() -> None:
    """Metrics time calls in this, the server's first interceptor (issue 29): unary and streamed
    answers as OK, and the calls it refuses itself as RESOURCE_EXHAUSTED."""

    async def run() -> None:
        registry = new_registry()
        limit = PerAddressConnectionLimit(1, recent_s=30.0, timings=RpcTimings(registry))
        server, address = await _server(limit)
        channels = [grpc.aio.insecure_channel(address, options=channel_options()) for _ in range(2)]
        try:
            assert await channels[0].unary_unary("/test.Echo/Echo")(b"hi", timeout=5) == b"hi"
            assert [m async for m in channels[0].unary_stream("/test.Echo/Repeat")(b"r", timeout=5)] == [b"r"] * 3
            for call in (channels[1].unary_unary("/test.Echo/Echo")(b"hi", timeout=5),
                         _drain(channels[1].unary_stream("/test.Echo/Repeat")(b"r", timeout=5))):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call
                assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        finally:
            for ch in channels:
                await ch.close()
            await server.stop(0)
        counts = {(s.labels["method"], s.labels["code"]): s.value
                  for family in text_string_to_metric_families(generate_latest(registry).decode())
                  for s in family.samples if s.name == "dmq_rpc_server_duration_seconds_count"}
        assert counts == {("Echo", "OK"): 1, ("Repeat", "OK"): 1,
                          ("Echo", "RESOURCE_EXHAUSTED"): 1, ("Repeat", "RESOURCE_EXHAUSTED"): 1}

    asyncio.run(run())


async def _drain(stream: Any) -> list[Any]:
    return [m async for m in stream]


def test_idle_connections_are_closed_and_clients_reconnect() -> None:
    async def run() -> None:
        server, address = await _server(None, idle_ms=300)
        channel = grpc.aio.insecure_channel(address, options=channel_options())
        try:
            assert await channel.unary_unary("/test.Echo/Echo")(b"x", timeout=5) == b"x"
            assert channel.get_state() == grpc.ChannelConnectivity.READY
            for _ in range(40):  # bounded: the server closes it after 300 ms without calls
                await asyncio.sleep(0.1)
                if channel.get_state() != grpc.ChannelConnectivity.READY:
                    break
            assert channel.get_state() == grpc.ChannelConnectivity.IDLE
            assert await channel.unary_unary("/test.Echo/Echo")(b"y", timeout=5) == b"y"
        finally:
            await channel.close()
            await server.stop(0)

    asyncio.run(run())


def test_connection_limit_leaves_half_the_descriptors_to_files(monkeypatch) -> None:
    from dmq.proto.server import grpc_options

    monkeypatch.setattr(grpc_options, "open_files_limit", lambda: 1024)
    assert connection_limit(10_000) == 512
    assert ("grpc.max_allowed_incoming_connections", 512) in grpc_options.server_options()
    monkeypatch.setattr(grpc_options, "open_files_limit", lambda: 1 << 20)
    assert connection_limit(10_000) == 10_000


@pytest.mark.parametrize(
    ("peer", "split"),
    [("ipv4:10.0.0.7:51234", ("10.0.0.7", "51234")), ("ipv6:[::1]:80", ("[::1]", "80")), ("unix:/tmp/s", None), ("", None)],
)
def test_split_peer(peer, split) -> None:
    assert split_peer(peer) == split
