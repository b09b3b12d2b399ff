"""AsyncCluster: the sync client's metadata cache and call builders, on grpc.aio channels.

The asyncio client reuses the synchronous client's pure parts (request building, answer parsing,
error mapping, the metadata cache, retry and idempotence rules of the sender, the fetch buffers)
rather than writing them again. Its stubs are plain grpc.aio stubs: ``await stub.X(req,
timeout=)`` is the answer. The reused parts that keep calls in flight across polls (the producer's
sender, the consumer's fetch reader and position look-ups, the metadata refresh) start them
through ``start_unary``, which makes each a task on the loop: what they ask of a call (done(),
result() once done, cancel(), add_done_callback(), dmq.client._calls.PendingCall) a task gives.

    AsyncCluster   a Cluster whose channels are aio channels and whose synchronous look-ups
                   never wait: they answer from the cache (stale entries included: partitions
                   never move between brokers) and start a refresh in the background, whose
                   answer later look-ups find. ``await metadata(topic)`` waits for it, with a
                   timeout.

No thread is started: every call is a task on the caller's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Iterable
from typing import Any

import grpc

from dmq.client._cluster import Cluster, TopicMetadata, parse_address, unreachable
from dmq.client.aio._coordinators import AioCoordinatorRouter
from dmq.client.errors import ClientClosedError, DMQError, DMQTimeoutError, InvalidConfigError
from dmq.proto.grpc_options import channel_options
from dmq.proto.security.settings import SecurityConfigError, aio_channel

log = logging.getLogger(__name__)

CHANNEL_CLOSE_TIMEOUT_S = 1.0


class Wakeup:
    """The sync parts' wake-up event (they only call set()), on asyncio: the owner awaits it."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self, timeout_s: float | None) -> bool:
        """Wait until set or `timeout_s` passed; True when set."""
        if self._event.is_set():
            return True
        if timeout_s is not None and timeout_s <= 0:
            return False
        try:
            async with asyncio.timeout(timeout_s):  # no task per wait (wait_for would make one)
                await self._event.wait()
        except TimeoutError:
            return False
        return True


def bootstrap_address(value: Any, setting: str = "bootstrap_servers") -> str:
    """The coordinator addresses, "h1:p,h2:p" (each checked), from a string ("h:p" or "h1:p,h2:p")
    or a list of them. With several (one active coordinator, the others standing by), the
    AsyncCluster follows the active one among them; the coordinator tells where the brokers are."""
    if isinstance(value, str):
        candidates = [a for a in value.split(",") if a.strip()]
    elif isinstance(value, (list, tuple)) and all(isinstance(a, str) for a in value):
        candidates = [a for a in value if a.strip()]
    else:
        raise InvalidConfigError(f"{setting} must be 'host:port' or a list of them, got {value!r}")
    if not candidates:
        raise InvalidConfigError(f"{setting} must name at least one 'host:port', got {value!r}")
    addresses = []
    for candidate in candidates:
        address = candidate.strip()
        if "://" in address:
            address = address.split("://", 1)[1].rstrip("/")
        try:
            addresses.append(parse_address(address))
        except ValueError as e:
            raise InvalidConfigError(f"{setting}: {e}") from e
    return ",".join(dict.fromkeys(addresses))


class AsyncCluster(Cluster):
    """A Cluster on grpc.aio whose synchronous look-ups never wait (see the module comment).
    Create it inside a running event loop; the owner awaits aclose()."""

    # Cluster's map of channels, holding grpc.aio channels here: narrowed for this class (the
    # ignore: mypy allows no narrower type for an inherited mutable attribute).
    _channels: dict[str, grpc.aio.Channel]  # type: ignore[assignment]

    def __init__(self, bootstrap: str, **settings: Any) -> None:
        super().__init__(bootstrap, **settings)
        self.running: set[asyncio.Future[Any]] = set()  # calls started here and not finished yet
        if self._router is not None:  # several coordinators: the same rule, awaited calls
            self._router = AioCoordinatorRouter(self._router.addresses, self.channel)

    def channel(self, address: str) -> Any:
        ch = self._channels.get(address)
        if ch is None:
            if self._closed:
                raise ClientClosedError(f"the client for {self.bootstrap} is closed; create a new one")
            try:
                ch = self._channels[address] = aio_channel(address, self.security, channel_options())
            except SecurityConfigError as e:  # a TLS file that cannot be read
                raise InvalidConfigError(str(e)) from None
        return ch

    # Never wait in a synchronous look-up: nothing could answer while the loop is held.
    def topic_metadata(self, topic: str, *, timeout_s: float | None = None, allow_stale: bool = False) -> TopicMetadata:
        return super().topic_metadata(topic, timeout_s=0, allow_stale=True)

    def refresh(self, topics: Iterable[str] | None = None, *, timeout_s: float | None = None) -> None:
        super().refresh(topics, timeout_s=0)

    async def metadata(self, topic: str, timeout_s: float | None = None) -> TopicMetadata:
        """The topic's metadata, asking the coordinator when it is missing, stale or old, and
        waiting up to `timeout_s` (default request_timeout_ms) for the answer."""
        meta = self._topics.get(topic)
        if (meta is not None and topic not in self._stale
                and time.monotonic() - meta.fetched_at <= self.metadata_max_age_ms / 1000):
            return meta
        await self.wait_refresh([topic], timeout_s)
        meta = self._topics.get(topic)
        if meta is None:  # pragma: no cover - the refresh raises TopicNotFoundError instead
            raise DMQError(f"no metadata for topic {topic!r}")
        return meta

    def start_call(self, awaitable: Awaitable[Any]) -> asyncio.Future[Any]:
        """An aio call (``await``-able) as a task on the loop, ended by aclose() if still running."""
        task = asyncio.ensure_future(awaitable)
        self.running.add(task)
        task.add_done_callback(self.running.discard)
        return task

    def start_unary(self, method: Any, request: Any, timeout: float) -> asyncio.Future[Any]:
        """Cluster.start_unary on the loop: the aio call of `method` as a task (start_call)."""
        return self.start_call(method(request, timeout=timeout))

    def knows(self, topic: str) -> bool:
        """Whether the cache holds the topic (fresh or not)."""
        return topic in self._topics

    async def wait_refresh(self, topics: Iterable[str] | None, timeout_s: float | None = None) -> None:
        names = tuple(sorted(set(topics))) if topics is not None else ()
        wait_s = self.timeout_s if timeout_s is None else max(0.0, timeout_s)
        future = asyncio.wrap_future(self._start_refresh(names))
        try:
            # shield: the refresh is shared; a waiter that gives up must not cancel it for others
            await asyncio.wait_for(asyncio.shield(future), wait_s)
        except TimeoutError:
            raise DMQTimeoutError(
                f"GetMetadata from the coordinator at {self.bootstrap} did not answer within {wait_s:.3g} s; "
                "is the coordinator up and is that its address?"
            ) from None

    async def acheck_reachable(self, timeout_s: float | None = None) -> None:
        """Cluster.check_reachable() without blocking the loop: connect to the bootstrap
        address, or raise NoBrokersAvailableError naming it (at once when refused). With several
        coordinators, the first that accepts a connection becomes the current one (a dead one's
        closed port is refused at once), within one shared timeout."""
        wait_s = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + wait_s
        first = self.bootstrap
        router = self._router
        others = [a for a in router.addresses if a != first] if router is not None else []
        for address in [first, *others]:
            state = await self._connected(address, deadline)
            if state is grpc.ChannelConnectivity.READY:
                if router is not None:
                    router.current = address
                return
            if state is grpc.ChannelConnectivity.SHUTDOWN:
                raise ClientClosedError(f"the client for {self.bootstrap} is closed; create a new one")
            if state is not grpc.ChannelConnectivity.TRANSIENT_FAILURE:
                break  # no answer in time: the deadline is spent
        raise unreachable(first if router is None else ",".join(router.addresses),
                          state.name if state is not None else "", wait_s)

    async def _connected(self, address: str, deadline: float) -> grpc.ChannelConnectivity | None:
        """The channel's state once settled (READY, TRANSIENT_FAILURE, SHUTDOWN) or None at the deadline."""
        # channel() is typed Any (Cluster.channel answers a sync grpc.Channel, which an override
        # may not replace); what it returns here is the aio channel _channels holds.
        channel: grpc.aio.Channel = self.channel(address)
        done = (grpc.ChannelConnectivity.READY, grpc.ChannelConnectivity.TRANSIENT_FAILURE,
                grpc.ChannelConnectivity.SHUTDOWN)
        state = channel.get_state(try_to_connect=True)
        while state not in done:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                await asyncio.wait_for(channel.wait_for_state_change(state), remaining)
            except TimeoutError:
                return None
            state = channel.get_state(try_to_connect=True)
        return state

    async def aclose(self) -> None:
        """Close every channel (their calls end CANCELLED). Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        # Cancel the calls still in flight and let them finish before the channels close: a call
        # left behind would deliver its completion to a loop that may be closed by then.
        tasks = list(self.running)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=CHANNEL_CLOSE_TIMEOUT_S)
        channels = list(self._channels.values())
        self._channels.clear()
        self._stubs.clear()
        for ch in channels:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ch.close(grace=None), CHANNEL_CLOSE_TIMEOUT_S)

    def close(self) -> None:  # pragma: no cover - the async owners call aclose()
        raise RuntimeError("AsyncCluster is closed with `await cluster.aclose()`")
