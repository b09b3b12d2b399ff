"""Leader election for replicated partitions: the controller's rules, pure (DESIGN.md
"Replication"; the metadata service is the controller).

- A new leader comes from the in-sync set, in the order of the replica list (so the preferred
  replica, the first, wins whenever it can), and must be alive.
- Outside the in-sync set only if the topic allows unclean election: that replica may lack
  acknowledged records, so it is the operator's explicit trade of durability for availability.
- When the leader's broker fails, it leaves the in-sync set, unless it is the last member: then
  the set keeps it and the partition stays offline until it returns (or an unclean election),
  because no other replica is known to hold everything acknowledged.
- Every change of leader bumps the leader epoch.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class PartitionLeadership:
    replicas: tuple[int, ...]
    isr: frozenset[int]
    leader: int | None  # None: offline
    leader_epoch: int

    @property
    def preferred(self) -> int:
        return self.replicas[0]


def elect_leader(
    replicas: Sequence[int], isr: Collection[int], live: Collection[int], *, unclean: bool = False
) -> int | None:
    """The replica to lead, or None if none may (the partition is offline)."""
    for r in replicas:
        if r in isr and r in live:
            return r
    if unclean:
        for r in replicas:
            if r in live:
                return r
    return None


def on_broker_failed(state: PartitionLeadership, broker: int, live: Collection[int], *, unclean: bool = False) -> PartitionLeadership:
    """The controller's answer to `broker` dying (missed session or clean shutdown)."""
    if broker not in state.replicas:
        return state
    isr = state.isr - {broker} if len(state.isr) > 1 else state.isr
    if state.leader != broker:
        return replace(state, isr=frozenset(isr))
    live_now = set(live) - {broker}
    leader = elect_leader(state.replicas, isr, live_now, unclean=unclean)
    if leader is not None and leader not in isr:  # unclean: the new leader's log is the truth
        isr = frozenset({leader})
    return PartitionLeadership(state.replicas, frozenset(isr), leader, state.leader_epoch + 1)


def on_broker_back(state: PartitionLeadership, broker: int, live: Collection[int]) -> PartitionLeadership:
    """An offline partition whose last in-sync replica returned gets it back as leader."""
    if state.leader is not None or broker not in state.isr:
        return state
    leader = elect_leader(state.replicas, state.isr, set(live) | {broker})
    if leader is None:
        return state
    return replace(state, leader=leader, leader_epoch=state.leader_epoch + 1)


def restore_preferred(state: PartitionLeadership, live: Collection[int]) -> PartitionLeadership:
    """Preferred-leader rebalancing: hand leadership back to the first replica once it is alive
    and in sync."""
    p = state.preferred
    if state.leader == p or p not in state.isr or p not in live:
        return state
    return replace(state, leader=p, leader_epoch=state.leader_epoch + 1)


def place_replicas(
    partitions: int, replication_factor: int, brokers: Sequence[int], racks: dict[int, str] | None = None, *, start: int = 0
) -> dict[int, tuple[int, ...]]:
    """Replica lists for `partitions` partitions: leaders spread round-robin from `start`, the
    followers of each on the next brokers, skipping a broker whose rack already holds a replica
    of that partition while another rack is free (Kafka's rack-aware assignment, simplified)."""
    if not brokers:
        raise ValueError("no live brokers to place replicas on")
    if not 1 <= replication_factor <= len(brokers):
        raise ValueError(f"replication_factor {replication_factor} must be 1..{len(brokers)} (live brokers)")
    racks = racks or {}
    ordered = sorted(brokers)
    n = len(ordered)
    out: dict[int, tuple[int, ...]] = {}
    for p in range(partitions):
        first = (start + p) % n
        chosen = [ordered[first]]
        # the follower offset shifts with each round of partitions so that pairs vary
        shift = 1 + (p // n) % max(n - 1, 1)
        candidates = [ordered[(first + shift + k) % n] for k in range(n)]
        candidates = [b for b in dict.fromkeys(candidates) if b not in chosen]
        while len(chosen) < replication_factor:
            used = {racks.get(b) for b in chosen}
            free_rack = [b for b in candidates if racks.get(b) not in used]
            pick = free_rack[0] if free_rack and racks else candidates[0]
            chosen.append(pick)
            candidates.remove(pick)
        out[p] = tuple(chosen)
    return out
