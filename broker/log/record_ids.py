"""The append path of batches whose records carry transaction ids or trace ids, and trace lookups.

Part of PartitionLog (it works under the log's lock on its state), kept apart so that the path
of every other batch stays as it was: PartitionLog.append sends a batch here only when its
attribute bits 5 or 6 say some record carries a ``dmq.txn`` header or a trace id (a W3C
``traceparent`` header, or the older ``dmq.trace``; set by the encoder, see dmq.proto.records);
those batches alone are decoded on the broker.

A batch with transaction ids (de-duplication on, see dedup.py), record by record:
  1. its id was stored within the window (or earlier in this batch): a duplicate, answered with
     the original's offset and not written;
  2. otherwise the record is stored.
Three outcomes for the batch:
  - nothing duplicate: written as it came (the common case: no re-encoding);
  - all duplicate: nothing written; an idempotent producer's sequence still advances (in memory
    and in the next snapshot; after a crash before that, its next batch gets
    OUT_OF_ORDER_SEQUENCE and the producer bumps its epoch, which loses nothing);
  - mixed: the broker re-encodes the batch without the duplicates. Why here and not in the
    client (one record per batch): a client cannot know which records are duplicates, and
    single-record batches would cost every transactional producer most of its throughput,
    while re-encoding costs only the rare batch that holds a duplicate. The re-encoded batch
    keeps the producer id and epoch and takes base_sequence = the original's last sequence -
    (stored - 1), so the producer's sequence continues after it exactly as after the original;
    ProducerStateManager.check recognises a retry of the original (same last sequence, first
    sequence at or before the stored one) as a duplicate.
The answer then carries every record's offset (AppendInfo.record_offsets, ProduceResponse
record_offsets): stored ones in order from the written batch's base offset, duplicates at their
originals. A retry of an idempotent batch is answered the same way, from the transaction ids.

Trace ids (records.trace_ids: the traceparent's trace-id, else the dmq.trace value): after the
write, the traced records of the batch are added to the active segment's trace index
(trace_index.py). A lookup reads the trace index of every segment and keeps the
candidate records that do carry the trace id.
"""

from __future__ import annotations

import os
import threading
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from dmq.broker.log.append_info import AppendInfo
from dmq.broker.log.dedup import TransactionIds
from dmq.broker.log.errors import LogError
from dmq.broker.log.producer_state import BatchMetadata
from dmq.broker.log.trace_index import trace_hash
from dmq.proto.records import (
    ATTR_HAS_TRACE_IDS,
    ATTR_HAS_TXN_IDS,
    TXN_HEADER,
    BatchHeader,
    RecordBatch,
    RecordsError,
    decode,
    encode,
    read_header,
    record_ids,
    trace_ids,
)

if TYPE_CHECKING:  # pragma: no cover
    from dmq.broker.log.partition import PartitionLog

__all__ = ["RecordIds"]

_SEQ_MOD = 2**31  # sequences wrap from 2**31-1 to 0


def _offsets_if_shifted(offsets: list[int], base: int) -> list[int] | None:
    """None when record i is simply at base + i (the answer then needs no list)."""
    return None if offsets == list(range(base, base + len(offsets))) else offsets


class RecordIds:
    """One partition's transaction-id map (built on first use) and its id-carrying appends."""

    __slots__ = ("txn", "warned_evictions", "_lookup_lock")

    def __init__(self) -> None:
        self.txn: TransactionIds | None = None
        self.warned_evictions = 0
        # One trace lookup at a time per partition: the first one loads (and may rebuild) the
        # sealed segments' trace indexes outside the partition lock, so appends go on meanwhile.
        self._lookup_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"RecordIds(txn={self.txn!r})"

    # -- append ----------------------------------------------------------------------------------

    def append(
        self, plog: PartitionLog, batch: bytes | bytearray | memoryview, view: memoryview, h: BatchHeader, *, hold: bool
    ) -> tuple[AppendInfo, int]:
        cfg = plog.config
        # Outside the lock: decoding is the costly part. The CRC was checked by validate_batch.
        decoded = decode(view, verify_crc=False, max_batch_bytes=cfg.max_batch_bytes)
        txns = None
        if h.attributes & ATTR_HAS_TXN_IDS and cfg.dedup_window_ms > 0:
            txns = record_ids(decoded, TXN_HEADER, "transaction_id")
        traces = trace_ids(decoded) if h.attributes & ATTR_HAS_TRACE_IDS else None
        n = h.record_count
        with plog._lock:
            plog._check_writable()
            dup = plog._producers.check(
                h.producer_id, h.producer_epoch, h.base_sequence, n, where=plog._where
            )
            if dup is not None:
                offsets = self._retry_offsets(txns, dup) if txns is not None else None
                info = AppendInfo(dup.base_offset, dup.last_offset, dup.append_time_ms, True, offsets)
                return info, plog._rollback_epoch
            # record index -> its original's offset (>= 0), or -(j + 1): the same id as record j
            duplicates: dict[int, int] = {}
            ids = None
            if txns is not None:
                ids = self._txn_ids(plog)
                known = ids.entries
                first_at: dict[str, int] = {}
                for i, t in enumerate(txns):
                    if t is None:
                        continue
                    entry = known.get(t)
                    if entry is not None:
                        duplicates[i] = entry[0]
                    elif t in first_at:
                        duplicates[i] = -(first_at[t] + 1)
                    else:
                        first_at[t] = i
            if not duplicates:  # the common case: the batch is written as it came
                info = plog._write_locked(batch, view, h, hold)
                stored = range(info.base_offset, info.base_offset + n)
                if ids is not None and txns is not None:
                    self._remember(plog, ids, zip(txns, stored), info.append_time_ms)
                if traces is not None:
                    self._index_traces(plog, zip(traces, stored))
                return info, plog._rollback_epoch
            kept = [i for i in range(n) if i not in duplicates]
            if kept:
                info = self._write_kept(plog, decoded, h, kept, hold)
            else:
                info = self._all_duplicates(plog, h)
            offsets = [0] * n
            for rank, i in enumerate(kept):
                offsets[i] = info.base_offset + rank
            for i, o in duplicates.items():  # in record order: a batch's first copy precedes the others
                offsets[i] = o if o >= 0 else offsets[-o - 1]
            if ids is not None and txns is not None:
                self._remember(plog, ids, ((txns[i], offsets[i]) for i in kept), info.append_time_ms)
            if traces is not None and kept:
                self._index_traces(plog, ((traces[i], offsets[i]) for i in kept))
            if kept:
                info = AppendInfo(info.base_offset, info.last_offset, info.append_time_ms, False, offsets)
            else:  # durable once the originals are: wait_durable(last_offset + 1)
                info = AppendInfo(min(offsets), max(offsets), info.append_time_ms, True, offsets)
            return info, plog._rollback_epoch

    def append_replica(self, plog: PartitionLog, batch: memoryview, h: BatchHeader) -> None:
        """A follower's append of a leader's batch (PartitionLog.append_replica): written as it
        is, every record stored (the leader removed duplicates already); its transaction ids
        remembered (when the map is built) and its trace ids indexed, as for a leader's append."""
        cfg = plog.config
        decoded = decode(batch, verify_crc=False, max_batch_bytes=max(cfg.max_batch_bytes, len(batch)))
        txns = None
        if h.attributes & ATTR_HAS_TXN_IDS and cfg.dedup_window_ms > 0:
            txns = record_ids(decoded, TXN_HEADER, "transaction_id")
        traces = trace_ids(decoded) if h.attributes & ATTR_HAS_TRACE_IDS else None
        with plog._lock:
            info = plog._write_replica_locked(batch, h)
            stored = range(info.base_offset, info.base_offset + h.record_count)
            if txns is not None:
                self._remember(plog, self._txn_ids(plog), zip(txns, stored), info.append_time_ms)
            if traces is not None:
                self._index_traces(plog, zip(traces, stored))

    def _write_kept(
        self, plog: PartitionLog, decoded: RecordBatch, h: BatchHeader, kept: list[int], hold: bool
    ) -> AppendInfo:
        """Re-encode the batch with the records in `kept` only and write it (see the module doc)."""
        values, keys, headers, times = decoded.values(), decoded.keys(), decoded.headers(), decoded.timestamps()
        n = h.record_count
        seq = -1
        if h.producer_id >= 0:
            seq = (h.base_sequence + n - len(kept)) % _SEQ_MOD
        data = encode(
            [values[i] for i in kept],
            [keys[i] for i in kept],
            [headers[i] for i in kept],
            [times[i] for i in kept],
            codec=h.codec,
            producer_id=h.producer_id,
            producer_epoch=h.producer_epoch,
            base_sequence=seq,
            max_record_bytes=plog.config.max_batch_bytes,  # each record was accepted already
            max_batch_bytes=plog.config.max_batch_bytes,
        )
        return plog._write_locked(data, memoryview(data), read_header(data), hold)

    def _all_duplicates(self, plog: PartitionLog, h: BatchHeader) -> AppendInfo:
        """Nothing to write; an idempotent producer's sequence advances all the same."""
        now = max(plog._clock(), plog._last_append_ms)
        end = plog.log_end_offset
        if h.producer_id >= 0:
            plog._before_change()  # the clean-shutdown marker's producer state is stale now
            plog._producers.update(h.producer_id, h.producer_epoch, h.base_sequence, h.record_count, end, end - 1, now)
        return AppendInfo(end, end - 1, now, True)

    def _retry_offsets(self, txns: Sequence[str | None], dup: BatchMetadata) -> list[int] | None:
        """Every record's offset for a retried batch: its transaction ids say which records the
        stored batch (dup) holds; an id no longer known counts as stored."""
        ids = self.txn
        offsets = []
        seen: set[str] = set()
        rank = 0
        for t in txns:
            o = None if t is None or ids is None else ids.get(t)
            if o is None or (dup.base_offset <= o <= dup.last_offset and t not in seen):
                offsets.append(dup.base_offset + rank)
                rank += 1
            else:
                offsets.append(o)
            if t is not None:
                seen.add(t)
        return _offsets_if_shifted(offsets, dup.base_offset)

    def _remember(
        self, plog: PartitionLog, ids: TransactionIds, stored: Iterable[tuple[str | None, int]], now: int
    ) -> None:
        """Add the stored records' ids ((id or None, offset) each) to the map."""
        evicted_time = ids.add_all(stored, now)
        if evicted_time is not None and ids.evicted >= self.warned_evictions * 2:
            # logged at 1, 2, 4, 8 ... evictions: visible, never a flood
            self.warned_evictions = max(1, ids.evicted)
            plog._log.warning(
                "transaction-id cap reached: oldest ids forgotten before their window ended",
                max_entries=ids.max_entries,
                effective_window_ms=now - evicted_time,
                dedup_window_ms=ids.window_ms,
                evicted=ids.evicted,
            )

    @staticmethod
    def _index_traces(plog: PartitionLog, stored: Iterable[tuple[str | None, int]]) -> None:
        """Add the stored records' trace ids ((id or None, offset) each) to the active segment's index."""
        seg = plog._segments[-1]  # the batch just written is in the active segment
        index = seg.trace_index
        if not index.loaded:
            seg.trace_ready()  # catches up from the log, this batch included
            return
        base = seg.base_offset
        index.add(((trace_hash(t), o - base) for t, o in stored if t is not None), seg.next_offset - base)

    # -- the transaction-id map ------------------------------------------------------------------

    def _txn_ids(self, plog: PartitionLog) -> TransactionIds:
        """The map, expired to now; built from the log's last window on first use (under the lock)."""
        cfg = plog.config
        now = max(plog._clock(), plog._last_append_ms)
        ids = self.txn
        if ids is None or ids.window_ms != cfg.dedup_window_ms or ids.max_entries != cfg.dedup_max_entries:
            ids = self.txn = TransactionIds(cfg.dedup_window_ms, cfg.dedup_max_entries)
            start = plog.offset_for_time(now - cfg.dedup_window_ms)
            if start is not None:
                self._rebuild(plog, ids, start)
        ids.expire(now)
        return ids

    @staticmethod
    def _rebuild(plog: PartitionLog, ids: TransactionIds, start: int) -> None:
        """Add the ids of the records from `start` to the log end: batch headers walked, only the
        batches flagged with transaction ids read and decoded; append times from the time index."""
        stored = 0
        segs = plog._segments
        for seg in segs[max(bisect_right(plog._bases, start) - 1, 0):]:
            seg.ensure_indexes()
            times, rels = seg.time_index.times, seg.time_index.rel_offsets
            fd = seg.fd()
            for pos, h in seg.iter_headers(max(start, seg.base_offset)):
                if not h[4] & ATTR_HAS_TXN_IDS:
                    continue
                try:
                    txns = record_ids(decode(os.pread(fd, 12 + h[1], pos)), TXN_HEADER, "transaction_id")
                except RecordsError as e:  # damage: the read path reports it
                    plog._log.warning("transaction ids of a batch not loaded", position=pos, error=str(e))
                    continue
                j = bisect_right(rels, h[0] - seg.base_offset) - 1
                t_ms = times[j] if j >= 0 else plog._last_append_ms
                for i, t in enumerate(txns):
                    if t is not None:
                        ids.add(t, h[0] + i, t_ms)
                        stored += 1
        plog._log.info("transaction ids loaded from the log", from_offset=start, ids=len(ids), records=stored)

    def truncate(self, offset: int) -> None:
        if self.txn is not None:
            self.txn.truncate(offset)

    # -- trace lookups ---------------------------------------------------------------------------

    def find_trace(self, plog: PartitionLog, trace_id: str, max_records: int) -> tuple[list[tuple[int, bytes]], bool]:
        """([(offset, the batch holding it)], truncated) of the records carrying trace_id, ascending,
        at most max_records. Batches not yet visible to readers are left out.

        The active segment's index is read under the partition lock (appends write it); sealed
        segments never change, so theirs are loaded (a first lookup may index a segment from its
        log) outside it: appends to the partition are not held up meanwhile."""
        candidates = []
        with self._lookup_lock:
            with plog._lock:
                segs = list(plog._segments)
                active = segs[-1]
                candidates += [active.base_offset + r for r in active.trace_ready().lookup(trace_id)]
            for seg in segs[:-1]:
                try:
                    rels = seg.trace_ready().lookup(trace_id)
                except (OSError, LogError):  # deleted by retention meanwhile, or unreadable
                    continue
                candidates += [seg.base_offset + r for r in rels]
        out: list[tuple[int, bytes]] = []
        batches: dict[int, tuple[bytes, list[str | None]]] = {}  # by base offset
        for offset in sorted(candidates):
            if offset < plog.log_start_offset:
                continue
            found = next(((b, d) for b, d in batches.items() if b <= offset < b + len(d[1])), None)
            if found is None:
                try:
                    data = plog.read(offset, 1)
                except LogError:  # removed by retention meanwhile, or damaged (already reported)
                    continue
                if not data:
                    continue  # beyond what readers see yet
                try:
                    batch = decode(data)
                    traces = trace_ids(batch)
                except RecordsError:
                    continue
                raw = data[: batch.header.total_size]
                found = (batch.base_offset, (raw, traces))
                batches[batch.base_offset] = found[1]
            base, (raw, traces) = found
            i = offset - base
            if 0 <= i < len(traces) and traces[i] == trace_id:
                if len(out) == max_records:
                    return out, True
                out.append((offset, raw))
        return out, False
