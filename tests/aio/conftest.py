"""Shared by the dmq.client.aio tests: a cluster with fast rebalances and helpers that create and
fill topics with the asyncio clients."""

from __future__ import annotations

import pytest

from dmq.client.aio import AsyncAdminClient, AsyncProducer

# Fast groups: rebalances are debounced 100 ms on these servers.
FAST = dict(heartbeat_interval_ms=300, session_timeout_ms=30_000, fetch_max_wait_ms=100, retry_backoff_ms=20)


@pytest.fixture
def server(cluster_factory):
    return cluster_factory(rebalance_debounce_ms=100)


async def create(bootstrap: str, topic: str, partitions: int) -> None:
    async with AsyncAdminClient(bootstrap) as admin:
        await admin.create_topic(topic, partitions)


async def produce(bootstrap: str, topic: str, n: int, keyed: bool = True) -> list[tuple[int, int]]:
    """n records with values b"<i>"; returns their (partition, offset)."""
    async with AsyncProducer(bootstrap, linger_ms=1) as producer:
        handles = [await producer.send(topic, b"%d" % i, key=b"k%d" % i if keyed else None) for i in range(n)]
        metas = [await h for h in handles]
    return [(m.partition, m.offset) for m in metas]
