"""Which of several coordinators on one etcd is active (issue 28 item 2): the campaign and the renew loop.

The etcd election pattern over the store's seam (EtcdMetadataStore.campaign / renew_leadership /
resign / leader): a candidate holds a lease of `ttl_s` seconds and the key `leader`, created only
if absent and bound to that lease. One task (`run`, owned by the node) does everything:

  1. Standing by: read `leader` every STANDBY_POLL_S (a get, cheaper than a campaign, which grants
     and revokes a lease each time); when it is absent (the active one's lease lapsed or was
     revoked), campaign. A standby keeps no metadata warm: the winner loads it on taking control
     (one range read per record kind, well within the takeover budget of TTL + 1 s).
  2. Won: `on_elected()` (the node claims the controller epoch, loads, starts its duties) runs
     while the renew loop already renews the lease, so a slow load cannot let it lapse.
  3. Renewing every ttl_s / 3 (aetcd has no keep-alive of its own). Each renewal is timed on the
     monotonic clock from the moment its request was sent: etcd extends the lease to TTL after it
     receives the request, so the lease cannot lapse before send time + TTL. The coordinator acts
     only while `monotonic() < deadline` = last good renewal's send time + TTL - margin; when etcd
     answers that the lease is gone it steps down (`on_deposed()`) at once, and when no renewal
     has come back by the deadline it steps down then, before etcd can give
     leadership to a standby. `leading()` answers from the clock alone, so a coordinator resumed
     after SIGSTOP stops acting at its first instruction, before this task has even run again.
  4. `resign()` (a clean shutdown) revokes the lease: `leader` is deleted at once and a standby's
     next poll takes over.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

import structlog

from dmq.coordinator.metadata import MetadataError
from dmq.coordinator.metastore.base import StoreConflict, StoreError
from dmq.proto import error_details
from dmq.proto.server.domain_errors import ErrorCode

log = structlog.get_logger(__name__)

LEASE_TTL_MIN_S = 2  # etcd's own minimum with default settings
DEFAULT_LEASE_TTL_S = 5
LEASE_TTL_MAX_S = 300
STANDBY_POLL_S = 0.1  # how often a standby reads `leader` (one small get): part of the takeover time
RETRY_S = 0.1  # after a failed renewal, before the next attempt (the deadline still bounds them all)


class LeaderStore(Protocol):
    async def campaign(self, candidate: str, ttl_s: int) -> int | None: ...

    async def renew_leadership(self, lease_id: int) -> int: ...

    async def resign(self, lease_id: int) -> None: ...

    async def leader(self) -> str | None: ...


def margin_s(ttl_s: float) -> float:
    """How long before the lease could lapse the coordinator stops acting: a quarter of the TTL,
    at least half a second (etcd's lessor checks expiry every 500 ms, but clocks and scheduling
    of a loaded machine need room too)."""
    return max(0.5, ttl_s / 4)


class Leadership:
    def __init__(
        self,
        store: LeaderStore,
        candidate: str,
        ttl_s: int,
        *,
        on_elected: Callable[[], Awaitable[None]],
        on_deposed: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not LEASE_TTL_MIN_S <= ttl_s <= LEASE_TTL_MAX_S:
            raise ValueError(f"lease_ttl_s must be {LEASE_TTL_MIN_S}..{LEASE_TTL_MAX_S}, got {ttl_s}")
        self.store = store
        self.candidate = candidate
        self.ttl_s = ttl_s
        self._on_elected = on_elected
        self._on_deposed = on_deposed
        self._clock = clock
        self.lease_id: int | None = None
        self.active_address: str | None = None  # the active coordinator as last read (self when leading)
        self.deposed = False
        self._deadline = 0.0  # leading() only before this (monotonic)

    def __repr__(self) -> str:
        return (
            f"<Leadership candidate={self.candidate!r} leading={self.leading()} lease={self.lease_id} "
            f"active={self.active_address!r} ttl_s={self.ttl_s}>"
        )

    def leading(self) -> bool:
        return self.lease_id is not None and not self.deposed and self._clock() < self._deadline

    async def run(self) -> None:
        """Stand by until elected, then renew until deposed (or cancelled by the owner's stop)."""
        while self.lease_id is None:
            try:
                self.active_address = await self.store.leader()
                if self.active_address is None:
                    sent = self._clock()
                    lease = await self.store.campaign(self.candidate, self.ttl_s)
                    if lease is not None:
                        self.lease_id = lease
                        self._deadline = sent + self.ttl_s - margin_s(self.ttl_s)
                        self.active_address = self.candidate
                        break
            except StoreError as e:  # etcd unreachable: stand by and ask again
                log.warning("leadership campaign failed", candidate=self.candidate, error=str(e))
            await asyncio.sleep(STANDBY_POLL_S)
        log.info("elected active coordinator", candidate=self.candidate, ttl_s=self.ttl_s)
        renewing = asyncio.create_task(self._renew_until_lost(), name="coordinator-lease-renew")
        try:
            await self._on_elected()
            await renewing
        finally:
            renewing.cancel()

    async def _renew_until_lost(self) -> None:
        assert self.lease_id is not None
        interval_s = self.ttl_s / 3
        last_sent = self._deadline - self.ttl_s + margin_s(self.ttl_s)
        while True:
            await asyncio.sleep(max(0.0, last_sent + interval_s - self._clock()))
            while True:
                remaining_s = self._deadline - self._clock()
                if remaining_s <= 0:
                    self._step_down("the lease was not renewed in time")
                    return
                sent = self._clock()
                try:
                    await asyncio.wait_for(self.store.renew_leadership(self.lease_id), remaining_s)
                except StoreConflict:  # etcd says the lease is gone (lapsed or revoked): at once
                    self._step_down("the lease is gone")
                    return
                except (TimeoutError, StoreError) as e:  # no answer, or etcd unreachable: retry until the deadline
                    log.warning("lease renewal failed", candidate=self.candidate, error=str(e) or type(e).__name__)
                    await asyncio.sleep(min(RETRY_S, max(0.0, self._deadline - self._clock())))
                    continue
                # Only a renewal sent before the deadline counts (one sent after it may have
                # reached a lease that had already lapsed; then it raised StoreConflict above).
                self._deadline = sent + self.ttl_s - margin_s(self.ttl_s)
                last_sent = sent
                break

    def _step_down(self, why: str) -> None:
        if self.deposed:
            return
        self.deposed = True
        log.error("stepping down: no longer the active coordinator", candidate=self.candidate, why=why)
        self._on_deposed()

    async def resign(self) -> None:
        """Hand over at once (a clean shutdown): the lease is revoked, `leader` deleted."""
        lease, self.lease_id = self.lease_id, None
        if lease is None or self.deposed:
            return
        try:
            await self.store.resign(lease)
            log.info("resigned: leadership handed over", candidate=self.candidate)
        except StoreError as e:  # the lease lapses by itself within its TTL
            log.warning("could not revoke the leadership lease", candidate=self.candidate, error=str(e))


class NotCoordinatorError(MetadataError):
    """What a standby (or a deposed) coordinator answers instead of acting: retriable, naming the
    active coordinator when it is known (trailing metadata ACTIVE_COORDINATOR_KEY)."""

    code = ErrorCode.UNAVAILABLE
    reason = error_details.NOT_COORDINATOR

    def __init__(self, active: str | None) -> None:
        where = f"the active one is {active}" if active else "none is active yet"
        super().__init__(
            f"this coordinator is standing by, not active ({where}): retry at the active coordinator",
            extra=((error_details.ACTIVE_COORDINATOR_KEY, active),) if active else (),
        )
