"""AsyncConsumer over real servers: a member that was out of its group while the group was
deleted finds (re-creates) the group and goes on, as DMQConsumer does.

Before the consumer core (consumer/_core.py) the asyncio consumer's re-join met JoinGroup's
NOT_FOUND (the group is gone) and raised GroupNotFoundError out of getmany(), although its own
comment said "find it again"; the sync consumer found it again. Both now run the core's rule."""

from __future__ import annotations

import asyncio
import time

import pytest

from dmq.client.admin import AdminClient
from dmq.client.aio import AsyncConsumer
from dmq.client.consumer import TopicPartition
from dmq.client.errors import GroupNotEmptyError
from tests.aio.conftest import FAST, create, produce

pytestmark = pytest.mark.timeout(60)

GROUP = "G_gone_app"


def delete_when_empty(bootstrap: str, deadline: float) -> None:
    """Delete the group as soon as it has no member (the consumer's watchdog left it)."""
    with AdminClient(bootstrap) as admin:
        while True:
            try:
                admin.delete_group(GROUP)
                return
            except GroupNotEmptyError:
                assert time.monotonic() < deadline, admin.describe_group(GROUP)
                time.sleep(0.05)  # polling the coordinator for the condition, not a readiness sleep


async def read_offsets(consumer: AsyncConsumer, want: set[int], deadline: float) -> set[int]:
    seen: set[int] = set()
    while not want <= seen:
        assert time.monotonic() < deadline, sorted(seen)
        batch = await consumer.getmany(timeout_ms=200)
        seen.update(r.offset for records in batch.values() for r in records)
    return seen


async def test_a_member_whose_group_was_deleted_while_it_was_out_finds_the_group_again(server):
    await create(server.bootstrap, "gone", 1)
    await produce(server.bootstrap, "gone", 10)
    settings = dict(FAST, max_poll_interval_ms=1_000, enable_auto_commit=False)
    async with AsyncConsumer("gone", bootstrap_servers=server.bootstrap, group_id="app", **settings) as consumer:
        deadline = time.monotonic() + 30
        await read_offsets(consumer, set(range(10)), deadline)
        # No getmany() for over max_poll_interval_ms: the watchdog (a task on this loop, which
        # runs while the deletion waits in a thread) leaves the group; then it is deleted.
        await asyncio.to_thread(delete_when_empty, server.bootstrap, deadline)
        await produce(server.bootstrap, "gone", 5)
        # Re-joining meets the deleted group: found (created) again, read from the log start
        # (nothing is committed any more), not GroupNotFoundError.
        assert await read_offsets(consumer, set(range(15)), deadline) == set(range(15))
        assert consumer.assignment() == {TopicPartition("gone", 0)}
