"""The asyncio client given several coordinators (issue 28 item 3): real `dmq coordinator`
processes on a real etcd (one active, one standing by) and a real broker given both. An
AsyncAdminClient and an AsyncConsumer group member, each created once, with a standby named first,
keep working across a SIGKILL of the active coordinator: the admin's calls and the member's
group calls and heartbeats follow the standby that takes over (dmq.client.aio._coordinators)."""

from __future__ import annotations

import asyncio
import pathlib
import signal
import time

import pytest

from dmq.client.aio import AsyncAdminClient, AsyncConsumer, AsyncProducer
from dmq.client.errors import DMQError
from tests.integration.test_coordinator_election import WAIT_S, _broker, _Coordinator, _one_active, _stop

pytestmark = pytest.mark.processes  # left out of `make check`


async def _eventually(check: object, what: str) -> float:
    """Await check() until it returns True (a DMQError counts as not yet: no coordinator active,
    or the new one still loading); the seconds it took. AssertionError after WAIT_S."""
    started = time.monotonic()
    while True:
        try:
            if await check():  # type: ignore[operator]
                return time.monotonic() - started
        except DMQError:
            pass
        if time.monotonic() - started > WAIT_S:
            raise AssertionError(f"no {what} within {WAIT_S}s")
        await asyncio.sleep(0.05)  # polling a condition under a deadline


async def _consume(consumer: AsyncConsumer, count: int) -> list[bytes]:
    values: list[bytes] = []
    deadline = time.monotonic() + WAIT_S
    while len(values) < count and time.monotonic() < deadline:
        for records in (await consumer.getmany(timeout_ms=200)).values():
            values += [r.value for r in records]
    assert len(values) == count, values
    return values


async def _produce(bootstrap: str, values: list[bytes]) -> None:
    async with AsyncProducer(bootstrap, linger_ms=1) as producer:
        handles = [await producer.send("orders", v, partition=i % 2) for i, v in enumerate(values)]
        for h in handles:
            await asyncio.wait_for(h, WAIT_S)


def test_aio_admin_and_group_member_follow_a_takeover(tmp_path: pathlib.Path, etcd_url: str) -> None:
    coordinators: list[_Coordinator] = []
    broker = None
    try:
        coordinators += [_Coordinator(tmp_path, f"c{i}", etcd_url) for i in range(2)]
        first = _one_active(coordinators, WAIT_S)
        standby = next(c for c in coordinators if c is not first)
        broker = _broker(tmp_path, coordinators)
        bootstrap = f"{standby.address},{first.address}"  # the standby first: the client finds the active one

        async def scenario() -> None:
            async with AsyncAdminClient(bootstrap) as admin:
                async def broker_alive() -> bool:
                    return any(b.broker_id == 0 and b.alive for b in await admin.list_brokers())

                await _eventually(broker_alive, "broker registered")
                await admin.create_topic("orders", 2)
                before = [b"before-%d" % i for i in range(10)]
                await _produce(bootstrap, before)
                async with AsyncConsumer("orders", bootstrap_servers=bootstrap, group_id="app",
                                         auto_offset_reset="earliest", enable_auto_commit=False,
                                         session_timeout_ms=6000, heartbeat_interval_ms=500) as consumer:
                    assert sorted(await _consume(consumer, 10)) == sorted(before)
                    await consumer.commit()

                    first.proc.send_signal(signal.SIGKILL)
                    first.proc.wait(10)
                    await asyncio.to_thread(_one_active, [standby], WAIT_S)
                    # The same admin client, its calls now at the new active coordinator.
                    took_s = await _eventually(broker_alive, "broker re-registered with the new active coordinator")
                    print(f"aio admin saw the broker alive at the new active coordinator {took_s:.2f}s after it took over")
                    await admin.create_topic("after", 1)
                    assert {t.name for t in await admin.list_topics()} >= {"orders", "after"}

                    after = [b"after-%d" % i for i in range(10)]
                    await _produce(bootstrap, after)
                    # The member (created before the takeover) reads on from its commit.
                    assert sorted(await _consume(consumer, 10)) == sorted(after)
                    await consumer.commit()

        asyncio.run(scenario())
        assert standby.proc.poll() is None
    finally:
        _stop(broker, coordinators)
