"""The event stores of one broker: which topics are event stores, and their open stores.

The broker learns a topic's kind from the coordinator's CreatePartitions (also replayed at every
registration), so the set is rebuilt on each start without a file of its own. A store opens on
first use (EventStore.ensure_open) and is closed when its topic is deleted or the broker stops.

Each store gets its groups' progress store (progress.py: the replicated offsets log beside its
partition) and its replication (`PartitionReplication`: the replica manager's view of partition
0). The hooks below are how the replica manager, the fetcher and the offsets store reach the
stores: a follower's appends and truncations (its index follows its log), and a new leadership
(its groups reload their progress).
"""

from __future__ import annotations

import asyncio

import structlog

from dmq.broker.events.errors import EventStoreError
from dmq.broker.events.progress import OffsetProgressStore, ProgressStore
from dmq.broker.events.store import EventStore
from dmq.broker.log import LogManager, PartitionLog, UnknownPartitionError
from dmq.broker.offsets import OffsetStore
from dmq.broker.replication.manager import ReplicaManager, ReplicatedDurability
from dmq.broker.replication.replica import NotEnoughReplicas, NotLeaderForPartition
from dmq.proto.server.domain_errors import ErrorCode

__all__ = ["EventStores", "NotAnEventStoreError", "PartitionReplication"]

log = structlog.get_logger(__name__)


class PartitionReplication:
    """store.Replication for one event store's partition: the replica manager's (none when the
    partition has no PartitionState: unreplicated). Appends are checked and acknowledged as the
    offsets store's writes and acks=all produces are (ReplicatedDurability)."""

    def __init__(self, manager: ReplicaManager, plog: PartitionLog) -> None:
        self._manager = manager
        self._plog = plog
        self._durability = ReplicatedDurability(manager)

    def __repr__(self) -> str:
        return f"<PartitionReplication {self._plog.topic}[{self._plog.partition}]>"

    def check_writable(self) -> None:
        # In the writer thread while the loop may change the replica: each field read once, and
        # the in-sync set only counted (ReplicatedDurability.check lists it, on the loop).
        r = self._manager.get(self._plog.topic, self._plog.partition)
        if r is None:
            return
        leading = r.leading
        if leading is None:
            raise NotLeaderForPartition(r.not_leader_message(self._manager.broker_id))
        if not leading.enough_replicas(r.min_insync):
            raise NotEnoughReplicas(f"{r.topic}[{r.partition}]: {len(leading.isr)} in-sync replicas, "
                                    f"min_insync_replicas is {r.min_insync}; nothing stored, retry")

    def high_watermark(self) -> int | None:
        r = self._manager.get(self._plog.topic, self._plog.partition)
        return None if r is None else self._manager.high_watermark(r)

    def appended(self) -> None:
        self._durability.appended(self._plog)

    async def replicated(self, end_offset: int) -> None:
        await self._durability.replicated(self._manager.get(self._plog.topic, self._plog.partition), end_offset)


class NotAnEventStoreError(EventStoreError):
    """The topic exists here but is an ordinary log."""

    code = ErrorCode.FAILED_PRECONDITION


class EventStores:
    def __init__(self, logs: LogManager, offsets: OffsetStore, replication: ReplicaManager) -> None:
        self._logs = logs
        self._offsets = offsets
        self._replication = replication
        # the offsets log of a store's partition was replayed (this broker leads it now)
        offsets.add_reload_listener(self._offsets_reloaded)
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
        loop = asyncio.get_running_loop()

        def progress() -> ProgressStore:  # in the store's writer thread, when it opens
            store = OffsetProgressStore(self._offsets, topic, loop)
            try:
                store.import_legacy(str(plog.directory))
            except Exception as e:  # noqa: BLE001 - kept in its file, imported at the next open
                log.warning("event group progress not imported yet", topic=topic, error=repr(e))
            return store

        store = self._stores[topic] = EventStore(
            plog, progress=progress, replication=PartitionReplication(self._replication, plog)
        )
        return store

    def _held(self, topic: str) -> EventStore | None:
        """The topic's store if it is an event store this broker holds (opened on demand)."""
        if topic not in self._topics:
            return None
        try:
            return self.get(topic)
        except UnknownPartitionError:
            return None

    def replica_appended(self, topic: str) -> None:
        """A follower appended its leader's batches to the topic's log."""
        store = self._held(topic)
        if store is not None:
            store.follow_soon()

    async def truncating(self, topic: str, end_offset: int) -> None:
        """The topic's log (a follower's) is about to be cut to end at end_offset."""
        store = self._held(topic)
        if store is not None:
            await store.truncating(end_offset)

    def _offsets_reloaded(self, topic: str, partition: int) -> None:
        store = self._stores.get(topic)
        if store is not None and partition == 0:
            store.reload_groups()

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
