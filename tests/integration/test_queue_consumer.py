"""QueueConsumer.process() over real gRPC: it renews the lease while a slow handler runs, acks on
return (riding on the next pop), nacks on exception (per record, or the lease's head with
batch=True), and stop() ends it from another thread."""

from __future__ import annotations

import threading
import time

from dmq.client import AdminClient, QueueConsumer
from dmq.client.cli.runner import ClusterThread
from dmq.client.queue import QueueLease
from dmq.client.records import ConsumerRecord
from tests.integration._queue_helpers import WAIT_S, create_topic, produce


def _setup(bootstrap: str, topic: str, values: list[bytes]) -> None:
    create_topic(bootstrap, topic)
    produce(bootstrap, topic, values)


def test_a_slow_handler_keeps_its_lease_by_renewal(cluster: ClusterThread) -> None:
    _setup(cluster.bootstrap, "slow-work", [b"s0", b"s1"])
    seen: list[bytes] = []

    def slow(record: ConsumerRecord) -> None:
        time.sleep(0.9)  # longer than the 600 ms lease: only renewals keep it
        seen.append(record.value)

    with QueueConsumer(cluster.bootstrap, "slow-work", "g", lease_ms=600) as q:
        assert q.process(slow, max_leases=1) == 2
    assert seen == [b"s0", b"s1"]  # each handled once: the lease never expired
    with AdminClient(cluster.bootstrap) as admin:
        [state] = admin.describe_queue("slow-work").groups
    assert (state.acked_offset, state.delivery_count, state.lease) == (2, 0, None)


def test_batch_handler_failure_nacks_the_head_and_the_lease_comes_back(cluster: ClusterThread) -> None:
    _setup(cluster.bootstrap, "batchy", [b"b0", b"b1", b"b2"])
    calls: list[tuple[int, int]] = []

    def handler(lease: QueueLease) -> None:
        calls.append((lease.start_offset, lease.delivery_count))
        if len(calls) == 1:
            raise RuntimeError("downstream unavailable")

    with QueueConsumer(cluster.bootstrap, "batchy", "g") as q:
        assert q.process(handler, batch=True, idle_timeout=0.5) == 3
    assert calls == [(0, 0), (0, 1)]


def test_stop_ends_process_from_another_thread(cluster: ClusterThread) -> None:
    _setup(cluster.bootstrap, "endless", [b"e"])
    with QueueConsumer(cluster.bootstrap, "endless", "g") as q:
        timer = threading.Timer(0.5, q.stop)
        timer.start()
        started = time.monotonic()
        assert q.process(lambda record: None, poll_timeout=0.2) == 1
        assert time.monotonic() - started < WAIT_S
        timer.join()
