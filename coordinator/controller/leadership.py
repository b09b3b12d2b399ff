"""Which of several coordinators on one etcd is active (issue 28 item 2): the campaign and the renew loop.

The etcd election pattern over the store's seam (EtcdMetadataStore.campaign / renew_leadership /
resign / leader): a candidate holds a lease of `ttl_s` seconds and the key `leader`, created only
if absent and bound to that lease. One task (`run`, owned by the node) does everything:

  1. Standing by: read `leader` every STANDBY_POLL_S (a get, cheaper than a campaign, which grants
     and revokes a lease each time); when it is absent (the active one's lease lapsed or was
     revoked), campaign. A standby keeps no metadata warm: the winner loads it on taking control
     (one range read per record kind). Measured (bench/coordinator_failover_bench.py, 51 topics,
     20 takeovers): claim + load + start p50 0.06-0.09 s of a p50 2.1 s (TTL 2) / 5.0 s (TTL 5)
     takeover, which is the wait for the lease to lapse: watching would not pay.
  2. Won: `on_elected()` (the node claims the controller epoch, loads, starts its duties) runs
     while the renew loop already renews the lease, so a slow load cannot let it lapse.
  3. Renewing every ttl_s / 3 (aetcd has no keep-alive of its own). Each renewal is timed on the
     monotonic clock from the moment its request was sent: etcd extends the lease to TTL after it
     receives the request, so the lease cannot lapse before send time + TTL. The coordinator acts
     only while `monotonic() < deadline` = last good renewal's send time + TTL - margin; when etcd
     answers that the lease is gone it steps down at once, and when no renewal has come back by
     the deadline it steps down then, before etcd can give leadership to a standby. `leading()`
     answers from the clock alone, so a coordinator resumed after SIGSTOP stops acting at its
     first instruction, before this task has even run again.
  4. Stepping down: `on_deposed()` (the node stops every duty the active role started: group and
     controller timers, pushes in flight) is awaited, then the loop goes back to 1 in the same
     process: a deposed coordinator is a standby, and may be elected again later (the node then
     claims a new, higher controller epoch and reloads). Taking control that fails (the claim lost
     a race, etcd failed during the load) steps down the same way, revokes the lease so another
     candidate can win at once, and waits one TTL before campaigning again.
  5. `resign()` (a clean shutdown) revokes the lease: `leader` is deleted at once and a standby's
     next poll takes over.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

import structlog

from dmq.coordinator.metadata_errors import MetadataError
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
        on_deposed: Callable[[], Awaitable[None]],
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
        self.terms = 0  # how many times it was elected (each a new controller epoch)

    def __repr__(self) -> str:
        return (
            f"<Leadership candidate={self.candidate!r} leading={self.leading()} lease={self.lease_id} "
            f"active={self.active_address!r} ttl_s={self.ttl_s} terms={self.terms}>"
        )

    def leading(self) -> bool:
        return self.lease_id is not None and not self.deposed and self._clock() < self._deadline

    async def run(self) -> None:
        """Stand by until elected, lead until deposed, stand by again; until cancelled by the owner's stop."""
        while True:
            await self._stand_by()
            self.terms += 1
            log.info("elected active coordinator", candidate=self.candidate, ttl_s=self.ttl_s, term=self.terms)
            renewing = asyncio.create_task(self._renew_until_lost(), name="coordinator-lease-renew")
            failed = False
            try:
                await self._on_elected()
                await renewing
            except Exception:  # noqa: BLE001 - taking control failed (a lost claim, etcd, a load): let another try
                log.exception("taking control failed", candidate=self.candidate)
                failed = True
                self._step_down("taking control failed")
            finally:
                renewing.cancel()
                await asyncio.gather(renewing, return_exceptions=True)
            # Every duty of the active role stops before this one may campaign again.
            await self._on_deposed()
            lease, self.lease_id = self.lease_id, None
            if failed and lease is not None:
                await self._revoke(lease)
            self.deposed = False
            self.active_address = None
            if failed:
                await asyncio.sleep(self.ttl_s)  # room for another candidate to win

    async def _stand_by(self) -> None:
        failing = False  # etcd unreachable: said once per stretch, not at every poll
        while True:
            try:
                self.active_address = await self.store.leader()
                failing = False
                if self.active_address is None:
                    sent = self._clock()
                    lease = await self.store.campaign(self.candidate, self.ttl_s)
                    if lease is not None:
                        self.lease_id = lease
                        self._deadline = sent + self.ttl_s - margin_s(self.ttl_s)
                        self.active_address = self.candidate
                        return
            except StoreError as e:  # etcd unreachable: stand by and ask again
                (log.debug if failing else log.warning)("leadership campaign failed", candidate=self.candidate, error=str(e))
                failing = True
            await asyncio.sleep(STANDBY_POLL_S)

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
        log.error("stepping down: no longer the active coordinator, standing by", candidate=self.candidate, why=why)

    async def resign(self) -> None:
        """Hand over at once (a clean shutdown): the lease is revoked, `leader` deleted."""
        lease, self.lease_id = self.lease_id, None
        if lease is None or self.deposed:
            return
        await self._revoke(lease)

    async def _revoke(self, lease: int) -> None:
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
