"""The producer core (dmq.client._producer_core), sans I/O: the decisions Producer and AsyncProducer
share, driven here directly, without a sender, a cluster or a thread."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from dmq.client._accumulator import HEADER_OFFSET_BYTES, MEMORY_CHUNK_BYTES, RECORD_OVERHEAD_BYTES
from dmq.client._cluster import PartitionMetadata, TopicMetadata
from dmq.client._partitioner import crc32_partition
from dmq.client._producer_core import ProducerCore
from dmq.client.errors import (
    ClientClosedError,
    IllegalStateError,
    InvalidConfigError,
    RecordTooLargeError,
    UnknownPartitionError,
)

TOPIC = "t"


def core(**settings: Any) -> ProducerCore:
    defaults: dict[str, Any] = dict(
        acks="all", linger_ms=5, batch_size=1024 * 1024, compression=None, enable_idempotence=None,
        buffer_memory=64 * 1024 * 1024, max_block_ms=1000, retries=3, retry_backoff_ms=100,
        retry_backoff_max_ms=1000, request_timeout_ms=30_000, delivery_timeout_ms=120_000, max_record_bytes=None,
        partitioner=None, client_id=None, wakeup=threading.Event(), shell="Producer", runner="thread",
        closer="close()",
    )
    return ProducerCore(**{**defaults, **settings})


def meta(partitions: int = 3, max_message_bytes: int | None = None) -> TopicMetadata:
    parts = tuple(PartitionMetadata(i, 0, "b:1", True) for i in range(partitions))
    return TopicMetadata(TOPIC, parts, tuple(range(partitions)), 0.0, max_message_bytes)


def append_one(c: ProducerCore, value: bytes, partition: int, **record: Any) -> tuple[Any, int]:
    """What a shell does: append, reserving what the core asks for (never waiting here)."""
    st = c.acc.thread_state(0)
    rec = c.prepare(TOPIC, value, record.get("key"), record.get("headers"), record.get("timestamp_ms"))
    batch_cap = c.fit(TOPIC, meta(), rec)
    credit = 0
    for _ in range(4):
        with c.acc.lock:
            b, n = c.append(st, TOPIC, partition, False, rec, batch_cap, credit)
        if b is not None:
            return b, n
        if n:
            assert c.pool.try_reserve(n)
            credit += n
    raise AssertionError("no append after four looks")


def test_a_first_record_asks_for_a_chunk_of_memory_then_opens_a_batch_holding_it() -> None:
    c = core()
    st = c.acc.thread_state(0)
    rec = c.prepare(TOPIC, b"v" * 10, None, None, None)
    batch_cap = c.fit(TOPIC, meta(), rec)
    with c.acc.lock:
        assert c.append(st, TOPIC, 1, False, rec, batch_cap, 0) == (None, MEMORY_CHUNK_BYTES)
        b, index = c.append(st, TOPIC, 1, False, rec, batch_cap, MEMORY_CHUNK_BYTES)
    assert b is not None and index == 0
    assert (b.partition, b.reserved, b.size) == (1, MEMORY_CHUNK_BYTES, 10 + RECORD_OVERHEAD_BYTES)


def test_a_record_that_does_not_fit_the_batch_seals_it_and_the_next_look_opens_another() -> None:
    c = core(batch_size=1024, buffer_memory=1024 * 1024)
    first, _ = append_one(c, b"a" * 900, 0)
    st = c.acc.thread_state(0)
    rec = c.prepare(TOPIC, b"b" * 900, None, None, None)
    batch_cap = c.fit(TOPIC, meta(), rec)
    with c.acc.lock:
        assert c.append(st, TOPIC, 0, False, rec, batch_cap, 0) == (None, 0)
    assert first.sealed and first.count == 1
    second, index = append_one(c, b"b" * 900, 0)
    assert second is not first and index == 0


def test_a_timestamp_too_far_from_the_batchs_first_seals_it() -> None:
    c = core()
    first, _ = append_one(c, b"a", 0, timestamp_ms=1)
    second, index = append_one(c, b"b", 0, timestamp_ms=2**31 + 10)
    assert first.sealed and second is not first and index == 0


def test_memory_asked_for_an_open_batch_is_what_it_lacks_beyond_the_credit() -> None:
    c = core()
    b, _ = append_one(c, b"a" * (MEMORY_CHUNK_BYTES - 100), 0)  # nearly fills its first chunk
    st = c.acc.thread_state(0)
    rec = c.prepare(TOPIC, b"b" * 200, None, None, None)
    batch_cap = c.fit(TOPIC, meta(), rec)
    room = b.reserved - b.size
    with c.acc.lock:
        got, need = c.append(st, TOPIC, 0, False, rec, batch_cap, 0)
        assert got is None and need == MEMORY_CHUNK_BYTES - room
        got, need = c.append(st, TOPIC, 0, False, rec, batch_cap, 10)
        assert got is None and need == MEMORY_CHUNK_BYTES - room - 10
        got, index = c.append(st, TOPIC, 0, False, rec, batch_cap, MEMORY_CHUNK_BYTES - room)
    assert got is b and index == 1 and b.reserved == 2 * MEMORY_CHUNK_BYTES - room


def test_headers_count_their_offsets_entry_when_the_record_goes_alone() -> None:
    c = core()
    rec = c.prepare(TOPIC, b"v", None, [("h", b"x")], None)
    assert rec.alone == rec.size + HEADER_OFFSET_BYTES


def test_a_record_above_the_topics_limit_is_refused_naming_the_limit() -> None:
    c = core()
    rec = c.prepare(TOPIC, b"v" * 5000, None, None, None)
    with pytest.raises(RecordTooLargeError, match="max_message_bytes 4096"):
        c.fit(TOPIC, meta(max_message_bytes=4096), rec)


def test_max_record_bytes_is_checked_before_any_metadata() -> None:
    c = core(max_record_bytes=10)
    with pytest.raises(RecordTooLargeError, match="above max_record_bytes 10"):
        c.prepare(TOPIC, b"v" * 11, None, None, None)


def test_placement_explicit_then_key_then_transaction_id_then_sticky() -> None:
    c = core()
    m = meta(5)
    assert c.place(m, 2, b"k", b"txn") == 2
    assert c.place(m, None, b"k", b"txn") == crc32_partition(b"k", 5)
    assert c.place(m, None, None, b"txn") == crc32_partition(b"txn", 5)
    assert c.place(m, None, None, None) is None


def test_sticky_partition_stays_while_waiting_for_memory_and_moves_after_a_seal() -> None:
    c = core()
    st = c.acc.thread_state(0)
    m = meta(3)
    chosen = c.sticky_partition(st, TOPIC, m, None)
    assert c.sticky_partition(st, TOPIC, m, chosen) == chosen  # no batch yet: the partition chosen before
    rec = c.prepare(TOPIC, b"v", None, None, None)
    with c.acc.lock:
        b, _ = c.append(st, TOPIC, chosen, True, rec, c.fit(TOPIC, m, rec), MEMORY_CHUNK_BYTES)
    assert b is not None and st.sticky[TOPIC] is b
    assert c.sticky_partition(st, TOPIC, m, None) == chosen  # its open sticky batch
    with c.acc.lock:
        c.acc.seal(b)
    assert c.sticky_partition(st, TOPIC, m, None) == (chosen + 1) % 3  # the round robin's next


def test_partition_checks_name_the_partition() -> None:
    m = meta(2)
    assert ProducerCore.partition_in(1, m) and not ProducerCore.partition_in(2, m)
    with pytest.raises(UnknownPartitionError, match="int >= 0"):
        ProducerCore.partition_in(True, m)
    assert "partitions 0..1" in str(ProducerCore.missing_partition(TOPIC, 2, m))


def test_extend_appends_a_run_in_batch_sized_segments() -> None:
    c = core(batch_size=1024, buffer_memory=1024 * 1024)
    st = c.acc.thread_state(0)
    values = [b"x" * 100] * 20
    cum = [0]
    for v in values:
        cum.append(cum[-1] + len(v) + RECORD_OVERHEAD_BYTES)
    batch_cap, _ = c.caps_for(meta())
    segments: list[Any] = []
    i, credit = 0, 0
    for _ in range(100):
        if i == len(values):
            break
        with c.acc.lock:
            j, need = c.extend(st, TOPIC, 0, False, values, None, cum, None, i, batch_cap, credit, segments)
        if j > i:
            i, credit = j, 0
        elif need:
            assert c.pool.try_reserve(need)
            credit += need
    assert i == len(values)
    assert sum(n for _b, _first, n, _pos in segments) == 20
    assert all(b.size <= b.cap for b, *_ in segments)
    assert len({id(b) for b, *_ in segments}) == len(segments) > 1


def test_closing_refuses_later_sends_naming_the_shell() -> None:
    c = core(shell="AsyncProducer", runner="task", closer="stop()")
    append_one(c, b"v", 0)
    pending = c.close_batches()
    assert len(pending) == 1 and c.acc.closed
    with pytest.raises(ClientClosedError, match=r"send\(\) after stop\(\): create a new AsyncProducer"):
        c.check_open(None)
    with pytest.raises(IllegalStateError, match="sender task crashed"):
        c.check_open(RuntimeError("boom"))


def test_settings_are_checked_once_for_both_shells() -> None:
    with pytest.raises(InvalidConfigError, match="partitioner"):
        core(partitioner=42)
    with pytest.raises(InvalidConfigError, match="enable_idempotence"):
        core(acks=0, enable_idempotence=True)
    assert core(acks=0).producer_id == -1 and core().producer_id >= 0
