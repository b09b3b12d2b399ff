"""SimpleConsumer.consume()'s read-ahead over a real server (issue 31): what a Fetch brings beyond
max_records is handed out by the next call at the next offset, the Fetch after it travels while
the caller works, and nothing fetched ahead is ever returned for an offset not asked for."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dmq.client import AdminClient, Producer, SimpleConsumer
from dmq.client._cluster import Cluster
from dmq.client._prefetch import MAX_PREFETCH_PARTITIONS
from dmq.client.records import RecordSequence

WAIT_S = 20.0
PREFETCH_THREAD = "dmq-simple-consumer-prefetch"


class FetchLog:
    """Every Fetch the Cluster makes: (first partition's offset, the calling thread's name)."""

    def __init__(self, cluster: Cluster) -> None:
        self.calls: list[tuple[int, str]] = []
        self._lock = threading.Lock()
        raw_fetch = cluster.raw_fetch

        def counting(address: str) -> Callable[..., Any]:
            call = raw_fetch(address)

            def fetch(request: Any, **kw: Any) -> Any:
                with self._lock:
                    self.calls.append((request.partitions[0].offset, threading.current_thread().name))
                return call(request, **kw)

            return fetch

        cluster.raw_fetch = counting  # type: ignore[method-assign]

    def offsets(self) -> list[int]:
        with self._lock:
            return [offset for offset, _ in self.calls]

    def threads(self) -> list[str]:
        with self._lock:
            return [name for _, name in self.calls]


@pytest.fixture
def reader(cluster) -> Iterator[tuple[SimpleConsumer, FetchLog]]:  # type: ignore[no-untyped-def]
    with Cluster(cluster.bootstrap) as own:
        log = FetchLog(own)
        with SimpleConsumer(cluster=own) as c:
            yield c, log


def produce(bootstrap: str, topic: str, values: list[bytes], chunk: int) -> None:
    with AdminClient(bootstrap) as admin:
        admin.create_topic(topic, 1)
    with Producer(bootstrap, linger_ms=60_000) as p:
        for i in range(0, len(values), chunk):
            p.send_many(topic, values[i : i + chunk], partition=0)
            p.flush(WAIT_S)  # one batch per chunk


def read_all(c: SimpleConsumer, topic: str, end: int, max_records: int, **kw: Any) -> list[bytes]:
    got: list[bytes] = []
    offset = 0
    while offset < end:
        records = c.consume(topic, 0, offset, max_records=max_records, **kw)
        assert 0 < len(records) <= max_records
        assert [r.offset for r in records] == list(range(offset, offset + len(records)))
        got += [r.value for r in records]
        offset = records[-1].offset + 1
    return got


def test_records_beyond_max_records_come_from_the_buffer(cluster, reader) -> None:  # type: ignore[no-untyped-def]
    """2,000 records in batches of 700 read 300 at a time: one Fetch brings them all (4 MiB
    max_bytes), the other six calls answer from it. Before, each call fetched again and dropped
    all but 300 (seven Fetches)."""
    c, log = reader
    values = [b"v%05d" % i for i in range(2_000)]
    produce(cluster.bootstrap, "ahead", values, chunk=700)
    assert read_all(c, "ahead", 2_000, max_records=300) == values
    assert log.offsets() == [0]
    # the records are built as a loop reaches them (RecordSequence), not all kept in a list
    assert isinstance(c.consume("ahead", 0, 0), RecordSequence)


def test_the_next_fetch_is_in_flight_while_the_caller_works(cluster, reader) -> None:  # type: ignore[no-untyped-def]
    """With max_bytes one batch, each Fetch after the first is sent by the read-ahead's pool
    when the call before returns, at the offset the next call asks for."""
    c, log = reader
    values = [bytes([i % 256]) * 100 for i in range(1_000)]
    produce(cluster.bootstrap, "inflight", values, chunk=100)  # ten batches of ~10 KB
    assert read_all(c, "inflight", 1_000, max_records=100, max_bytes=12_000) == values
    assert log.offsets() == list(range(0, 1_000, 100))
    threads = log.threads()
    assert not threads[0].startswith(PREFETCH_THREAD)  # the first: on the caller's thread
    assert all(name.startswith(PREFETCH_THREAD) for name in threads[1:]), threads


def test_another_offset_or_max_bytes_drops_what_was_read_ahead(cluster, reader) -> None:  # type: ignore[no-untyped-def]
    c, log = reader
    values = [b"r%03d" % i for i in range(500)]
    produce(cluster.bootstrap, "seek", values, chunk=500)
    assert [r.value for r in c.consume("seek", 0, 0, max_records=10)] == values[:10]
    # back, forward and sideways: each answered for exactly the offset asked, by a new Fetch
    assert [r.value for r in c.consume("seek", 0, 5, max_records=10)] == values[5:15]
    assert [r.value for r in c.consume("seek", 0, 400, max_records=3)] == values[400:403]
    assert [r.value for r in c.consume("seek", 0, 403, max_records=3, max_bytes=1_000_000)] == values[403:406]
    assert [r.value for r in c.consume("seek", 0, 406, max_records=3, max_bytes=1_000_000)] == values[406:409]
    assert log.offsets() == [0, 5, 400, 403]


def test_a_caught_up_reader_sees_records_produced_after_it(cluster, reader) -> None:  # type: ignore[no-untyped-def]
    """At the log end nothing is read ahead: the next call fetches with its own max_wait_ms
    and gets what arrived meanwhile, even with max_wait_ms=0."""
    c, log = reader
    produce(cluster.bootstrap, "tail", [b"a", b"b"], chunk=2)
    assert [r.value for r in c.consume("tail", 0, 0)] == [b"a", b"b"]
    assert c.consume("tail", 0, 2, max_wait_ms=0) == []
    with Producer(cluster.bootstrap) as p:
        p.send("tail", b"c").get(WAIT_S)
    assert [r.value for r in c.consume("tail", 0, 2, max_wait_ms=0)] == [b"c"]
    assert not any(name.startswith(PREFETCH_THREAD) for name in log.threads())


def test_close_ends_the_read_ahead_threads(cluster) -> None:  # type: ignore[no-untyped-def]
    values = [bytes([i % 256]) * 100 for i in range(300)]
    produce(cluster.bootstrap, "close", values, chunk=100)
    c = SimpleConsumer(cluster.bootstrap)
    assert len(c.consume("close", 0, 0, max_records=100, max_bytes=12_000)) == 100  # the next is in flight
    c.close()
    deadline = time.monotonic() + WAIT_S
    while any(t.name.startswith(PREFETCH_THREAD) for t in threading.enumerate()):
        assert time.monotonic() < deadline, [t.name for t in threading.enumerate()]
        time.sleep(0.01)


def test_read_ahead_is_kept_for_at_most_max_prefetch_partitions(cluster) -> None:  # type: ignore[no-untyped-def]
    """Each partition read leaves its rest buffered; the least recently read is dropped beyond
    MAX_PREFETCH_PARTITIONS, and reading it again fetches afresh (exactly the records asked)."""
    partitions = MAX_PREFETCH_PARTITIONS + 2
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("many", partitions)
    with Producer(cluster.bootstrap, linger_ms=60_000) as p:
        for part in range(partitions):
            p.send_many("many", [b"%d-0" % part, b"%d-1" % part], partition=part)
        p.flush(WAIT_S)
    with Cluster(cluster.bootstrap) as own:
        log = FetchLog(own)
        with SimpleConsumer(cluster=own) as c:
            for part in range(partitions):
                assert [r.value for r in c.consume("many", part, 0, max_records=1)] == [b"%d-0" % part]
            assert len(c._prefetches) == MAX_PREFETCH_PARTITIONS
            assert [r.value for r in c.consume("many", partitions - 1, 1)] == [b"%d-1" % (partitions - 1)]
            assert [r.value for r in c.consume("many", 0, 1)] == [b"0-1"]  # dropped: fetched again
            assert len(log.offsets()) == partitions + 1 and log.offsets()[-1] == 1
