"""AsyncConsumer.metrics(): the Kafka-style keys DMQConsumer.metrics() has, over a real server."""

from __future__ import annotations

import pytest

from dmq.client.aio import AsyncConsumer
from tests.aio.conftest import FAST, create, produce

pytestmark = pytest.mark.timeout(60)


async def test_async_consumer_metrics_count_records_commits_and_the_assignment(server):
    await create(server.bootstrap, "metered", 1)
    await produce(server.bootstrap, "metered", 30)
    settings = dict(FAST, enable_auto_commit=False)
    async with AsyncConsumer("metered", bootstrap_servers=server.bootstrap, group_id="app", **settings) as consumer:
        for _ in range(30):
            await consumer.getone()
        await consumer.commit()
        m = consumer.metrics()
    assert m["record_consumed_total"] == 30 and m["bytes_consumed_total"] > 0
    assert m["request_total"] >= 1 and m["request_latency_max_ms"] > 0
    assert m["commit_total"] == 1 and m["rebalance_total"] >= 1
    assert m["records_lag_max"] == 0


async def test_async_producer_metrics_count_what_was_acknowledged(server):
    from dmq.client.aio import AsyncProducer

    await create(server.bootstrap, "sent", 1)
    async with AsyncProducer(bootstrap_servers=server.bootstrap, linger_ms=0) as producer:
        for i in range(10):
            await producer.send_and_wait("sent", b"v%d" % i)
        m = producer.metrics()
    assert m["record_send_total"] == 10 and m["request_total"] == 10 and m["request_error_total"] == 0
    assert 0 < m["request_latency_avg_ms"] <= m["request_latency_max_ms"]
