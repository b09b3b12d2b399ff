"""Shared set-up of the queue-mode tests: a topic with queue settings, records in it, what is stored."""

from __future__ import annotations

from dmq.client import AdminClient, Producer, SimpleConsumer
from dmq.client.records import ConsumerRecord

WAIT_S = 10.0


def create_topic(bootstrap: str, name: str, partitions: int = 1, **config: int) -> None:
    with AdminClient(bootstrap) as admin:
        admin.create_topic(name, partitions, config=config or None)


def send(p: Producer, topic: str, values: list[bytes], partition: int | None = 0, **headers: bytes) -> None:
    """Send and wait until every record is acknowledged (raises the first failure)."""
    futures = [p.send(topic, v, partition=partition, headers=list(headers.items()) or None) for v in values]
    p.flush(WAIT_S)
    for f in futures:
        f.get(WAIT_S)


def produce(bootstrap: str, topic: str, values: list[bytes], partition: int | None = 0, **headers: bytes) -> None:
    with Producer(bootstrap, linger_ms=0) as p:
        send(p, topic, values, partition, **headers)


def stored(bootstrap: str, topic: str, partition: int = 0) -> list[ConsumerRecord]:
    with SimpleConsumer(bootstrap, max_wait_ms=0) as c:
        end = c.offsets(topic, partition)[1]
        return c.consume(topic, partition, 0, max_records=end) if end else []
