"""Idempotent-producer state of one partition: de-duplication and sequence checks.

For every producer id the log keeps its current epoch and the metadata of its last
`MAX_BATCHES_PER_PRODUCER` (5, like Kafka) batches: (first_seq, last_seq, base_offset, last_offset,
append_time_ms). A produce of an idempotent batch (producer_id >= 0) is checked like this:

  1. epoch <  current epoch      -> ProducerFencedError (a newer instance owns the producer id)
  2. epoch >  current epoch      -> accepted only if base_sequence == 0 (a new epoch restarts at 0)
  3. same epoch, (first_seq, last_seq) equal to one of the cached batches, or last_seq equal
     and the cached first_seq within first_seq..last_seq (the broker stored that batch without
     its duplicate transaction ids, see record_ids.py)
                                 -> duplicate: answered with that batch's original offsets,
                                    nothing written
  4. same epoch, first_seq == last cached last_seq + 1 (wrapping at 2**31-1 to 0) -> accepted
  5. otherwise                   -> OutOfOrderSequenceError (a gap: records were lost; or an old
                                    retry no longer in the cache)
  An unknown producer id is accepted with any sequence (its state may have expired or been
  removed with old segments, as in Kafka).

Persistence: a snapshot file `<offset:020d>.snapshot` holds the state as of log offset `offset`
(every batch below it applied). Written when a segment rolls and on close. On open the newest
snapshot at or below the log end is loaded and the batch headers from its offset to the log end
are replayed (`replay`), which rebuilds the state after a crash without trusting anything unsynced.

Snapshot format: one JSON document `{"version": 1, "offset": N, "producers": [...]}` followed by a
newline and the CRC32 of the JSON bytes in hex, so a torn snapshot is detected and skipped.
"""

from __future__ import annotations

import json
import os
import zlib
from collections import deque
from dataclasses import dataclass, field

from dmq.broker.log.errors import InvalidBatchError, OutOfOrderSequenceError, ProducerFencedError

__all__ = ["BatchMetadata", "ProducerEntry", "ProducerStateManager", "MAX_BATCHES_PER_PRODUCER"]

MAX_BATCHES_PER_PRODUCER = 5
INT32_MAX = 2**31 - 1
SNAPSHOT_SUFFIX = ".snapshot"
_SNAPSHOT_VERSION = 1


def last_sequence(base_sequence: int, record_count: int) -> int:
    """Sequence of a batch's last record; sequences wrap from INT32_MAX to 0 (as in Kafka)."""
    last = base_sequence + record_count - 1
    return last - INT32_MAX - 1 if last > INT32_MAX else last


def _next_sequence(seq: int) -> int:
    return 0 if seq == INT32_MAX else seq + 1


@dataclass(slots=True, frozen=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int
    append_time_ms: int


@dataclass(slots=True)
class ProducerEntry:
    producer_id: int
    epoch: int
    last_append_ms: int
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=MAX_BATCHES_PER_PRODUCER))

    @property
    def last_seq(self) -> int | None:
        return self.batches[-1].last_seq if self.batches else None


class ProducerStateManager:
    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}

    def __repr__(self) -> str:
        return f"ProducerStateManager(producers={len(self.producers)})"

    def __len__(self) -> int:
        return len(self.producers)

    def check(
        self, producer_id: int, epoch: int, base_sequence: int, record_count: int, *, where: str = ""
    ) -> BatchMetadata | None:
        """Validate an incoming batch; the original batch's metadata if it is a duplicate, else None.

        Raises ProducerFencedError / OutOfOrderSequenceError / InvalidBatchError (see module doc).
        """
        if producer_id < 0:
            return None
        if epoch < 0 or base_sequence < 0:
            raise InvalidBatchError(
                f"{where}batch has producer_id {producer_id} but producer_epoch {epoch} and "
                f"base_sequence {base_sequence}: an idempotent batch needs both >= 0"
            )
        entry = self.producers.get(producer_id)
        if entry is None:
            return None
        if epoch < entry.epoch:
            raise ProducerFencedError(
                f"{where}producer {producer_id} epoch {epoch} is fenced: the current epoch is "
                f"{entry.epoch} (another producer instance with this id took over); close this producer"
            )
        if epoch > entry.epoch:
            if base_sequence != 0:
                raise OutOfOrderSequenceError(
                    f"{where}producer {producer_id} started epoch {epoch} at sequence {base_sequence}; "
                    f"a new epoch must start at sequence 0"
                )
            return None
        last_seq = last_sequence(base_sequence, record_count)
        for b in entry.batches:
            if b.last_seq == last_seq and (b.first_seq - base_sequence) % (INT32_MAX + 1) < record_count:
                return b
        current = entry.last_seq
        if current is None or base_sequence == _next_sequence(current):
            return None
        oldest = entry.batches[0].first_seq
        if oldest <= base_sequence <= current:
            raise OutOfOrderSequenceError(
                f"{where}producer {producer_id} epoch {epoch}: sequence {base_sequence}..{last_seq} "
                f"overlaps batches already written but matches none of them (cached: "
                f"{[(b.first_seq, b.last_seq) for b in entry.batches]})"
            )
        if base_sequence < oldest and current >= oldest:
            raise OutOfOrderSequenceError(
                f"{where}producer {producer_id} epoch {epoch}: sequence {base_sequence} is older than the "
                f"last {MAX_BATCHES_PER_PRODUCER} batches kept for de-duplication (oldest {oldest}); "
                f"it was probably written already - the producer retried too late"
            )
        raise OutOfOrderSequenceError(
            f"{where}producer {producer_id} epoch {epoch}: expected sequence {_next_sequence(current)}, "
            f"got {base_sequence}: records in between were never written (a batch was lost); "
            f"the producer must bump its epoch or restart"
        )

    def awaits_predecessor(self, producer_id: int, epoch: int, base_sequence: int, record_count: int) -> bool:
        """Whether the batch follows a gap in its producer's sequence (same epoch, known producer)
        that batches still on their way may fill: a producer with several Produce requests in
        flight for this partition (max_in_flight_requests_per_connection > 1) may have them
        arrive, or reach the append, in another order than it sent them. The Broker servicer
        holds such a batch for a bounded time (dmq.broker.sequence_gate) instead of answering
        OUT_OF_ORDER_SEQUENCE at once. A duplicate or an old retry is not ahead."""
        if producer_id < 0 or base_sequence < 0:
            return False
        # Lock-free reads (PartitionLog.awaits_predecessor): a dict lookup and a tuple() copy of
        # the deque are each atomic under the GIL, while an append thread may update the entry.
        entry = self.producers.get(producer_id)
        if entry is None or epoch != entry.epoch:
            return False
        batches = tuple(entry.batches)
        if not batches:
            return False
        last_seq = last_sequence(base_sequence, record_count)
        for b in batches:
            if b.last_seq == last_seq and (b.first_seq - base_sequence) % (INT32_MAX + 1) < record_count:
                return False  # a duplicate: answered with its original offset at once
        gap = (base_sequence - _next_sequence(batches[-1].last_seq)) % (INT32_MAX + 1)
        # ahead by less than half the sequence space (sequences wrap); further "ahead" is an old
        # retry from behind, refused at once
        return 0 < gap <= INT32_MAX // 2

    def update(
        self,
        producer_id: int,
        epoch: int,
        base_sequence: int,
        record_count: int,
        base_offset: int,
        last_offset: int,
        append_time_ms: int,
    ) -> None:
        """Record an appended batch (no checks: also used to replay the log)."""
        if producer_id < 0:
            return
        entry = self.producers.get(producer_id)
        if entry is None or epoch > entry.epoch:
            entry = ProducerEntry(producer_id, epoch, append_time_ms)
            self.producers[producer_id] = entry
        elif epoch < entry.epoch:
            return  # replaying a fenced producer's old batch cannot change the state
        entry.batches.append(
            BatchMetadata(base_sequence, last_sequence(base_sequence, record_count), base_offset, last_offset, append_time_ms)
        )
        entry.last_append_ms = max(entry.last_append_ms, append_time_ms)

    def truncate(self, offset: int) -> int:
        """Forget the batches at or above `offset` (the log was cut back there). A producer left
        with no batch is forgotten (it is then accepted with any sequence, as after expiry): its
        epoch may have come from a removed batch. Returns how many batches were forgotten."""
        removed = 0
        for pid in list(self.producers):
            entry = self.producers[pid]
            kept = [b for b in entry.batches if b.last_offset < offset]
            if len(kept) == len(entry.batches):
                continue
            removed += len(entry.batches) - len(kept)
            if not kept:
                del self.producers[pid]
                continue
            entry.batches.clear()
            entry.batches.extend(kept)
        return removed

    def expire(self, now_ms: int, expiration_ms: int) -> int:
        """Forget producers idle for longer than expiration_ms; returns how many."""
        if expiration_ms < 0:
            return 0
        dead = [pid for pid, e in self.producers.items() if now_ms - e.last_append_ms > expiration_ms]
        for pid in dead:
            del self.producers[pid]
        return len(dead)

    # -- snapshots -----------------------------------------------------------------------------

    def to_bytes(self, offset: int) -> bytes:
        doc = {
            "version": _SNAPSHOT_VERSION,
            "offset": offset,
            "producers": [
                {
                    "pid": e.producer_id,
                    "epoch": e.epoch,
                    "last_append_ms": e.last_append_ms,
                    "batches": [
                        [b.first_seq, b.last_seq, b.base_offset, b.last_offset, b.append_time_ms] for b in e.batches
                    ],
                }
                for e in self.producers.values()
            ],
        }
        body = json.dumps(doc, separators=(",", ":")).encode()
        return body + b"\n" + f"{zlib.crc32(body):08x}\n".encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> tuple[int, ProducerStateManager]:
        """(offset, state); ValueError if torn or corrupt."""
        body, sep, tail = data.rstrip(b"\n").rpartition(b"\n")
        if not sep or f"{zlib.crc32(body):08x}".encode() != tail:
            raise ValueError("producer state snapshot: CRC mismatch or truncated")
        doc = json.loads(body)
        if doc.get("version") != _SNAPSHOT_VERSION:
            raise ValueError(f"producer state snapshot: unknown version {doc.get('version')}")
        state = cls()
        for p in doc["producers"]:
            entry = ProducerEntry(int(p["pid"]), int(p["epoch"]), int(p["last_append_ms"]))
            for fs, ls, bo, lo, t in p["batches"]:
                entry.batches.append(BatchMetadata(int(fs), int(ls), int(bo), int(lo), int(t)))
            state.producers[entry.producer_id] = entry
        return int(doc["offset"]), state


def snapshot_path(directory: str, offset: int) -> str:
    return os.path.join(directory, f"{offset:020d}{SNAPSHOT_SUFFIX}")


def list_snapshots(directory: str) -> list[int]:
    """Offsets of the snapshot files in a partition directory, ascending."""
    out = []
    for name in os.listdir(directory):
        if name.endswith(SNAPSHOT_SUFFIX):
            stem = name[: -len(SNAPSHOT_SUFFIX)]
            if stem.isdigit():
                out.append(int(stem))
    return sorted(out)
