"""The event stores of one broker: which topics are event stores, and their open stores.

The broker learns a topic's kind from the coordinator's CreatePartitions (also replayed at every
registration), so the set is rebuilt on each start without a file of its own. A store opens on
first use (EventStore.ensure_open) and is closed when its topic is deleted or the broker stops.
"""

from __future__ import annotations

import asyncio

from dmq.broker.events.store import EventStore
from dmq.broker.log import LogManager

__all__ = ["EventStores", "NotAnEventStoreError"]


class NotAnEventStoreError(Exception):
    """The topic exists here but is an ordinary log."""


class EventStores:
    def __init__(self, logs: LogManager) -> None:
        self._logs = logs
        self._topics: set[str] = set()
        self._stores: dict[str, EventStore] = {}
        self.subscriptions = 0  # EventSubscribe streams open (bounded by the service)

    def __repr__(self) -> str:
        return f"<EventStores topics={sorted(self._topics)} open={len(self._stores)}>"

    def mark(self, topic: str) -> None:
        self._topics.add(topic)

    def is_event_store(self, topic: str) -> bool:
        return topic in self._topics

    def get(self, topic: str) -> EventStore:
        """The topic's store (UnknownPartitionError when this broker does not hold it)."""
        store = self._stores.get(topic)
        if store is not None:
            return store
        plog = self._logs.get(topic, 0)
        if topic not in self._topics:
            raise NotAnEventStoreError(
                f"topic {topic!r} is an ordinary log, not an event store: create one with "
                "`dmq topics create NAME --kind event-store`"
            )
        store = self._stores[topic] = EventStore(plog)
        return store

    async def drop(self, topic: str) -> None:
        """Close the topic's store (before its log is deleted)."""
        self._topics.discard(topic)
        store = self._stores.pop(topic, None)
        if store is not None:
            await store.close()

    async def close(self) -> None:
        stores, self._stores = list(self._stores.values()), {}
        if stores:
            await asyncio.gather(*(s.close() for s in stores), return_exceptions=True)
