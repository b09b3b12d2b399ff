"""Topic administration: create, delete and add partitions (Kafka's topic control), with the
limits on partitions per broker and in the cluster, and per principal
(dmq.coordinator.principal_limits).

Every change is written to the store first (one transaction) and applied to memory after it
commits (dmq.coordinator.store_writes), and that pair completes even if the calling RPC is
cancelled. A full disk under SQLite fails the write whole (StoreFullError) and is answered
RESOURCE_EXHAUSTED "disk full on the coordinator" with the disk-full reason
(dmq.proto.error_details) in the trailing metadata: nothing changed, and the same request succeeds
once space is freed. These operations are serialized by one lock (admin_lock, which a reassignment
also takes to start) held through their broker calls, so a broker sees CreatePartitions and
DeletePartitions for a topic in the order the coordinator decided them; those calls have a timeout,
so the lock is bounded. A broker refusing its new partitions undoes the change
(dmq.coordinator.broker_calls says which answers are refusals).

Placement (DESIGN.md "Replication"): a topic's replication_factor (default min(3, live brokers),
or default_replication_factor) places each partition on that many brokers
(dmq.coordinator.controller.placement: leaders round-robin, followers on the next brokers, spread
over racks).

Listeners (the group coordinator) hear of added partitions and deleted topics after the fact.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import replace
from typing import Any

import structlog

from dmq.coordinator.broker_calls import DEFAULT_BROKER_CALL_TIMEOUT_MS, BrokerCalls, BrokerRefusal, BrokerRefusedError
from dmq.coordinator.controller.placement import place_partitions
from dmq.coordinator.membership import BrokerMembership
from dmq.coordinator.metadata_errors import (
    CoordinatorDiskFullError,
    MetadataError,
    MetadataPreconditionError,
    NoLiveBrokersError,
    NotEnoughBrokersError,
    TopicExistsError,
    UnknownTopicError,
)
from dmq.coordinator.metastore.base import MetadataStore, PartitionRecord, TopicExists, TopicRecord
from dmq.coordinator.principal_limits import PrincipalLimits, check_principal_limits
from dmq.coordinator.store_writes import complete_even_if_cancelled, coordinator_disk_full
from dmq.coordinator.topic_table import TopicTable
from dmq.proto import limits
from dmq.proto.names import shorten
from dmq.proto.server.domain_errors import ErrorCode
from dmq.proto.topic_settings import (
    TopicSettings,
    replication_defaults,
    validate_partition_count,
    validate_partition_increase,
    validate_topic_name,
)

log = structlog.get_logger(__name__)

# Partitions a broker may lead: each costs a directory, open files on demand and work at every
# restart (DESIGN.md: one broker holds 10,000). 200,011 partitions on one broker made a restart take
# 24.7 s and ListTopics time out.
MAX_PARTITIONS_PER_BROKER = 10_000
# Partitions in the cluster: bounds the coordinator's memory, its start-up and every metadata answer.
MAX_PARTITIONS_TOTAL = 100_000

PartitionsAddedListener = Callable[[str, int], Awaitable[None] | None]
TopicDeletedListener = Callable[[str], Awaitable[None] | None]


class PartitionLimitExceededError(MetadataError):
    # RESOURCE_EXHAUSTED: the request is valid, the cluster is full (delete topics or add brokers).
    code = ErrorCode.RESOURCE_EXHAUSTED


class TopicAdmin:
    """Creates, deletes and grows topics in the shared TopicTable. `check_ready` refuses while the
    coordinator is not the active, loaded one (dmq.coordinator.metadata)."""

    def __init__(
        self,
        store: MetadataStore,
        topics: TopicTable,
        membership: BrokerMembership,
        calls: BrokerCalls,
        *,
        admin_lock: asyncio.Lock,
        check_ready: Callable[[], None],
        clock_ms: Callable[[], int],
        default_topic_config: TopicSettings | None = None,
        default_replication_factor: int | None = None,
        principal_limits: PrincipalLimits | None = None,
        broker_call_timeout_ms: int = DEFAULT_BROKER_CALL_TIMEOUT_MS,
    ) -> None:
        if default_replication_factor is not None and not 1 <= default_replication_factor <= limits.REPLICATION_FACTOR_MAX:
            raise ValueError(
                f"default_replication_factor must be 1..{limits.REPLICATION_FACTOR_MAX} (or None: min(3, live "
                f"brokers)), got {default_replication_factor}"
            )
        if default_topic_config is not None:
            default_topic_config.validate(field_prefix="default_topic_config.")
        self.store = store
        self._topics = topics
        self.membership = membership
        self.calls = calls
        self._admin_lock = admin_lock
        self.check_ready = check_ready
        self.clock_ms = clock_ms
        self.default_topic_config = default_topic_config
        self.default_replication_factor = default_replication_factor
        self.principal_limits = principal_limits or PrincipalLimits()
        self.broker_call_timeout_ms = broker_call_timeout_ms
        # Plain attributes: an operator (or a test) may change them on a running coordinator.
        self.max_partitions_per_broker = MAX_PARTITIONS_PER_BROKER
        self.max_partitions_total = MAX_PARTITIONS_TOTAL
        self._partitions_added_listeners: list[PartitionsAddedListener] = []
        self._topic_deleted_listeners: list[TopicDeletedListener] = []

    # -- listeners -------------------------------------------------------------------------------

    def add_partitions_added_listener(self, callback: PartitionsAddedListener) -> None:
        """callback(topic, new_partition_count), sync or async, after the brokers were asked to create
        the new partitions. Errors are logged, not propagated."""
        self._partitions_added_listeners.append(callback)

    def add_topic_deleted_listener(self, callback: TopicDeletedListener) -> None:
        """callback(topic), sync or async, after the topic was removed. Errors are logged."""
        self._topic_deleted_listeners.append(callback)

    async def _notify(self, listeners: list[Callable[..., Any]], *args: Any) -> None:
        for callback in list(listeners):
            try:
                result = callback(*args)
                if inspect.isawaitable(result):
                    await asyncio.wait_for(result, self.broker_call_timeout_ms / 1000)
            except Exception:  # noqa: BLE001 - a listener's bug must not fail the admin request
                log.exception("metadata listener failed", listener=repr(callback), args=args)

    # -- topics ----------------------------------------------------------------------------------

    async def create_topic(
        self, name: str, partitions: int, config: TopicSettings | None = None, *, principal: str | None = None
    ) -> TopicRecord:
        """Create the topic; `principal` (None: security off) is recorded as its creator."""
        self.check_ready()
        config = config or TopicSettings()
        validate_topic_name(name)
        validate_partition_count(partitions)
        config.validate()
        config.check_event_store(partitions)
        async with self._admin_lock:
            if name in self._topics:
                raise TopicExistsError(name)
            live = self.membership.live_broker_ids()
            if not live:
                raise NoLiveBrokersError()
            settings = _settings_for(config, self.default_topic_config)
            defaulted = settings.replication_factor is None
            settings = replication_defaults(settings, len(live), self.default_replication_factor)
            settings.validate()  # a given min_insync_replicas above a defaulted factor
            if defaulted and _factor(settings) > len(live):
                # The operator's default asks for more brokers than are up (a cluster still starting):
                # retriable, unlike a factor the request named.
                raise NotEnoughBrokersError(
                    f"new topics get {_factor(settings)} replicas (default_replication_factor) and {len(live)} "
                    "brokers are live: retry once the brokers have started, or name a replication_factor"
                )
            settings.check_replication(len(live))
            states = place_partitions(name, range(partitions), _factor(settings), live, self.membership.racks())
            check_principal_limits(self.principal_limits, self._topics.values(), principal, principal, name,
                                   new_topics=1, new_partitions=partitions)
            self._check_partition_limits(name, states)
            record = TopicRecord(
                name=name,
                partition_count=partitions,
                placement={},
                states=states,
                config=settings,
                created_ms=self.clock_ms(),
                creator=principal,
            )
            await complete_even_if_cancelled(self._apply_create(record))
            log.info(
                "topic created",
                topic=name,
                partitions=partitions,
                brokers=sorted({b for s in record.states.values() for b in s.replicas}),
                config=record.config.to_dict(),
            )
            refusal = await self.calls.create_on_brokers(record, range(partitions))
            if refusal is not None:
                error = await self._undo(refusal, f"create topic {name!r}", self._apply_delete(name))
                if error.undone:
                    await self.calls.delete_on_brokers(record)
        if refusal is not None:
            if error.undone:
                # Listeners (the group coordinator) may have seen the topic meanwhile; it is gone again.
                await self._notify(self._topic_deleted_listeners, name)
            raise error
        return record

    async def _apply_create(self, record: TopicRecord) -> None:
        try:
            with coordinator_disk_full():
                await self.store.create_topic(record)
        except TopicExists as e:  # only if memory and the store disagree; say which
            raise MetadataError(f"topic {record.name!r} is already in the store but not in memory: {e}") from e
        self._topics[record.name] = record

    async def _undo(self, refusal: BrokerRefusal, change: str, undo: Coroutine[Any, Any, None]) -> BrokerRefusedError:
        """Undo a recorded change a broker refused; the error to answer (it names the broker's cause).
        When the store cannot undo it either (its disk is full too), the change stands and the answer
        says how it completes: the broker is handed its partitions whenever it registers."""
        log.warning(
            "broker refused partitions; undoing the change",
            change=change,
            broker_id=refusal.broker_id,
            code=refusal.code.name,
            error=refusal.message,
        )
        try:
            with coordinator_disk_full():
                await complete_even_if_cancelled(undo)
        except CoordinatorDiskFullError as e:
            log.error("could not undo a change a broker refused", change=change, error=str(e))
            return BrokerRefusedError(
                refusal,
                f"{change}: broker {refusal.broker_id} refused its partitions ({refusal.message}) and the "
                f"coordinator could not undo the change ({e}): once space is freed, restart broker "
                f"{refusal.broker_id}; it creates its partitions when it registers",
                undone=False,
            )
        return BrokerRefusedError(refusal, f"could not {change}: {refusal.message}", undone=True)

    async def delete_topic(self, name: str) -> None:
        self.check_ready()
        validate_topic_name(name)
        async with self._admin_lock:
            record = self._topics.get(name)
            if record is None:
                raise UnknownTopicError([name])
            await complete_even_if_cancelled(self._apply_delete(name))
            log.info("topic deleted", topic=name, partitions=record.partition_count)
            await self.calls.delete_on_brokers(record)
        await self._notify(self._topic_deleted_listeners, name)

    async def _apply_delete(self, name: str) -> None:
        with coordinator_disk_full():
            await self.store.delete_topic(name)
        del self._topics[name]

    async def add_partitions(self, name: str, total: int, *, principal: str | None = None) -> TopicRecord:
        """Grow the topic to `total` partitions (more than it has now), on behalf of `principal`;
        the new partitions count against the topic's creator."""
        self.check_ready()
        validate_topic_name(name)
        validate_partition_count(total)
        async with self._admin_lock:
            current = self._topics.get(name)
            if current is None:
                raise UnknownTopicError([name])
            validate_partition_increase(current.partition_count, total)
            current.config.check_event_store(total)
            live = self.membership.live_broker_ids()
            if not live:
                raise NoLiveBrokersError()
            factor = _factor(current.config)
            if factor > len(live):
                raise MetadataPreconditionError(
                    f"topic {name!r} has replication_factor {factor}; there are {len(live)} live brokers: "
                    "start brokers, then add partitions"
                )
            new = range(current.partition_count, total)
            added = place_partitions(name, new, factor, live, self.membership.racks())
            check_principal_limits(self.principal_limits, self._topics.values(), principal, current.creator, name,
                                   new_topics=0, new_partitions=len(added))
            self._check_partition_limits(name, added)
            record = await complete_even_if_cancelled(self._apply_add(name, total, added))
            log.info(
                "partitions added",
                topic=name,
                old_count=current.partition_count,
                new_count=total,
                brokers=sorted({b for s in added.values() for b in s.replicas}),
            )
            refusal = await self.calls.create_on_brokers(record, new)
            if refusal is not None:
                error = await self._undo(
                    refusal, f"add partitions to topic {name!r}", self._apply_remove(name, current.partition_count)
                )
                if error.undone:
                    await self.calls.delete_on_brokers(record, new)
                raise error
        # Listeners run outside the lock (they may read metadata), so two growths can notify out of
        # order; passing the count current at notification time keeps what they see non-decreasing.
        latest = self._topics.get(name)
        if latest is not None:
            await self._notify(self._partitions_added_listeners, name, latest.partition_count)
        return record

    def _check_partition_limits(self, topic: str, added: Mapping[int, PartitionRecord]) -> None:
        """Refuse placing `added` (partition -> state) when a broker (counting every replica it holds)
        or the cluster would hold too many."""
        total = sum(t.partition_count for t in self._topics.values())
        if total + len(added) > self.max_partitions_total:
            raise PartitionLimitExceededError(
                f"partitions: adding {len(added)} partitions to {shorten(topic)} would make "
                f"{total + len(added)} in the cluster; the limit (max_partitions_total) is "
                f"{self.max_partitions_total}: delete unused topics"
            )
        per_broker: dict[int, int] = {}
        for state in added.values():
            for broker_id in state.replicas:
                per_broker[broker_id] = per_broker.get(broker_id, 0) + 1
        held_by: dict[int, int] = {}
        for t in self._topics.values():  # one pass over every placement, not one per broker
            for st in t.states.values():
                for b in st.replicas:
                    if b in per_broker:
                        held_by[b] = held_by.get(b, 0) + 1
        for broker_id, count in sorted(per_broker.items()):
            held = held_by.get(broker_id, 0)
            if held + count > self.max_partitions_per_broker:
                raise PartitionLimitExceededError(
                    f"partitions: adding {len(added)} partitions to {shorten(topic)} would place "
                    f"{held + count} partitions on broker {broker_id}; the limit (max_partitions_per_broker) is "
                    f"{self.max_partitions_per_broker}: delete unused topics or add brokers"
                )

    async def _apply_add(self, name: str, total: int, added: dict[int, PartitionRecord]) -> TopicRecord:
        """The topic grown to `total` partitions (on the states current then: an election may have
        changed some while the admin lock was held)."""
        with coordinator_disk_full():
            await self.store.add_partitions(name, total, added)
        current = self._topics[name]
        record = TopicRecord(
            name, total, {}, current.config, current.created_ms, current.creator, {**current.states, **added}
        )
        self._topics[name] = record
        return record

    async def _apply_remove(self, name: str, count: int) -> None:
        """Undo _apply_add: back to `count` partitions (store first, then memory)."""
        await self.store.remove_partitions(name, count)
        current = self._topics[name]
        states = {p: st for p, st in current.states.items() if p < count}
        self._topics[name] = TopicRecord(name, count, {}, current.config, current.created_ms, current.creator, states)


def _factor(settings: TopicSettings) -> int:
    """A topic's replication factor (a topic recorded before replication has 1)."""
    return settings.replication_factor or 1


def _settings_for(config: TopicSettings, defaults: TopicSettings | None) -> TopicSettings:
    """A new topic's recorded settings: the server's defaults fill the unset ones, except that an
    event store never takes a retention default (it keeps every event)."""
    if config.is_event_store:
        config = replace(config, retention_ms=-1, retention_bytes=-1)
    return config.with_defaults(defaults)
