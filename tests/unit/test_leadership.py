"""The coordinator's election loop (dmq.coordinator.controller.leadership) against a fake store:
it acts only while the lease surely lasts, measured from each renewal's send time, steps down
by itself when renewals stop coming back, and then stands by and may be elected again."""

from __future__ import annotations

import asyncio
import time

import pytest

from dmq.coordinator.controller.leadership import Leadership, margin_s
from dmq.coordinator.metastore.base import StoreConflict


class _Store:
    """Wins the campaign; answers the first `answered` renewals, then hangs (or refuses)."""

    def __init__(self, answered: int, then: str) -> None:
        self.answered = answered
        self.then = then
        self.renewals_sent: list[float] = []  # monotonic send time of each renewal
        self.resigned: list[int] = []

    async def campaign(self, candidate: str, ttl_s: int) -> int | None:
        return 7

    async def renew_leadership(self, lease_id: int) -> int:
        self.renewals_sent.append(time.monotonic())
        if len(self.renewals_sent) <= self.answered:
            return 2
        if self.then == "hang":
            await asyncio.Event().wait()
        raise StoreConflict("the leadership lease has lapsed")

    async def resign(self, lease_id: int) -> None:
        self.resigned.append(lease_id)

    async def leader(self) -> str | None:
        return None


@pytest.mark.parametrize("then", ["hang", "refuse"])
def test_it_steps_down_before_the_lease_can_lapse(then: str) -> None:
    store = _Store(answered=1, then=then)
    deposed: list[float] = []
    acting_seen: list[float] = []

    async def on_deposed() -> None:
        deposed.append(time.monotonic())
        assert not lead.leading()  # stopped acting before its duties are stopped
        await asyncio.Event().wait()  # stepping down holds the loop here until cancelled

    lead = Leadership(store, "c1:1", 2, on_elected=_noop, on_deposed=on_deposed)

    async def main() -> None:
        async def watch() -> None:  # samples leading() until deposed
            while not deposed:
                if lead.leading():
                    acting_seen.append(time.monotonic())
                await asyncio.sleep(0.01)

        running = asyncio.create_task(lead.run())
        await asyncio.wait_for(watch(), 10)
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)

    asyncio.run(main())
    assert deposed and lead.deposed and not lead.leading()
    last_ok = store.renewals_sent[0]  # the only renewal answered
    # Every moment it acted was before the last good renewal's send time + TTL - margin, so
    # before etcd could let the lease lapse (which is no earlier than send time + TTL).
    assert acting_seen and max(acting_seen) < last_ok + 2 - margin_s(2)
    assert len(store.renewals_sent) >= 2  # it kept trying until the deadline


class _Rotating(_Store):
    """Wins every campaign; the first lease refuses its second renewal (lapsed), later ones always renew."""

    def __init__(self) -> None:
        super().__init__(answered=1, then="refuse")
        self.campaigns = 0

    async def campaign(self, candidate: str, ttl_s: int) -> int | None:
        self.campaigns += 1
        return 7 + self.campaigns

    async def renew_leadership(self, lease_id: int) -> int:
        if lease_id == 8:
            return await super().renew_leadership(lease_id)
        return 2


def test_a_deposed_candidate_stands_by_and_is_elected_again() -> None:
    store = _Rotating()
    events: list[str] = []

    async def main() -> Leadership:
        async def elected() -> None:
            events.append(f"elected {lead.lease_id}")

        async def deposed() -> None:
            assert not lead.leading()
            events.append("deposed")

        lead = Leadership(store, "c1:1", 2, on_elected=elected, on_deposed=deposed)
        running = asyncio.create_task(lead.run())
        deadline = time.monotonic() + 10
        while not (lead.terms == 2 and lead.leading()) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        return lead

    lead = asyncio.run(main())
    assert events == ["elected 8", "deposed", "elected 9"]
    assert lead.terms == 2 and lead.lease_id == 9 and not lead.deposed


def test_resign_revokes_the_lease_unless_deposed() -> None:
    store = _Store(answered=100, then="hang")

    async def main() -> None:
        lead = Leadership(store, "c1:1", 2, on_elected=_noop, on_deposed=_noop)
        task = asyncio.create_task(lead.run())
        while not lead.leading():
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await lead.resign()
        assert not lead.leading()

    asyncio.run(main())
    assert store.resigned == [7]


def test_the_ttl_is_bounded() -> None:
    with pytest.raises(ValueError, match="lease_ttl_s must be 2..300"):
        Leadership(_Store(0, "hang"), "c1:1", 1, on_elected=_noop, on_deposed=_noop)


async def _noop() -> None:
    return None
