"""Queue settings in the topic config, over real gRPC: delay_ms, window_buffer_ms, max_wait_ms,
lease_ms, max_queue_size (QueueFullError, nothing of a refused batch stored), and their validation."""

from __future__ import annotations

import time

import pytest

from dmq.client import AdminClient, Producer, QueueConsumer, SimpleConsumer
from dmq.client.cli.runner import ClusterThread
from dmq.client.errors import InvalidArgumentError, QueueFullError
from tests.integration._queue_helpers import WAIT_S, create_topic, send
from tests.wall_clock import wait_wall_clock_past, wall_ms


def _log_end(bootstrap: str, topic: str, partition: int = 0) -> int:
    with SimpleConsumer(bootstrap) as c:
        return c.offsets(topic, partition)[1]


def test_delay_ms_hides_records_until_they_are_that_old(cluster: ClusterThread) -> None:
    create_topic(cluster.bootstrap, "delayed", delay_ms=600)
    with Producer(cluster.bootstrap, linger_ms=0) as p, QueueConsumer(cluster.bootstrap, "delayed", "g") as q:
        send(p, "delayed", [b"later"])
        sent = time.monotonic()
        assert q.pop(timeout=0.2) is None
        lease = q.pop(timeout=WAIT_S)
        assert lease is not None and [r.value for r in lease.records] == [b"later"]
        assert time.monotonic() - sent >= 0.5


def test_window_buffer_ms_hands_out_a_burst_whole(cluster: ClusterThread) -> None:
    # A 2 s window: with 500 ms a starved client's pop (or its second send) could come after the
    # window had passed, and then b0 alone was handed out (seen once under load).
    create_topic(cluster.bootstrap, "bursty", window_buffer_ms=2000)
    with Producer(cluster.bootstrap, linger_ms=0) as p, QueueConsumer(cluster.bootstrap, "bursty", "g") as q:
        send(p, "bursty", [b"b0"])
        assert q.pop(timeout=0.1) is None  # the partition got a record in the last 2 s
        send(p, "bursty", [b"b1", b"b2"])
        lease = q.pop(timeout=WAIT_S)
        assert lease is not None and [r.value for r in lease.records] == [b"b0", b"b1", b"b2"]


def test_max_wait_ms_dead_letters_records_too_old_to_pop(cluster: ClusterThread) -> None:
    create_topic(cluster.bootstrap, "stale", max_wait_ms=1_000)
    with Producer(cluster.bootstrap, linger_ms=0) as p, QueueConsumer(cluster.bootstrap, "stale", "g") as q:
        send(p, "stale", [b"old0", b"old1"])
        # Past the old records' max wait, read as the broker reads it; the fresh one has a whole
        # second to be popped in (300 ms was not always enough on a loaded machine).
        wait_wall_clock_past(wall_ms() + 1_000)
        send(p, "stale", [b"fresh"])
        lease = q.pop(timeout=WAIT_S)
        assert lease is not None and [r.value for r in lease.records] == [b"fresh"]
        assert lease.start_offset == 2
    with SimpleConsumer(cluster.bootstrap) as c:
        dead = c.consume("stale.dlq", 0, 0)
    assert [r.value for r in dead] == [b"old0", b"old1"]
    assert all(dict(r.headers)["dmq.dlq.reason"] == b"expired" for r in dead)
    assert [dict(r.headers)["dmq.dlq.offset"] for r in dead] == [b"0", b"1"]


def test_lease_ms_setting_is_the_default_lease(cluster: ClusterThread) -> None:
    create_topic(cluster.bootstrap, "leasy", lease_ms=1500)
    with Producer(cluster.bootstrap, linger_ms=0) as p, QueueConsumer(cluster.bootstrap, "leasy", "g") as q:
        before_ms = wall_ms()
        send(p, "leasy", [b"x"])
        lease = q.pop(timeout=WAIT_S)
        after_ms = wall_ms()
        assert lease is not None
        # Granted between the two reads (not "more than 1 s left when the answer arrived": a
        # loaded machine's answer can take longer than the 500 ms that left).
        assert before_ms + 1500 <= lease.expiry_ms <= after_ms + 1500


def test_max_queue_size_refuses_a_batch_whole_with_queue_full_error(cluster: ClusterThread) -> None:
    create_topic(cluster.bootstrap, "bounded", max_queue_size=5)
    with Producer(cluster.bootstrap, linger_ms=0) as p:
        send(p, "bounded", [b"q%d" % i for i in range(4)])
        future = p.send_many("bounded", [b"over-a", b"over-b"], partition=0)
        p.flush(WAIT_S)
        with pytest.raises(QueueFullError, match="max_queue_size 5") as info:
            future.get(WAIT_S)
        assert (info.value.depth, info.value.limit, info.value.remaining) == (4, 5, 1)
        assert _log_end(cluster.bootstrap, "bounded") == 4  # nothing of the refused batch stored
        with QueueConsumer(cluster.bootstrap, "bounded", "g", max_records=3) as q:
            lease = q.pop(timeout=WAIT_S)
            assert lease is not None
            q.ack(lease)  # the group acknowledged 3: depth 1
        send(p, "bounded", [b"fits-1", b"fits-2", b"fits-3", b"fits-4"])
        assert _log_end(cluster.bootstrap, "bounded") == 8


def test_max_queue_size_is_shared_pro_rata_by_the_partitions_of_a_leader(cluster: ClusterThread) -> None:
    # one broker leads both partitions: the whole limit applies to their sum
    create_topic(cluster.bootstrap, "split", 2, max_queue_size=4)
    with Producer(cluster.bootstrap, linger_ms=0) as p:
        send(p, "split", [b"a", b"b"], partition=0)
        send(p, "split", [b"c", b"d"], partition=1)
        with pytest.raises(QueueFullError) as info:
            p.send("split", b"e", partition=1).get(WAIT_S)
        assert info.value.depth == 4 and info.value.remaining == 0


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"lease_ms": 10}, "config.lease_ms: must be between 100 and 3600000"),
        ({"max_delivery_attempts": 0}, "config.max_delivery_attempts: must be between 1 and 1000"),
        ({"max_queue_size": -1}, "config.max_queue_size: must be between 0 and"),
        ({"max_wait_ms": 0}, "config.max_wait_ms: must be between 1 and"),
        ({"delay_ms": -5}, "config.delay_ms: must be between 0 and"),
    ],
)
def test_queue_settings_are_validated(cluster: ClusterThread, config: dict[str, int], message: str) -> None:
    with AdminClient(cluster.bootstrap) as admin, pytest.raises(InvalidArgumentError, match=message):
        admin.create_topic("checked", 1, config=config)
