"""The asyncio client: AsyncProducer, AsyncConsumer, AsyncAdminClient (aiokafka's shape).

    async with AsyncProducer(bootstrap_servers="127.0.0.1:9091") as producer:
        await producer.send_and_wait("orders", b"hello")

    async with AsyncConsumer("orders", bootstrap_servers="127.0.0.1:9091", group_id="billing") as consumer:
        async for record in consumer:
            ...

Everything runs on the caller's event loop over grpc.aio; no thread is started per call or per
client. The group protocol, batching, retries, idempotence and error classes are the sync
client's (see dmq.client.aio._cluster for how its parts are reused). Logs go to the standard
``logging`` module under ``dmq``; nothing is printed unless the application configures logging.
"""

from __future__ import annotations

import logging

from dmq.client.aio.admin import AsyncAdminClient
from dmq.client.aio.consumer import AsyncConsumer
from dmq.client.aio.producer import AsyncProducer, AsyncRecordFuture

# A library stays silent unless the application configures logging (Python's logging HOWTO).
logging.getLogger("dmq").addHandler(logging.NullHandler())

__all__ = ["AsyncAdminClient", "AsyncConsumer", "AsyncProducer", "AsyncRecordFuture"]
