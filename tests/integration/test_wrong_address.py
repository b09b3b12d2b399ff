"""A wrong address fails fast and says so (issue 26 item 10), as kafka-python's NoBrokersAvailable.

A closed loopback port (one bound and closed by the test, so nothing listens on it) stands for a
mistyped address: Producer and DMQConsumer construction raise NoBrokersAvailableError naming it
within request_timeout_ms, instead of send() blocking for max_block_ms (~60 s) and poll()
returning nothing forever. A real server's address still works.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator

import pytest

from dmq.client import ConsumerConfig, DMQConsumer, Producer
from dmq.client.aio import AsyncConsumer, AsyncProducer
from dmq.client.cli.runner import ClusterThread
from dmq.client.errors import CoordinatorUnavailableError, NoBrokersAvailable, NoBrokersAvailableError

REQUEST_TIMEOUT_MS = 2_000
# A refused connection fails at once; the bound is the setting itself plus scheduling slack.
SLACK_S = 1.0


@pytest.fixture
def closed_address() -> Iterator[str]:
    """A loopback port that was bound and closed: connecting to it is refused."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    yield f"127.0.0.1:{port}"


def _raises_fast(make: Callable[[], object], address: str) -> NoBrokersAvailableError:
    started = time.monotonic()
    with pytest.raises(NoBrokersAvailableError) as info:
        made = make()
        close = getattr(made, "close", None)
        if close is not None:
            close()
    took_s = time.monotonic() - started
    assert took_s < REQUEST_TIMEOUT_MS / 1000 + SLACK_S, f"took {took_s:.1f} s"
    assert address in str(info.value), str(info.value)
    assert "bootstrap_servers" in str(info.value), str(info.value)
    return info.value


def test_producer_construction_fails_fast_naming_the_address(closed_address: str) -> None:
    err = _raises_fast(lambda: Producer(bootstrap_servers=closed_address, request_timeout_ms=REQUEST_TIMEOUT_MS),
                       closed_address)
    assert isinstance(err, CoordinatorUnavailableError) and NoBrokersAvailable is NoBrokersAvailableError


def test_producer_default_settings_fail_fast_too(closed_address: str) -> None:
    """The defaults (request_timeout_ms 30 s, max_block_ms 60 s): a refused connection is not waited on."""
    started = time.monotonic()
    with pytest.raises(NoBrokersAvailableError, match=closed_address):
        Producer(bootstrap_servers=closed_address)
    assert time.monotonic() - started < REQUEST_TIMEOUT_MS / 1000 + SLACK_S


@pytest.mark.parametrize("shape", ["kafka-python", "config", "subscribe-later"])
def test_consumer_construction_fails_fast_naming_the_address(closed_address: str, shape: str) -> None:
    settings = {"group_id": "g", "request_timeout_ms": REQUEST_TIMEOUT_MS}
    makers: dict[str, Callable[[], object]] = {
        "kafka-python": lambda: DMQConsumer("t", bootstrap_servers=closed_address, **settings),
        "config": lambda: DMQConsumer(ConsumerConfig(bootstrap_servers=closed_address, **settings)),
        "subscribe-later": lambda: DMQConsumer(bootstrap_servers=closed_address, **settings),
    }
    _raises_fast(makers[shape], closed_address)


def test_async_clients_fail_fast_at_start(closed_address: str) -> None:
    import asyncio

    async def start(client: AsyncConsumer | AsyncProducer) -> None:
        try:
            await client.start()
        finally:
            await client.stop()

    for make in (lambda: AsyncConsumer("t", bootstrap_servers=closed_address, group_id="g",
                                       request_timeout_ms=REQUEST_TIMEOUT_MS),
                 lambda: AsyncProducer(bootstrap_servers=closed_address, request_timeout_ms=REQUEST_TIMEOUT_MS)):
        _raises_fast(lambda make=make: asyncio.run(start(make())), closed_address)  # type: ignore[misc]


def test_a_reachable_address_still_works(cluster: ClusterThread) -> None:
    with Producer(bootstrap_servers=cluster.bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS):
        pass
    with DMQConsumer(bootstrap_servers=cluster.bootstrap, group_id="g", request_timeout_ms=REQUEST_TIMEOUT_MS):
        pass
