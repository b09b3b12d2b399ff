"""The controller's state transitions of one partition, pure (DESIGN.md "Replication").

Each function takes a partition's PartitionRecord (replicas, ISR, leader, leader_epoch,
partition_epoch) and returns the next one, or the same object when nothing changes: callers
persist and push only what changed. The election rules themselves are election.py's; this module
adds the partition epoch (bumped by every change, so a broker ignores a stale push) and the
checks of the requests that change a state (AlterIsr, a reassignment).

Transitions (event => next state):
  broker failed / shutting down   it leaves the ISR (unless it is the last member); if it led, a
                                  new leader from the live ISR (unclean: any live replica), else
                                  offline (NO_LEADER); leader_epoch + 1 when the leader changed.
                                  An unreplicated partition (one replica) is left as it is: there
                                  is no one else to lead, and its broker takes it back at epoch 0
                                  when it returns (as before replication).
  broker back                     an offline partition whose in-sync replica returned: it leads.
  preferred leader                the first replica, alive and in sync, takes the lead back.
  AlterIsr (from the leader)      accepted only at the current epochs, from the leader, with the
                                  leader in the set, every member a replica and every added member
                                  alive; the set is kept in the order of the replicas.
  reassignment start              the target's new brokers join the replicas (target first, then
                                  the ones leaving), as followers; the ISR is unchanged.
  reassignment finish             once every target replica is in sync: replicas = target, the ISR
                                  loses the others; the preferred (first) target replica leads when
                                  alive and in sync, else a leader leaving hands over to the first
                                  live in-sync target replica (leader_epoch + 1 when it changed).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import replace

from dmq.coordinator.controller.election import (
    PartitionLeadership,
    elect_leader,
    on_broker_back,
    on_broker_failed,
    restore_preferred,
)
from dmq.coordinator.metastore.base import NO_LEADER, PartitionRecord
from dmq.proto import limits
from dmq.proto.server.domain_errors import DomainError, ErrorCode


class StateRefusedError(DomainError):
    """A request to change a partition's state, refused with `code` (dmq.proto.server.domain_errors)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message, code=code)


def _leadership(state: PartitionRecord) -> PartitionLeadership:
    leader = None if state.leader == NO_LEADER else state.leader
    return PartitionLeadership(state.replicas, frozenset(state.isr), leader, state.leader_epoch)


def _ordered(replicas: Sequence[int], members: Collection[int]) -> tuple[int, ...]:
    return tuple(b for b in replicas if b in members)


def _next(state: PartitionRecord, after: PartitionLeadership) -> PartitionRecord:
    """`state` moved to `after`: the same object when nothing changed, else partition_epoch + 1."""
    leader = NO_LEADER if after.leader is None else after.leader
    isr = _ordered(after.replicas, after.isr)
    if (after.replicas, isr, leader, after.leader_epoch) == (state.replicas, state.isr, state.leader, state.leader_epoch):
        return state
    return PartitionRecord(after.replicas, isr, leader, after.leader_epoch, state.partition_epoch + 1)


def broker_failed(state: PartitionRecord, broker: int, live: Collection[int], *, unclean: bool) -> PartitionRecord:
    if len(state.replicas) == 1:
        return state
    return _next(state, on_broker_failed(_leadership(state), broker, live, unclean=unclean))


def broker_back(state: PartitionRecord, broker: int, live: Collection[int]) -> PartitionRecord:
    return _next(state, on_broker_back(_leadership(state), broker, live))


def preferred_leader(state: PartitionRecord, live: Collection[int]) -> PartitionRecord:
    return _next(state, restore_preferred(_leadership(state), live))


def alter_isr(
    state: PartitionRecord,
    *,
    broker_id: int,
    leader_epoch: int,
    partition_epoch: int,
    isr: Sequence[int],
    live: Collection[int],
    where: str,
) -> PartitionRecord:
    """The state after the leader's AlterIsr, or StateRefusedError (the message names the current
    epochs, so the leader knows it is behind). `where` names the partition in messages."""
    if broker_id != state.leader:
        raise StateRefusedError(
            ErrorCode.FAILED_PRECONDITION,
            f"{where}: broker {broker_id} is not the leader (the leader is {state.leader} at leader epoch "
            f"{state.leader_epoch})",
        )
    if leader_epoch != state.leader_epoch or partition_epoch != state.partition_epoch:
        raise StateRefusedError(
            ErrorCode.FAILED_PRECONDITION,
            f"{where}: stale epochs (leader_epoch {leader_epoch}, partition_epoch {partition_epoch}); the current "
            f"are leader_epoch {state.leader_epoch}, partition_epoch {state.partition_epoch}",
        )
    members = set(isr)
    if len(members) != len(isr):
        raise StateRefusedError(ErrorCode.INVALID_ARGUMENT, f"isr: {list(isr)} names a broker twice")
    if broker_id not in members:
        raise StateRefusedError(
            ErrorCode.INVALID_ARGUMENT, f"isr: {list(isr)} must include the leader {broker_id}"
        )
    outside = sorted(members - set(state.replicas))
    if outside:
        raise StateRefusedError(
            ErrorCode.INVALID_ARGUMENT,
            f"isr: brokers {outside} are not replicas of {where} (replicas {list(state.replicas)})",
        )
    dead = sorted(b for b in members - set(state.isr) if b not in live)
    if dead:
        raise StateRefusedError(
            ErrorCode.FAILED_PRECONDITION,
            f"isr: brokers {dead} are not alive (or shutting down) and cannot join the in-sync set of {where}",
        )
    new_isr = _ordered(state.replicas, members)
    if new_isr == state.isr:
        return state
    return replace(state, isr=new_isr, partition_epoch=state.partition_epoch + 1)


def check_reassignment(target: Sequence[int], live: Collection[int], *, field: str = "replicas") -> None:
    """StateRefusedError(INVALID_ARGUMENT) unless `target` is a non-empty list of distinct live brokers."""
    if not target:
        raise StateRefusedError(ErrorCode.INVALID_ARGUMENT, f"{field}: name at least one broker")
    if len(target) > limits.REPLICATION_FACTOR_MAX:
        raise StateRefusedError(
            ErrorCode.INVALID_ARGUMENT,
            f"{field}: at most {limits.REPLICATION_FACTOR_MAX} replicas (replication_factor's limit), got {len(target)}",
        )
    duplicates = sorted(b for b, n in Counter(target).items() if n > 1)
    if duplicates:
        raise StateRefusedError(ErrorCode.INVALID_ARGUMENT, f"{field}: brokers {duplicates} are named twice")
    dead = [b for b in target if b not in live]
    if dead:
        raise StateRefusedError(
            ErrorCode.INVALID_ARGUMENT,
            f"{field}: brokers {dead} are not live brokers (live: {sorted(live)})",
        )


def reassignment_started(state: PartitionRecord, target: Sequence[int]) -> PartitionRecord:
    """The new replicas added as followers (the target's order first, then those leaving)."""
    replicas = (*target, *(b for b in state.replicas if b not in target))
    if replicas == state.replicas:
        return state
    return replace(state, replicas=tuple(replicas), partition_epoch=state.partition_epoch + 1)


def reassignment_ready(state: PartitionRecord, target: Sequence[int]) -> bool:
    """Every target replica is in sync: the old ones may go."""
    return set(target) <= set(state.isr)


def reassignment_finished(state: PartitionRecord, target: Sequence[int], live: Collection[int]) -> PartitionRecord:
    """replicas = target; call once reassignment_ready. Who leads, in order:
      1. the preferred replica (the target's first) when it is alive and in sync: the operator chose
         it, and an in-sync replica holds every acknowledged record (Kafka's controller elects it
         once a reassignment is in sync);
      2. else the current leader when it stays a replica (no needless change; the preferred-leader
         check moves it once the preferred replica can lead);
      3. else the first live in-sync target replica, or none (offline)."""
    replicas = tuple(target)
    isr = _ordered(replicas, set(state.isr))
    leader, leader_epoch = state.leader, state.leader_epoch
    preferred = replicas[0]
    if preferred != leader and preferred in isr and preferred in live:
        leader, leader_epoch = preferred, leader_epoch + 1
    elif leader not in replicas:
        elected = elect_leader(replicas, isr, live)
        elected_or_none = NO_LEADER if elected is None else elected
        if elected_or_none != leader:  # an offline partition staying offline keeps its epoch
            leader, leader_epoch = elected_or_none, leader_epoch + 1
    after = PartitionRecord(replicas, isr, leader, leader_epoch, state.partition_epoch)
    if after == state:
        return state
    return replace(after, partition_epoch=state.partition_epoch + 1)
