"""Channels from the coordinator to brokers, one per "host:port", created on first use.

The pool is bounded (max_channels, least recently used closed first) because addresses come from
RegisterBroker requests; evicted channels are closed in the background with a grace period so
in-flight calls finish, and `close()` waits for those closes too.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict

import grpc
import structlog

from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto.grpc_options import channel_options
from dmq.proto.security.settings import ClientSecurity, aio_channel

log = structlog.get_logger(__name__)

DEFAULT_MAX_CHANNELS = 1024
CLOSE_GRACE_S = 1.0


class BrokerPool:
    def __init__(self, *, max_channels: int = DEFAULT_MAX_CHANNELS, security: ClientSecurity | None = None) -> None:
        if max_channels < 1:
            raise ValueError(f"max_channels must be >= 1, got {max_channels}")
        self.max_channels = max_channels
        self.security = security  # the cluster principal's TLS and credentials, for the brokers
        self._entries: OrderedDict[str, tuple[grpc.aio.Channel, pb_grpc.BrokerStub]] = OrderedDict()
        self._closing: set[asyncio.Task[None]] = set()
        self._closed = False

    def __repr__(self) -> str:
        return f"<BrokerPool channels={len(self._entries)} closed={self._closed}>"

    def __len__(self) -> int:
        return len(self._entries)

    def stub(self, address: str) -> pb_grpc.BrokerStub:
        """The Broker stub for "host:port". Call from the event loop that will use it."""
        if self._closed:
            raise RuntimeError("broker pool is closed")
        entry = self._entries.get(address)
        if entry is not None:
            self._entries.move_to_end(address)
            return entry[1]
        channel = aio_channel(address, self.security, channel_options())
        stub = pb_grpc.BrokerStub(channel)  # type: ignore[no-untyped-call]  # generated stubs are untyped
        self._entries[address] = (channel, stub)
        while len(self._entries) > self.max_channels:
            old_address, (old_channel, _) = self._entries.popitem(last=False)
            log.info("closing least recently used broker channel", address=old_address)
            self._close_later(old_channel)
        return stub

    def forget(self, address: str) -> None:
        """Close the channel to an address no broker uses any more (a broker moved)."""
        entry = self._entries.pop(address, None)
        if entry is not None:
            self._close_later(entry[0])

    def _close_later(self, channel: grpc.aio.Channel) -> None:
        task = asyncio.get_running_loop().create_task(channel.close(grace=CLOSE_GRACE_S))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        self._closed = True
        entries, self._entries = list(self._entries.values()), OrderedDict()
        closes = [asyncio.ensure_future(channel.close(grace=CLOSE_GRACE_S)) for channel, _ in entries]
        closes += list(self._closing)
        if closes:
            _done, pending = await asyncio.wait(closes, timeout=CLOSE_GRACE_S + 2)
            for task in pending:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*pending, return_exceptions=True)
