"""The broker's connection to the active coordinator, among several (issue 28 item 3).

`dmq broker --coordinator h1:p,h2:p,h3:p` names every coordinator; one is active, the others
stand by and answer UNAVAILABLE with the reason not-coordinator and, when they know it, the active
one's address (dmq.proto.error_details.ACTIVE_COORDINATOR_KEY). The link holds one channel, to
the coordinator it believes active; after a failed call the node asks `follow(error)`:
  1. a not-coordinator answer naming the active one: move there;
  2. a not-coordinator answer naming none (an election is under way), or the coordinator is
     unreachable, with several addresses: move to the next one of the list;
  3. anything else, or a single address: stay (as before: the one coordinator comes back).
Until its lease lapses, a standby still names an active coordinator that died: one that refused
a connection in the last DOWN_S is not followed there (case 2 instead), or the broker would bounce
between the standby and the dead address, a new connection each time, as fast as they answer
(hundreds a second per broker, until a coordinator refused them all: too many connections).
The link keeps one channel per coordinator address (at most MAX_CHANNELS) and moving does not
close the one it leaves: calls still on it end by themselves (answered, or at their deadline).
Closing it cancelled them, and a cancelled call raises CancelledError in the handler awaiting it:
a commit's ownership check in flight to a paused coordinator left the client's CommitOffsets
unanswered until its own deadline (30 s), long after a standby had taken over. Nor does a move
cost a new connection. One owner: the broker node, which closes the link (every channel) when it
stops.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import structlog

from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import error_details

log = structlog.get_logger(__name__)

_UNREACHABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
DOWN_S = 1.0  # how long an address that refused a connection is not followed to when named
MAX_CHANNELS = 16  # coordinator addresses with a channel (the list, and active ones named since)


def _refused(error: grpc.aio.AioRpcError) -> bool:
    """No connection could be made (nothing listens there), as gRPC words it."""
    return error.code() == grpc.StatusCode.UNAVAILABLE and "failed to connect" in (error.details() or "").lower()


def split_coordinators(value: str) -> list[str]:
    """The "host:port" entries of a comma-separated list, in order, without duplicates."""
    out = [a.strip() for a in value.split(",") if a.strip()]
    for address in out:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"coordinator address must be 'host:port' (e.g. '127.0.0.1:9091'), got {address!r}")
    if not out:
        raise ValueError(f"no coordinator address in {value!r}")
    return list(dict.fromkeys(out))


class CoordinatorLink:
    def __init__(self, addresses: list[str], new_channel: Callable[[str], grpc.aio.Channel]) -> None:
        self.addresses = addresses
        self._new_channel = new_channel
        self.address = addresses[0]
        self.channel: grpc.aio.Channel | None = None
        self.metadata: pb_grpc.MetadataStub | None = None
        self.groups: pb_grpc.GroupCoordinatorStub | None = None
        self._channels: dict[str, grpc.aio.Channel] = {}  # address -> its channel, at most MAX_CHANNELS
        self._retired: list[grpc.aio.Channel] = []  # evicted past MAX_CHANNELS, to be closed
        self._down: dict[str, float] = {}  # address -> time.monotonic() of its last refused connection

    def __repr__(self) -> str:
        return f"<CoordinatorLink address={self.address!r} of={self.addresses}>"

    def open(self) -> None:
        self._connect(self.address)

    def _connect(self, address: str) -> None:
        channel = self._channels.get(address)
        if channel is None:
            if len(self._channels) >= MAX_CHANNELS:  # bounded: an address not current goes
                evicted = next(a for a in self._channels if a != self.address)
                self._retired.append(self._channels.pop(evicted))
            channel = self._channels[address] = self._new_channel(address)
        self.address = address
        self.channel = channel
        self.metadata = pb_grpc.MetadataStub(self.channel)
        self.groups = pb_grpc.GroupCoordinatorStub(self.channel)

    async def follow(self, error: grpc.aio.AioRpcError) -> bool:
        """Move after `error` from the current coordinator when it says where (or that it is not
        the one); True when the link now points elsewhere."""
        try:
            trailing = error.trailing_metadata()
        except Exception:  # noqa: BLE001 - a call that never connected has no metadata
            trailing = None
        reason = error_details.reason_of(trailing)
        named = error_details.value_of(trailing, error_details.ACTIVE_COORDINATOR_KEY)
        now = time.monotonic()
        if _refused(error):
            self._down[self.address] = now
        if reason == error_details.NOT_COORDINATOR and named and now - self._down.get(named, -DOWN_S) >= DOWN_S:
            target = named
        elif len(self.addresses) > 1 and (reason == error_details.NOT_COORDINATOR or error.code() in _UNREACHABLE):
            i = self.addresses.index(self.address) if self.address in self.addresses else -1
            target = self.addresses[(i + 1) % len(self.addresses)]
        else:
            return False
        if target == self.address:
            return False
        log.info("following the active coordinator", old=self.address, new=target, reason=reason or error.code().name)
        self._connect(target)
        await self._close_retired()
        return True

    async def _close_retired(self) -> None:
        retired, self._retired = self._retired, []
        for channel in retired:
            await channel.close(None)

    async def close(self) -> None:
        self._retired += self._channels.values()
        self._channels.clear()
        self.channel = None
        await self._close_retired()
