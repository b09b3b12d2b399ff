"""The metadata store interface: everything the coordinator must not forget, behind one Protocol.

Backends: SQLite (dmq.coordinator.store, the embedded default: one file in the data directory) and
etcd (dmq.coordinator.metastore.etcd, shared by several coordinators). The coordinator reaches its
durable state only through `MetadataStore`; no other module touches SQLite or etcd.

What is stored (the record kinds; each backend documents its own layout):
  brokers            every broker that ever registered (BrokerRecord); liveness is not stored
  topics             name, partition count, settings, creation time, creator (TopicRecord)
  partition states   per partition: replicas, ISR, leader, leader epoch, partition epoch (PartitionRecord)
  groups             subscription ("first wins"), start offsets, generation (GroupRecord)
  ACLs               rows of six words, and a version bumped by every change
  principal limits   the per-principal topic / partition limits in force (PrincipalLimitsRecord)
  controller epoch   bumped by every coordinator that takes control (claim_controller_epoch)

Compare-and-swap, two levels, so that two coordinators that both believe they lead never both write:
  1. Per record: the store remembers the version (SQLite: a row version; etcd: the key's
     mod_revision) of every partition state and topic it read (load_topics) or wrote. A write of a
     partition state or a topic's partition count is conditioned on that version: if another writer
     changed the record since, nothing is written and StoreConflict is raised.
  2. Fencing: after claim_controller_epoch() every write of this store is also conditioned on the
     controller epoch still being the one it claimed. A coordinator that claims control after it
     (a standby taking over) bumps the epoch, so every later write of the deposed one fails with
     StoreConflict, whatever it writes. Kafka's controller epoch, kept where the metadata is.
A StoreConflict means "you are not the controller any more, or your view is stale": reload, never
retry blindly.

Leadership itself (an etcd lease and campaign, issue 28 item 2) is not here yet: the seam is
claim_controller_epoch(), which a future election calls once it has won.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from dmq.proto.topic_settings import TopicSettings


class StoreError(RuntimeError):
    """The metadata store cannot be used (newer schema, closed store, unreachable)."""


class StoreFullError(StoreError):
    """The store's disk is full: the write was rolled back and changed nothing.
    Transient: the same write succeeds once space is freed."""


class StoreConflict(StoreError):
    """A conditional write lost: the record (or the controller epoch) changed since this store read
    it. Nothing was written. The writer is stale or deposed: reload, do not retry blindly."""


class TopicExists(StoreError):
    """create_topic of a name that is already stored."""


@dataclass(frozen=True, slots=True)
class BrokerRecord:
    broker_id: int
    host: str
    port: int
    registered_ms: int
    rack: str = ""  # rack / zone label ("" = none)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


NO_LEADER = -1


@dataclass(frozen=True, slots=True)
class PartitionRecord:
    """One partition's replication state, as the controller decided it (proto PartitionState)."""

    replicas: tuple[int, ...]  # the first is the preferred leader
    isr: tuple[int, ...]  # in the order of `replicas`
    leader: int  # NO_LEADER: offline
    leader_epoch: int = 0
    partition_epoch: int = 0

    @classmethod
    def unreplicated(cls, broker_id: int) -> PartitionRecord:
        return cls((broker_id,), (broker_id,), broker_id)

    @property
    def under_replicated(self) -> bool:
        return len(self.isr) < len(self.replicas)


@dataclass(frozen=True, slots=True)
class TopicRecord:
    """A topic as placed. Immutable: a change (AddPartitions, an election) makes a new record, so a
    caller holding one sees a consistent snapshot.

    `states` is each partition's replication state; when only `placement` is given (partition ->
    broker) every partition is unreplicated on that broker. `placement` is always partition ->
    current leader (NO_LEADER when offline)."""

    name: str
    partition_count: int
    placement: Mapping[int, int]  # partition -> leader broker_id, for every partition 0..partition_count-1
    config: TopicSettings = field(default_factory=TopicSettings)
    created_ms: int = 0
    creator: str | None = None  # the principal that created it; None with security off
    states: Mapping[int, PartitionRecord] = field(default_factory=dict)

    def __post_init__(self) -> None:
        states = dict(self.states) or {p: PartitionRecord.unreplicated(b) for p, b in self.placement.items()}
        object.__setattr__(self, "states", MappingProxyType(states))
        object.__setattr__(self, "placement", MappingProxyType({p: s.leader for p, s in states.items()}))

    def leader(self, partition: int) -> int | None:
        return self.placement.get(partition)

    def partitions_on(self, broker_id: int) -> list[int]:
        """The partitions the broker leads."""
        return sorted(p for p, b in self.placement.items() if b == broker_id)

    def replicas_on(self, broker_id: int) -> list[int]:
        """The partitions of which the broker holds a replica (leading or following)."""
        return sorted(p for p, s in self.states.items() if broker_id in s.replicas)

    def with_states(self, changed: Mapping[int, PartitionRecord]) -> TopicRecord:
        return TopicRecord(
            self.name, self.partition_count, {}, self.config, self.created_ms, self.creator,
            {**self.states, **changed},
        )


@dataclass(frozen=True, slots=True)
class GroupRecord:
    group_id: str
    topic: str
    app_id: str
    subscription_mode: str  # "all" | "new" | "timestamp"
    subscription_from_ms: int | None  # None unless mode is "timestamp"
    created_ms: int
    start_offsets: Mapping[int, int] = field(default_factory=dict)  # partition -> offset (mode "new")
    generation: int = 0  # the last generation recorded (0: none yet)
    state_json: str = ""  # its membership (dmq.coordinator.group.durable); "": none recorded

    def __post_init__(self) -> None:
        object.__setattr__(self, "start_offsets", MappingProxyType(dict(self.start_offsets)))


@dataclass(frozen=True, slots=True)
class PrincipalLimitsRecord:
    """The per-principal limits in force (dmq.coordinator.principal_limits.PrincipalLimits, 0 = unlimited)."""

    max_topics: int = 0
    max_partitions: int = 0
    exempt: tuple[str, ...] = ()


AclRow = tuple[str, ...]  # the six words of an ACL entry (dmq.proto.security.acls)


class MetadataStore(Protocol):
    """The coordinator's durable state. Every write is atomic (all of it or none), completes even if
    the calling coroutine is cancelled, and raises StoreFullError / StoreConflict having changed
    nothing. Reads are used at start-up (and by a standby keeping warm)."""

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    # -- controller epoch (fencing) --
    async def load_controller_epoch(self) -> int:
        """The current controller epoch (0: nobody has claimed control yet)."""
        ...

    async def claim_controller_epoch(self) -> int:
        """Bump the controller epoch by one (compare-and-swap on the value read) and fence every
        later write of this store on it; the new epoch. StoreConflict when another claim won the race."""
        ...

    # -- brokers --
    async def upsert_broker(self, broker: BrokerRecord) -> None: ...

    async def load_brokers(self) -> list[BrokerRecord]: ...

    # -- topics and partition states --
    async def create_topic(self, topic: TopicRecord) -> None:
        """The topic and all its partition states; TopicExists if the name is taken."""
        ...

    async def add_partitions(
        self, name: str, new_count: int, new_placement: Mapping[int, int] | Mapping[int, PartitionRecord]
    ) -> None:
        """Grow the topic to `new_count` (CAS on the topic as read); `new_placement`: partition -> its
        state, or partition -> broker (unreplicated)."""
        ...

    async def update_partitions(self, states: Mapping[tuple[str, int], PartitionRecord]) -> None:
        """New states of existing partitions, CAS on each as read; states of deleted topics are ignored."""
        ...

    async def remove_partitions(self, name: str, count: int) -> None:
        """Shrink the topic back to `count` partitions (undoes an add_partitions)."""
        ...

    async def delete_topic(self, name: str) -> None: ...

    async def load_topics(self) -> list[TopicRecord]:
        """Every topic (sorted by name), and remember each record's version for later CAS writes."""
        ...

    # -- groups --
    async def save_group(self, group: GroupRecord) -> None: ...

    async def load_groups(self) -> list[GroupRecord]: ...

    async def delete_group(self, group_id: str) -> bool:
        """False when there was no such group."""
        ...

    # -- ACLs --
    async def change_acls(self, add: Iterable[AclRow], remove: Iterable[AclRow], version: int) -> int:
        """Add and remove rows and set the ACL version, atomically; how many rows actually changed."""
        ...

    async def load_acls(self) -> tuple[int, list[AclRow]]:
        """(version, rows sorted)."""
        ...

    # -- principal limits --
    async def save_principal_limits(self, limits: PrincipalLimitsRecord) -> None: ...

    async def load_principal_limits(self) -> PrincipalLimitsRecord | None:
        """None when never saved."""
        ...
