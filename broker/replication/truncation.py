"""Where a replica's log stops agreeing with the leader's: the offset it truncates to.

KIP-101 with KIP-279's iteration. The replica names its latest epoch E; the leader answers with
the largest epoch it knows at or below E and where that epoch ends in its log. If the leader
knows the same epoch, the logs agree up to the smaller of the two ends. If the leader's answer is
an older epoch, the replica's records of epochs the leader never saw are not the leader's history:
the replica looks up where *that* older epoch ends in its own log; if it has that epoch too, the
logs agree up to the smaller end, else it asks again with its largest epoch below the leader's.

Truncating to the high watermark alone (Kafka before KIP-101) could lose acknowledged records or
let replicas diverge after two quick leader changes; the epoch comparison cannot.
"""

from __future__ import annotations

from collections.abc import Callable

from .epochs import UNDEFINED_EPOCH, LeaderEpochCache


def truncation_offset(
    replica: LeaderEpochCache,
    log_end_offset: int,
    leader_end_for: Callable[[int], tuple[int, int]],
    *,
    high_watermark: int,
    max_rounds: int = 64,
) -> int:
    """The offset the replica's log must end at to be a prefix of the leader's.

    `leader_end_for(epoch)` is the leader's OffsetForLeaderEpoch answer (its
    `LeaderEpochCache.end_offset_for(epoch, its log end)`). `high_watermark` is the replica's last
    known high watermark, the fallback when the two share no known epoch (the leader's history
    was trimmed by retention past it): everything below it is committed and therefore common.
    """
    if log_end_offset <= 0:
        return 0
    epoch = replica.latest_epoch
    for _ in range(max_rounds):
        if epoch == UNDEFINED_EPOCH:
            return min(high_watermark, log_end_offset)
        leader_epoch, leader_end = leader_end_for(epoch)
        if leader_epoch == UNDEFINED_EPOCH:
            return min(high_watermark, log_end_offset)
        own_epoch, own_end = replica.end_offset_for(leader_epoch, log_end_offset)
        if own_epoch == leader_epoch:
            return min(leader_end, own_end, log_end_offset)
        # the replica lacks the leader's epoch: ask about the newest epoch it has below it
        epoch = own_epoch
    raise RuntimeError(f"no common epoch found in {max_rounds} rounds (replica {replica!r})")
