"""Partition reassignment (ReassignPartition; Kafka's AlterPartitionReassignments): the new
replicas are added as followers, and once the leader's AlterIsr shows them in sync the old ones are
dropped and the first listed replica leads. A background task per partition, owned by
Reassignments (close() cancels them, bounded), waits at most reassignment_timeout_ms for the new
replicas to catch up; a new order of replicas all in sync is finished at once. The state changes
go through the controller (dmq.coordinator.controller.controller); the new replicas' partitions
are created and the old ones deleted through dmq.coordinator.broker_calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable

import structlog

from dmq.coordinator.broker_calls import BrokerCalls
from dmq.coordinator.controller import partition_states
from dmq.coordinator.controller.controller import PartitionController, as_metadata_error
from dmq.coordinator.controller.partition_states import StateRefusedError
from dmq.coordinator.membership import BrokerMembership
from dmq.coordinator.metadata_errors import MetadataError, MetadataPreconditionError
from dmq.coordinator.metastore.base import PartitionRecord
from dmq.coordinator.topic_table import TopicTable
from dmq.proto import dmq_pb2 as pb
from dmq.proto.names import shorten
from dmq.proto.topic_settings import validate_topic_name

log = structlog.get_logger(__name__)

# A reassignment waits this long for its new replicas to catch up before it gives up (they stay
# replicas; the operator may reassign again).
DEFAULT_REASSIGNMENT_TIMEOUT_MS = 600_000


class Reassignments:
    """The reassignments under way, one task per partition. `admin_lock` is topic administration's
    (dmq.coordinator.topic_admin): a reassignment starts under it, so a topic deletion does not
    run while its new replicas are created."""

    def __init__(
        self,
        topics: TopicTable,
        membership: BrokerMembership,
        controller: PartitionController,
        calls: BrokerCalls,
        *,
        admin_lock: asyncio.Lock,
        check_ready: Callable[[], None],
        reassignment_timeout_ms: int = DEFAULT_REASSIGNMENT_TIMEOUT_MS,
    ) -> None:
        if reassignment_timeout_ms <= 0:
            raise ValueError(f"reassignment_timeout_ms must be > 0, got {reassignment_timeout_ms}")
        self._topics = topics
        self.membership = membership
        self.controller = controller
        self.calls = calls
        self._admin_lock = admin_lock
        self.check_ready = check_ready
        self.reassignment_timeout_ms = reassignment_timeout_ms
        self._reassignments: dict[tuple[str, int], asyncio.Task[None]] = {}

    async def reassign_partition(self, topic: str, partition: int, replicas: list[int]) -> PartitionRecord:
        """Start moving the partition to `replicas`: the new ones are created as followers now; a
        background task drops the old ones once the new ones are in sync. The state now."""
        self.check_ready()
        validate_topic_name(topic, field="topic")
        key = (topic, partition)
        async with self._admin_lock:  # against a topic deletion while the new replicas are created
            self._topics.existing_state(topic, partition)
            running = self._reassignments.get(key)
            if running is not None and not running.done():
                raise MetadataPreconditionError(
                    f"{shorten(topic)} partition {partition} is being reassigned already; wait until it completes"
                )
            try:
                partition_states.check_reassignment(replicas, self.membership.live_broker_ids())
            except StateRefusedError as e:
                raise as_metadata_error(e) from e
            before = self._topics.existing_state(topic, partition)

            def start(st: PartitionRecord, live: list[int]) -> PartitionRecord:
                after = partition_states.reassignment_started(st, replicas)
                # Only a new order (no replica added or leaving), all in sync: finished at once, so
                # the answer already names the elected leader; the task below then finds nothing to do.
                if after.replicas == tuple(replicas) and partition_states.reassignment_ready(after, replicas):
                    return partition_states.reassignment_finished(after, replicas, live)
                return after

            await self.controller.change_states(self.controller.partition_change(topic, partition, start))
            state = self._topics.existing_state(topic, partition)
            added = [b for b in state.replicas if b not in before.replicas]
            if added:
                record = self._topics[topic]
                refusals = await asyncio.gather(
                    *(self.calls.call_broker(b, "CreatePartitions", self.calls.create_request(record, [partition]),
                                             topic=topic, partitions=[partition]) for b in added)
                )
                for refusal in refusals:
                    if refusal is not None:
                        log.warning("a new replica's broker refused it; the reassignment waits for it",
                                    topic=topic, partition=partition, broker_id=refusal.broker_id, error=refusal.message)
            log.info("reassignment started", topic=topic, partition=partition, target=replicas,
                     replicas=list(state.replicas), added=added)
            task = asyncio.ensure_future(self._complete_reassignment(topic, partition, list(replicas)))
            task.set_name(f"reassign-{topic}-{partition}")
            self._reassignments[key] = task
            task.add_done_callback(functools.partial(self._reassignment_done, key))
        return state

    def _reassignment_done(self, key: tuple[str, int], task: asyncio.Task[None]) -> None:
        if self._reassignments.get(key) is task:
            del self._reassignments[key]

    async def _complete_reassignment(self, topic: str, partition: int, target: list[int]) -> None:
        """Wait (bounded) until every target replica is in sync, then drop the others."""
        deadline = time.monotonic() + self.reassignment_timeout_ms / 1000
        try:
            while True:
                state = self._topics.partition_state(topic, partition)
                if state is None or not set(target) <= set(state.replicas):
                    log.warning("reassignment abandoned: the partition changed", topic=topic, partition=partition)
                    return
                if partition_states.reassignment_ready(state, target):
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    log.error("reassignment timed out: the new replicas did not catch up; they stay replicas",
                              topic=topic, partition=partition, target=target, isr=list(state.isr))
                    return
                changed = self.controller.states_changed
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), min(left, 1.0))
            before = state
            _changes, pushed = await self.controller.change_states(
                self.controller.partition_change(
                    topic, partition, lambda st, live: partition_states.reassignment_finished(st, target, live)
                )
            )
            removed = [b for b in before.replicas if b not in target]
            await pushed
            record = self._topics.get(topic)
            if record is not None and removed:
                request = pb.DeletePartitionsRequest(topic=topic, partitions=[partition])
                await asyncio.gather(*(self.calls.call_broker(b, "DeletePartitions", request, topic=topic, partitions=[partition])
                                       for b in removed))
            log.info("reassignment completed", topic=topic, partition=partition, replicas=target, removed=removed)
        except MetadataError as e:
            log.error("reassignment failed", topic=topic, partition=partition, error=str(e))

    async def close(self) -> None:
        """Stop the reassignments under way; bounded."""
        tasks = list(self._reassignments.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
