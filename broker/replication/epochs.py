"""The leader-epoch cache of one replica: for each leader epoch, the first offset written in it.

Kafka's LeaderEpochFileCache (KIP-101). A leader appends under its epoch; the first append of a
new epoch records (epoch, start offset). With it a replica can say, for any epoch, where that
epoch's records ended in its own log ("end offset for epoch": the start of the next epoch, or the
log end for the latest), which is what truncation after a leader change compares (truncation.py).

Invariant: entries strictly increase in both epoch and start offset. An assignment that breaks it
(a newer epoch starting at or before an older one's start, after the log was truncated) drops the
entries it contradicts, as Kafka does.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


@dataclass(frozen=True, slots=True)
class EpochEntry:
    epoch: int
    start_offset: int


class LeaderEpochCache:
    """In memory; the broker persists `entries` in a checkpoint file beside the partition's log."""

    __slots__ = ("_entries",)

    def __init__(self, entries: list[EpochEntry] | None = None) -> None:
        self._entries: list[EpochEntry] = []
        for e in entries or ():
            self.assign(e.epoch, e.start_offset)

    def __repr__(self) -> str:
        return "LeaderEpochCache(" + ", ".join(f"{e.epoch}@{e.start_offset}" for e in self._entries) + ")"

    @property
    def entries(self) -> list[EpochEntry]:
        return list(self._entries)

    @property
    def latest_epoch(self) -> int:
        return self._entries[-1].epoch if self._entries else UNDEFINED_EPOCH

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that `epoch` starts at `start_offset` (the first append of an epoch, or a
        follower copying a leader's batch of a newer epoch). Returns whether anything changed.
        An epoch older than the latest is ignored (a late, stale batch cannot rewrite history)."""
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"epoch {epoch} and start_offset {start_offset} must be >= 0")
        if self._entries:
            last = self._entries[-1]
            if epoch == last.epoch:
                return False  # already known: its start is where it first appeared
            if epoch < last.epoch:
                return False
        # a newer epoch that starts at or before known starts contradicts them: they go
        while self._entries and self._entries[-1].start_offset >= start_offset:
            self._entries.pop()
        self._entries.append(EpochEntry(epoch, start_offset))
        return True

    def epoch_for(self, offset: int) -> int:
        """The epoch under which `offset` was written (UNDEFINED_EPOCH before the first entry)."""
        i = bisect_right([e.start_offset for e in self._entries], offset) - 1
        return self._entries[i].epoch if i >= 0 else UNDEFINED_EPOCH

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(largest known epoch <= `epoch`, the offset where that epoch's records end here).

        The answer a leader gives to OffsetForLeaderEpoch (KIP-279): for the latest epoch the
        end is the log end; for an older one it is the start of the next epoch. An epoch older
        than every entry gives (UNDEFINED_EPOCH, UNDEFINED_OFFSET)."""
        if not self._entries or epoch < self._entries[0].epoch:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if epoch >= self._entries[-1].epoch:
            return self._entries[-1].epoch, log_end_offset
        i = bisect_right([e.epoch for e in self._entries], epoch) - 1
        return self._entries[i].epoch, self._entries[i + 1].start_offset

    def truncate_from_end(self, end_offset: int) -> None:
        """The log was cut to end at `end_offset`: epochs starting at or after it are gone."""
        while self._entries and self._entries[-1].start_offset >= end_offset:
            self._entries.pop()

    def truncate_from_start(self, start_offset: int) -> None:
        """The log now starts at `start_offset` (retention): entries wholly before it go, and
        the epoch covering it starts there."""
        keep = [e for e in self._entries if e.start_offset >= start_offset]
        before = [e for e in self._entries if e.start_offset < start_offset]
        if before and (not keep or keep[0].start_offset > start_offset):
            keep.insert(0, EpochEntry(before[-1].epoch, start_offset))
        self._entries = keep
