"""Issue 13: the producer never builds a batch larger than the limit it knows.

Before the fix the accumulator counted key + value + 12 bytes a record against batch_size, but the
encoded batch also carries a 57-byte header, the first entry of each offsets array, the key
bitmap and header offsets (and, compressed, the codec's overhead): with batch_size 1 MiB batches
of 1,053,236 bytes were built and a topic with max_message_bytes 1 MiB refused them all. Here real
brokers enforce the topic's limit; every record must be stored.
"""

from __future__ import annotations

import os
import random
import time

import pytest

from dmq.client import AdminClient, Producer, SimpleConsumer
from dmq.client.errors import RecordTooLargeError
from dmq.proto import records

WAIT_S = 20.0
LIMIT = 64 * 1024


def _stored(bootstrap: str, topic: str) -> list[bytes]:
    with SimpleConsumer(bootstrap, max_wait_ms=0) as c:
        end = c.offsets(topic, 0)[1]
        return [r.value for b in c.consume_batches(topic, 0, 0, end_offset=end) for r in b] if end else []


def test_small_lines_with_batch_size_equal_to_the_topic_limit_are_all_stored(cluster) -> None:  # type: ignore[no-untyped-def]
    """The issue's case, scaled down: batch_size == max_message_bytes, many short values."""
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("lines", 1, config={"max_message_bytes": LIMIT})
    values = [b"line-%06d" % i for i in range(30_000)]
    with Producer(cluster.bootstrap, batch_size=LIMIT, linger_ms=50) as p:
        handles = [p.send("lines", v) for v in values]
        p.flush(WAIT_S)
        errors = [h.exception(0) for h in handles if h.exception(0) is not None]
    assert errors == []
    assert _stored(cluster.bootstrap, "lines") == values


@pytest.mark.parametrize("compression", [None, "zstd", "lz4"])
def test_mixed_records_never_exceed_the_topic_limit(cluster, compression: str | None) -> None:  # type: ignore[no-untyped-def]
    """Keys, headers, explicit timestamps and send_many, incompressible values: all stored."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("mixed", 1, config={"max_message_bytes": LIMIT})
    sent: list[bytes] = []
    now_ms = time.time_ns() // 1_000_000
    with Producer(cluster.bootstrap, batch_size=LIMIT, linger_ms=50, compression=compression) as p:
        handles = []
        for i in range(3_000):
            value = os.urandom(rng.choice([0, 1, 7, 40, 300, 2_000]))
            kind = i % 4
            if kind == 0:
                handles.append(p.send("mixed", value))
            elif kind == 1:
                handles.append(p.send("mixed", value, key=os.urandom(rng.randrange(0, 30))))
            elif kind == 2:
                headers = [("h%d" % j, os.urandom(rng.randrange(0, 20))) for j in range(rng.randrange(1, 4))]
                handles.append(p.send("mixed", value, headers=headers))
            else:
                handles.append(p.send("mixed", value, timestamp_ms=now_ms - 10_000 + i))
            sent.append(value)
            if i % 500 == 499:
                many = [os.urandom(rng.choice([1, 50, 900])) for _ in range(200)]
                p.send_many("mixed", many).wait(WAIT_S)
                sent.extend(many)
        p.flush(WAIT_S)
        errors = [h.exception(0) for h in handles if h.exception(0) is not None]
    assert errors == [], f"seed {seed}"
    assert _stored(cluster.bootstrap, "mixed") == sent, f"seed {seed}"


def test_records_without_headers_in_a_batch_with_headers_count_their_header_offsets(cluster) -> None:  # type: ignore[no-untyped-def]
    """Once one record of a batch has headers, every record has a 4-byte header offset."""
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("hdr", 1, config={"max_message_bytes": LIMIT})
    values = [b"v%05d" % i for i in range(20_000)]
    with Producer(cluster.bootstrap, batch_size=LIMIT, linger_ms=200) as p:
        handles = []
        for i, v in enumerate(values):
            headers = {"a": b"1"} if i % 5_000 == 0 else None
            handles.append(p.send("hdr", v, key=b"", headers=headers))
        p.flush(WAIT_S)
        errors = [h.exception(0) for h in handles if h.exception(0) is not None]
    assert errors == []
    assert _stored(cluster.bootstrap, "hdr") == values


def test_a_record_too_large_for_the_topic_fails_alone_and_names_the_limit(cluster) -> None:  # type: ignore[no-untyped-def]
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("small", 1, config={"max_message_bytes": LIMIT})
    with Producer(cluster.bootstrap, batch_size=16 * 1024, linger_ms=20) as p:
        before = p.send("small", b"before")
        with pytest.raises(RecordTooLargeError, match="max_message_bytes 65536"):
            p.send("small", b"x" * LIMIT)
        # bigger than batch_size but within the topic's limit: goes alone, stored
        alone = p.send("small", b"y" * 40_000)
        after = p.send("small", b"after")
        p.flush(WAIT_S)
        assert [h.get(0).offset for h in (before, alone, after)] == [0, 1, 2]
        with pytest.raises(RecordTooLargeError, match="send_many: record 1: .*max_message_bytes 65536"):
            p.send_many("small", [b"ok", b"z" * LIMIT])
    assert _stored(cluster.bootstrap, "small") == [b"before", b"y" * 40_000, b"after"]


def test_batch_size_above_what_a_broker_accepts_is_refused_naming_the_setting() -> None:
    with pytest.raises(ValueError, match="batch_size must be at most .*max batch bytes"):
        Producer("127.0.0.1:1", batch_size=records.DEFAULT_MAX_BATCH_BYTES)
