"""The controller: decides, records and pushes partition state changes (DESIGN.md "Replication";
Kafka's replication control). Each partition's state (replicas, ISR, leader, leader_epoch,
partition_epoch) changes only through the rules of dmq.coordinator.controller.partition_states,
each change written to the store, applied to memory and pushed to the brokers
(dmq.coordinator.controller.pushes):
  - a broker's session expires (the node's monitor, every liveness_check_interval_ms) or it
    heartbeats shutting_down=true (answered after the pushes): it leaves every ISR, and the
    partitions it led get a new leader from the live ISR (or none: offline, leader_id -1);
  - a broker registers: offline partitions whose in-sync replica it is get it back as leader;
  - AlterIsr from a partition's leader (checked: current epochs, leader in the set, replicas only);
  - the preferred leader (the first replica), alive and back in sync, takes the lead back (a
    periodic check, at most MAX_PREFERRED_MOVES_PER_CHECK partitions each time);
  - a reassignment's steps (dmq.coordinator.controller.reassignment).
State changes are serialized by their own lock, not the topic admin lock, so an election never
waits for a topic creation's broker calls. An unreplicated partition (one replica) keeps its broker
as leader while it is down (leader_alive=false) and its broker is sent no states, as before
replication.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterable

import structlog

from dmq.coordinator.broker_calls import BrokerCalls
from dmq.coordinator.controller import partition_states
from dmq.coordinator.controller.partition_states import StateRefusedError
from dmq.coordinator.controller.pushes import StatePusher
from dmq.coordinator.membership import BrokerMembership
from dmq.coordinator.metadata_errors import MetadataError
from dmq.coordinator.metastore.base import MetadataStore, PartitionRecord, TopicRecord
from dmq.coordinator.store_writes import complete_even_if_cancelled, coordinator_disk_full
from dmq.coordinator.topic_table import StateChanges, TopicTable
from dmq.proto import dmq_pb2 as pb
from dmq.proto.names import shorten
from dmq.proto.server.domain_errors import ErrorCode
from dmq.proto.topic_settings import validate_topic_name

log = structlog.get_logger(__name__)

# The preferred-leader check moves at most this many leaders at a time, so one check is a bounded
# amount of SQLite and push work; the next check continues.
MAX_PREFERRED_MOVES_PER_CHECK = 100
DEFAULT_PREFERRED_LEADER_CHECK_INTERVAL_MS = 5_000

_Transition = Callable[[PartitionRecord, int, list[int], TopicRecord], PartitionRecord]


def _failed(state: PartitionRecord, broker: int, live: list[int], record: TopicRecord) -> PartitionRecord:
    return partition_states.broker_failed(state, broker, live, unclean=bool(record.config.unclean_leader_election))


def _back(state: PartitionRecord, broker: int, live: list[int], record: TopicRecord) -> PartitionRecord:
    return partition_states.broker_back(state, broker, live)


def as_metadata_error(e: StateRefusedError) -> MetadataError:
    return MetadataError(str(e), code=e.code)


class PartitionController:
    """The controller's events (brokers registering, heartbeating, shutting down, expiring;
    AlterIsr; preferred leaders) turned into recorded and pushed partition states. `check_ready`
    refuses while the coordinator is not the active, loaded one (dmq.coordinator.metadata)."""

    def __init__(
        self,
        store: MetadataStore,
        topics: TopicTable,
        membership: BrokerMembership,
        calls: BrokerCalls,
        pusher: StatePusher,
        *,
        check_ready: Callable[[], None],
    ) -> None:
        self.store = store
        self._topics = topics
        self.membership = membership
        self.calls = calls
        self.pusher = pusher
        self.check_ready = check_ready
        # Partition state changes (elections, AlterIsr, reassignments): decided and recorded one at a time.
        self._state_lock = asyncio.Lock()
        self._states_changed = asyncio.Event()  # set and replaced at every change (reassignments wait on it)
        self._unelected: set[int] = set()  # failed brokers whose elections could not be recorded yet

    @property
    def states_changed(self) -> asyncio.Event:
        """Set at the next recorded change (a new event each time)."""
        return self._states_changed

    # -- brokers ---------------------------------------------------------------------------------

    async def register_broker(
        self, broker_id: int, host: str, port: int, *, principal: str | None = None, rack: str = ""
    ) -> list[pb.CreatePartitionsRequest]:
        """Record the broker, mark it alive (dmq.coordinator.membership), and return every partition
        it holds a replica of (with their states when replicated). Offline partitions it is in sync
        for get it as leader."""
        self.check_ready()
        await self.membership.register(broker_id, host, port, principal=principal, rack=rack)
        self.pusher.on_registered(broker_id)
        # Not pushed to the broker itself: its registration answer carries the states (a push could
        # overtake the answer and name partitions it has not created yet).
        await self.change_states(lambda live: self._transitions_for(broker_id, live, transition=_back),
                                  skip=[broker_id])
        return self.calls.partition_requests_for(broker_id)

    def heartbeat(self, broker_id: int) -> bool:
        """Refresh the broker's session; True when it must re-register (unknown or expired).
        States it missed are sent again now (StatePusher.on_heartbeat)."""
        self.check_ready()
        if self.membership.heartbeat(broker_id):
            return True
        self.pusher.on_heartbeat(broker_id)
        return False

    async def broker_shutting_down(self, broker_id: int) -> bool:
        """A clean shutdown: move leadership off the broker and take it out of every ISR now, push the
        new states (to it too, so it stops leading) and return once they are answered. True when it
        must re-register (as heartbeat())."""
        if self.heartbeat(broker_id):
            return True
        self.membership.mark_shutting_down(broker_id)
        changes, pushed = await self.change_states(
            lambda live: self._transitions_for(broker_id, live, transition=_failed), also=[broker_id]
        )
        await pushed
        log.info("broker shutting down: leadership moved", broker_id=broker_id, changed=len(changes))
        return False

    def forget_unelected(self) -> None:
        """A new term reloads the brokers and starts their sessions anew: elections owed from an
        earlier term are decided again from that."""
        self._unelected.clear()

    async def check_brokers(self) -> list[int]:
        """The monitor's tick: end the sessions that timed out and elect new leaders for what they
        led (retrying elections a full disk kept from being recorded); the ids expired now."""
        expired = self.membership.expire_brokers()
        self._unelected.update(expired)
        for broker_id in sorted(self._unelected):
            await self.change_states(functools.partial(self._transitions_for, broker_id, transition=_failed))
            self._unelected.discard(broker_id)
        return expired

    def _transitions_for(self, broker_id: int, live: list[int], *, transition: _Transition) -> StateChanges:
        """Every partition with a replica on the broker, moved by transition(state, broker, live, topic)."""
        changes: StateChanges = {}
        for record in self._topics.values():
            for p, state in record.states.items():
                if broker_id not in state.replicas:
                    continue
                after = transition(state, broker_id, live, record)
                if after is not state:
                    changes[(record.name, p)] = after
        return changes

    async def rebalance_preferred_leaders(self, max_moves: int = MAX_PREFERRED_MOVES_PER_CHECK) -> int:
        """Give leadership back to each partition's first replica where it is alive, in sync and not
        leading; at most max_moves partitions. How many moved."""

        def moves(live: list[int]) -> StateChanges:
            changes: StateChanges = {}
            for record in self._topics.values():
                for p, state in record.states.items():
                    after = partition_states.preferred_leader(state, live)
                    if after is not state:
                        changes[(record.name, p)] = after
                        if len(changes) >= max_moves:
                            return changes
            return changes

        changes, _pushed = await self.change_states(moves)
        if changes:
            log.info("preferred leaders restored", partitions=len(changes))
        return len(changes)

    async def alter_isr(
        self, broker_id: int, topic: str, partition: int, leader_epoch: int, partition_epoch: int, isr: list[int]
    ) -> tuple[str, int, PartitionRecord]:
        """The leader's request to change the in-sync set (partition_states.alter_isr): the state after
        it. A refused request raises, and the broker is sent the current state again."""
        self.check_ready()
        validate_topic_name(topic, field="topic")
        where = f"{shorten(topic)} partition {partition}"
        error: StateRefusedError | None = None

        def accept(state: PartitionRecord, live: list[int]) -> PartitionRecord:
            nonlocal error
            try:
                return partition_states.alter_isr(
                    state, broker_id=broker_id, leader_epoch=leader_epoch, partition_epoch=partition_epoch,
                    isr=isr, live=live, where=where,
                )
            except StateRefusedError as e:
                error = e
                return state

        await self.change_states(self.partition_change(topic, partition, accept))
        state = self._topics.existing_state(topic, partition)
        if error is not None:
            if error.code == ErrorCode.FAILED_PRECONDITION and broker_id in state.replicas:
                # It acts on an old state (a push it missed): it gets the current one.
                self.pusher.push({(topic, partition): state}, [broker_id])
            raise as_metadata_error(error)
        return topic, partition, state

    def partition_change(
        self, topic: str, partition: int, transition: Callable[[PartitionRecord, list[int]], PartitionRecord]
    ) -> Callable[[list[int]], StateChanges]:
        """For change_states: one partition moved by transition(current state, live)."""

        def compute(live: list[int]) -> StateChanges:
            state = self._topics.existing_state(topic, partition)
            after = transition(state, live)
            return {} if after is state else {(topic, partition): after}

        return compute

    # -- partition states --------------------------------------------------------------------------

    async def change_states(
        self, compute: Callable[[list[int]], StateChanges], *, also: Iterable[int] = (), skip: Iterable[int] = ()
    ) -> tuple[StateChanges, asyncio.Future[None]]:
        """Decide (compute(live) from the current states), record (SQLite, then memory) and push a
        change of partition states, one change at a time. The changes, and the push, which runs in
        the background (awaited by callers that answer after it); `also`: brokers pushed to even
        when they are not live (one shutting down); `skip`: brokers not pushed to."""
        async with self._state_lock:
            live = self.membership.live_broker_ids()
            changes = compute(live)
            if changes:
                await complete_even_if_cancelled(self._apply_states(changes))
        if not changes:
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return changes, done
        extra = list(also)
        targets = set(live) | set(extra)
        return changes, self.pusher.push(changes, targets - set(skip), also=extra)

    async def _apply_states(self, changes: StateChanges) -> None:
        with coordinator_disk_full():
            await self.store.update_partitions(changes)
        self._topics.apply_states(changes)
        for (topic, p), state in sorted(changes.items()):
            log.info("partition state changed", topic=topic, partition=p, leader=state.leader,
                     leader_epoch=state.leader_epoch, isr=list(state.isr), replicas=list(state.replicas),
                     partition_epoch=state.partition_epoch)
        self._states_changed.set()
        self._states_changed = asyncio.Event()
