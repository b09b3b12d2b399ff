"""The metadata service: brokers, topics and partition placement, the coordinator's side of
Kafka's controller. One job per module:

  membership            dmq.coordinator.membership: the broker registry and the brokers' sessions
  topics in memory      dmq.coordinator.topic_table: one table the parts below share
  topic administration  dmq.coordinator.topic_admin: create, delete, add partitions; partition limits
  principal limits      dmq.coordinator.principal_limits: topics and partitions per creating principal
  the controller        dmq.coordinator.controller.controller: elections, ISR changes, preferred leaders
  reassignment          dmq.coordinator.controller.reassignment: moving a partition's replicas
  broker calls          dmq.coordinator.broker_calls: CreatePartitions / DeletePartitions, refusals
  writes, refusals      dmq.coordinator.store_writes, dmq.coordinator.metadata_errors
  proto conversions     dmq.coordinator.metadata_proto
  the gRPC servicer     dmq.coordinator.metadata_service: RPCs translated to the parts above

MetadataManager (here) builds the parts around one TopicTable, one BrokerMembership and the topic
admin lock, loads them from the store, and is what in-process callers hold (the node, the group
coordinator, the servicer): readiness, the reads, the listeners, close(). The parts raise
MetadataError subclasses (DomainErrors), each carrying its status code.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from dmq.coordinator.broker_calls import DEFAULT_BROKER_CALL_TIMEOUT_MS, BrokerCalls
from dmq.coordinator.broker_pool import BrokerPool
from dmq.coordinator.controller.controller import PartitionController
from dmq.coordinator.controller.pushes import StatePusher
from dmq.coordinator.controller.reassignment import DEFAULT_REASSIGNMENT_TIMEOUT_MS, Reassignments
from dmq.coordinator.controller.sessions import DEFAULT_BROKER_SESSION_TIMEOUT_MS, wall_clock_ms
from dmq.coordinator.membership import BrokerMembership
from dmq.coordinator.metadata_errors import CoordinatorStartingError, MetadataError
from dmq.coordinator.metastore.base import BrokerRecord, MetadataStore, PartitionRecord, TopicRecord
from dmq.coordinator.pause_watch import PauseWatch
from dmq.coordinator.principal_limits import PrincipalLimits
from dmq.coordinator.topic_admin import PartitionsAddedListener, TopicAdmin, TopicDeletedListener
from dmq.coordinator.topic_table import TopicTable
from dmq.proto.topic_settings import TopicSettings

log = structlog.get_logger(__name__)


class MetadataManager:
    def __init__(
        self,
        store: MetadataStore,
        broker_pool: BrokerPool,
        *,
        broker_session_timeout_ms: int = DEFAULT_BROKER_SESSION_TIMEOUT_MS,
        broker_call_timeout_ms: int = DEFAULT_BROKER_CALL_TIMEOUT_MS,
        default_topic_config: TopicSettings | None = None,
        principal_limits: PrincipalLimits | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
        default_replication_factor: int | None = None,
        reassignment_timeout_ms: int = DEFAULT_REASSIGNMENT_TIMEOUT_MS,
        pause_watch: PauseWatch | None = None,
    ) -> None:
        self.store = store
        self.broker_pool = broker_pool
        self.broker_call_timeout_ms = broker_call_timeout_ms
        self.ready = False
        # With several coordinators (dmq.coordinator.controller.leadership): acting only while the
        # lease is surely held; a standby's refusal names the active coordinator (node.py sets both).
        self.acting: Callable[[], bool] = lambda: True
        self.not_ready_error: Callable[[], MetadataError] = CoordinatorStartingError
        self._topics = TopicTable()
        self.membership = BrokerMembership(
            store, broker_pool, partitions_led=self._topics.partitions_led, broker_session_timeout_ms=broker_session_timeout_ms,
            clock_ms=clock_ms, pause_watch=pause_watch,
        )
        self.calls = BrokerCalls(broker_pool, self.membership.broker_address, self._topics,
                                 broker_call_timeout_ms=broker_call_timeout_ms)
        self.pusher = StatePusher(broker_pool, self.membership.broker_address, call_timeout_ms=broker_call_timeout_ms)
        # Topic creations, deletions, growths and the start of a reassignment: one at a time.
        admin_lock = asyncio.Lock()
        self.topic_admin = TopicAdmin(
            store, self._topics, self.membership, self.calls, admin_lock=admin_lock, check_ready=self.check_ready,
            clock_ms=clock_ms, default_topic_config=default_topic_config,
            default_replication_factor=default_replication_factor, principal_limits=principal_limits,
            broker_call_timeout_ms=broker_call_timeout_ms,
        )
        self.controller = PartitionController(
            store, self._topics, self.membership, self.calls, self.pusher, check_ready=self.check_ready
        )
        self.reassignments = Reassignments(
            self._topics, self.membership, self.controller, self.calls, admin_lock=admin_lock,
            check_ready=self.check_ready, reassignment_timeout_ms=reassignment_timeout_ms,
        )

    def __repr__(self) -> str:
        return (
            f"<MetadataManager ready={self.ready} topics={len(self._topics)} brokers={len(self.membership)} "
            f"live={len(self.live_broker_ids())}>"
        )

    async def load(self) -> None:
        """Load brokers and topics from the store (at start, and anew at each term after a step-down)."""
        now = self.membership.clock_ms()
        self.controller.forget_unelected()
        self.membership.load(await self.store.load_brokers(), now)
        self._topics.clear()
        self._topics.update((t.name, t) for t in await self.store.load_topics())
        self.ready = True
        log.info("metadata loaded", topics=len(self._topics), brokers=len(self.membership))

    def check_ready(self) -> None:
        if not self.ready or not self.acting():
            raise self.not_ready_error()

    async def close(self) -> None:
        """Stop the background work (reassignments, pushes); bounded."""
        await self.reassignments.close()
        await self.pusher.close()

    # -- reads, for in-process callers -------------------------------------------------------------

    def topic(self, name: str) -> TopicRecord | None:
        return self._topics.get(name)

    def topics(self) -> list[TopicRecord]:
        return self._topics.sorted()

    def brokers(self) -> list[BrokerRecord]:
        return self.membership.brokers()

    def broker_address(self, broker_id: int) -> str | None:
        return self.membership.broker_address(broker_id)

    def is_broker_alive(self, broker_id: int) -> bool:
        return self.membership.is_broker_alive(broker_id)

    def live_broker_ids(self) -> list[int]:
        """The brokers that may lead and hold new replicas: alive and not shutting down."""
        return self.membership.live_broker_ids()

    def partition_state(self, topic: str, partition: int) -> PartitionRecord | None:
        return self._topics.partition_state(topic, partition)

    # -- listeners (dmq.coordinator.topic_admin calls them) ----------------------------------------

    def on_partitions_added(self, callback: PartitionsAddedListener) -> None:
        """callback(topic, new_partition_count) after partitions were added (TopicAdmin's listeners)."""
        self.topic_admin.add_partitions_added_listener(callback)

    def on_topic_deleted(self, callback: TopicDeletedListener) -> None:
        """callback(topic) after the topic was removed (TopicAdmin's listeners)."""
        self.topic_admin.add_topic_deleted_listener(callback)
