"""The leader's view of one partition's replicas: followers' positions, the in-sync set, the
high watermark, and whether a produce may be acknowledged.

Rules (Kafka's, DESIGN.md "Replication"):
- A follower's log end is the offset of its latest fetch (it asks for what it does not have).
- A follower is *caught up* at time t if its fetch at t asked for the leader's log end as of
  then, or reached the leader's log end as of its previous fetch (so a follower that keeps pace
  with a steady stream counts as caught up although the leader is always a little ahead).
- The in-sync set (ISR) always holds the leader. A follower leaves it when it has not been
  caught up for `replica_lag_time_max_ms`; it rejoins once its log end reaches the high
  watermark and the start of the leader's current epoch (it has everything the leader
  acknowledged and nothing from an older, possibly diverging history).
- The high watermark is the smallest log end in the ISR, and never moves back on a leader.
- `acks=all` is answered once the high watermark passes the batch, with at least
  `min_insync_replicas` in the set; a produce arriving with fewer is refused up front.

Changes of the ISR are returned to the caller, who must persist them with the controller before
acting on a smaller set (Kafka's AlterPartition): a leader must never count acknowledgements from
a set the controller does not know, or an election could pick a replica that lacks them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(slots=True)
class FollowerState:
    log_end_offset: int = 0
    last_caught_up_ms: int = -1
    last_fetch_ms: int = -1
    leader_end_at_last_fetch: int = 0


class PartitionReplicas:
    """Leader-side replica state of one partition, for one leader epoch."""

    __slots__ = ("leader", "replicas", "isr", "followers", "log_end_offset", "high_watermark", "epoch_start_offset")

    def __init__(
        self,
        leader: int,
        replicas: Iterable[int],
        isr: Iterable[int],
        *,
        log_end_offset: int,
        high_watermark: int,
        epoch_start_offset: int,
        now_ms: int,
    ) -> None:
        self.leader = leader
        self.replicas = tuple(replicas)
        if leader not in self.replicas:
            raise ValueError(f"leader {leader} is not one of the replicas {self.replicas}")
        self.isr = {leader} | {r for r in isr if r in self.replicas}
        # A new leader does not know where its followers are: they count as caught up now (they
        # get replica_lag_time_max_ms to show it) but as holding nothing beyond the high
        # watermark, so the watermark cannot move until they fetch.
        self.followers = {
            r: FollowerState(log_end_offset=high_watermark, last_caught_up_ms=now_ms if r in self.isr else -1)
            for r in self.replicas
            if r != leader
        }
        self.log_end_offset = log_end_offset
        self.high_watermark = min(high_watermark, log_end_offset)
        self.epoch_start_offset = epoch_start_offset

    def __repr__(self) -> str:
        return (
            f"PartitionReplicas(leader={self.leader}, isr={sorted(self.isr)}, leo={self.log_end_offset}, "
            f"hw={self.high_watermark})"
        )

    # -- inputs --------------------------------------------------------------------------------

    def on_append(self, log_end_offset: int) -> bool:
        """The leader appended; returns whether the high watermark moved (an ISR of one)."""
        if log_end_offset < self.log_end_offset:
            raise ValueError(f"leader log end cannot go back ({self.log_end_offset} -> {log_end_offset})")
        self.log_end_offset = log_end_offset
        return self._advance_high_watermark()

    def on_fetch(self, replica: int, fetch_offset: int, now_ms: int) -> tuple[set[int] | None, bool]:
        """A follower fetched from `fetch_offset`. Returns (the new ISR if the follower rejoined,
        whether the high watermark moved)."""
        f = self.followers.get(replica)
        if f is None:
            raise KeyError(f"broker {replica} is not a follower of this partition {self.replicas}")
        if fetch_offset > self.log_end_offset:
            raise ValueError(f"follower {replica} fetched from {fetch_offset}, beyond the log end {self.log_end_offset}")
        if fetch_offset >= self.log_end_offset:
            f.last_caught_up_ms = now_ms
        elif fetch_offset >= f.leader_end_at_last_fetch and f.last_fetch_ms >= 0:
            f.last_caught_up_ms = max(f.last_caught_up_ms, f.last_fetch_ms)
        f.log_end_offset = fetch_offset
        f.last_fetch_ms = now_ms
        f.leader_end_at_last_fetch = self.log_end_offset
        expanded = None
        if (
            replica not in self.isr
            and fetch_offset >= self.high_watermark
            and fetch_offset >= self.epoch_start_offset
        ):
            expanded = self.isr | {replica}
        return expanded, self._advance_high_watermark()

    def lagging(self, now_ms: int, lag_time_max_ms: int) -> set[int]:
        """Followers of the ISR not caught up for longer than lag_time_max_ms (to be removed)."""
        return {
            r for r in self.isr
            if r != self.leader and now_ms - self.followers[r].last_caught_up_ms > lag_time_max_ms
        }

    def set_isr(self, isr: Iterable[int]) -> bool:
        """Apply an ISR the controller accepted. Returns whether the high watermark moved (a
        smaller set can let it advance)."""
        new = set(isr) | {self.leader}
        unknown = new - set(self.replicas)
        if unknown:
            raise ValueError(f"in-sync set {sorted(new)} names non-replicas {sorted(unknown)}")
        self.isr = new
        return self._advance_high_watermark()

    # -- decisions -----------------------------------------------------------------------------

    def enough_replicas(self, min_insync_replicas: int) -> bool:
        return len(self.isr) >= min_insync_replicas

    def acknowledged(self, end_offset: int, min_insync_replicas: int) -> bool | None:
        """For an acks=all batch ending before `end_offset`: True to acknowledge, False to refuse
        (NOT_ENOUGH_REPLICAS: it reached the high watermark with too small a set), None to wait."""
        if self.high_watermark < end_offset:
            return None
        return self.enough_replicas(min_insync_replicas)

    def _advance_high_watermark(self) -> bool:
        ends = [self.log_end_offset] + [self.followers[r].log_end_offset for r in self.isr if r != self.leader]
        hw = min(ends)
        if hw > self.high_watermark:
            self.high_watermark = hw
            return True
        return False
