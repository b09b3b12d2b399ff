"""The broker's connection to the active coordinator, among several (issue 28 item 3).

`dmq broker --coordinator h1:p,h2:p,h3:p` names every coordinator; one is active, the others
stand by and answer UNAVAILABLE with the reason not-coordinator and, when they know it, the active
one's address (dmq.proto.error_details.ACTIVE_COORDINATOR_KEY). The link holds one channel, to
the coordinator it believes active; after a failed call the node asks `follow(error)`:
  1. a not-coordinator answer naming the active one: move there;
  2. a not-coordinator answer naming none (an election is under way), or the coordinator is
     unreachable, with several addresses: move to the next one of the list;
  3. anything else, or a single address: stay (as before: the one coordinator comes back).
The link keeps one channel per address (at most one per coordinator named) and moves between
them: while no coordinator is active (an election under way, the standbys still naming the dead
one) a broker goes round the list, and a new channel per move was a new TCP connection each time,
~50 a second, which the coordinators count for 30 s against the host's 1,000
(dmq.proto.server.connections): the broker locked itself and every client on its host out of the new
active coordinator. A call still on the previous channel ends at its own timeout. One owner: the
broker node, which closes the link (every channel) when it stops.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc
import structlog

from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import error_details

log = structlog.get_logger(__name__)

_UNREACHABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
# Channels kept beyond the listed addresses (to ones an answer named): a bound, the oldest goes first.
MAX_NAMED_CHANNELS = 8


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
        # address -> its channel: the listed addresses and up to MAX_NAMED_CHANNELS an answer named.
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._dropped: list[grpc.aio.Channel] = []

    def __repr__(self) -> str:
        return f"<CoordinatorLink address={self.address!r} of={self.addresses}>"

    def open(self) -> None:
        self._connect(self.address)

    def _connect(self, address: str) -> None:
        self.address = address
        if address not in self._channels:
            named = [a for a in self._channels if a not in self.addresses]
            if len(named) >= MAX_NAMED_CHANNELS:
                self._dropped.append(self._channels.pop(named[0]))
            self._channels[address] = self._new_channel(address)
        self.channel = self._channels[address]
        self.metadata = pb_grpc.MetadataStub(self.channel)  # type: ignore[no-untyped-call]  # generated stubs are untyped
        self.groups = pb_grpc.GroupCoordinatorStub(self.channel)  # type: ignore[no-untyped-call]  # generated stubs are untyped

    async def follow(self, error: grpc.aio.AioRpcError) -> bool:
        """Move after `error` from the current coordinator when it says where (or that it is not
        the one); True when the link now points elsewhere."""
        try:
            trailing = error.trailing_metadata()
        except Exception:  # noqa: BLE001 - a call that never connected has no metadata
            trailing = None
        reason = error_details.reason_of(trailing)
        named = error_details.value_of(trailing, error_details.ACTIVE_COORDINATOR_KEY)
        if reason == error_details.NOT_COORDINATOR and named:
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
        dropped, self._dropped = self._dropped, []
        for channel in dropped:
            await channel.close(None)
        return True

    async def close(self) -> None:
        channels, self._channels = [*self._channels.values(), *self._dropped], {}
        self._dropped = []
        self.channel = None
        for channel in channels:
            await channel.close(None)
