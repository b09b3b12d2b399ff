"""Queue mode over real gRPC: leases, ack / nack / reject / renew / expiry, dead letters, restarts.

Every test runs a real coordinator and broker on loopback (tests/conftest.py) and talks to them
with the client library's QueueConsumer, so the RPCs, their validation and their error details
are exercised end to end.
"""

from __future__ import annotations

import pathlib
import threading
import time
from collections.abc import Callable

import pytest

from dmq.client import Producer, QueueConsumer
from dmq.client.cli.runner import ClusterOptions, ClusterThread
from dmq.client.errors import InvalidArgumentError, LeaseExpiredError, TopicNotFoundError
from tests.integration._queue_helpers import WAIT_S, create_topic, produce, stored
from tests.threads import run_in_threads
from tests.wall_clock import wall_ms


def test_pop_leases_records_in_order_and_ack_moves_the_group_on(cluster: ClusterThread) -> None:
    create_topic(cluster.bootstrap, "jobs")
    produce(cluster.bootstrap, "jobs", [b"v%d" % i for i in range(10)])
    with QueueConsumer(cluster.bootstrap, "jobs", "workers", max_records=4) as q:
        lease = q.pop(timeout=WAIT_S)
        assert lease is not None
        assert (lease.partition, lease.start_offset, lease.end_offset, lease.delivery_count) == (0, 0, 4, 0)
        assert [r.value for r in lease.records] == [b"v0", b"v1", b"v2", b"v3"]
        assert [r.offset for r in lease.records] == [0, 1, 2, 3]
        assert lease.expiry_ms > time.time() * 1000
        # the partition is leased: the group gets nothing else meanwhile
        assert q.pop(timeout=0.2) is None
        assert q.ack(lease) == 4
        nxt = q.pop(timeout=WAIT_S)
        assert nxt is not None and [r.value for r in nxt.records] == [b"v4", b"v5", b"v6", b"v7"]
        # partial ack: through offset 5; 6 and 7 come back
        assert q.ack(nxt, up_to_offset=5) == 6
        again = q.pop(timeout=WAIT_S, max_records=100)
        assert again is not None and [r.offset for r in again.records] == [6, 7, 8, 9]
        # the ack rides on the next pop: one call, the lease is acknowledged and nothing is left
        assert q.pop(timeout=0.2, ack=again) is None
        with pytest.raises(LeaseExpiredError, match="not live"):
            q.ack(again)


def test_one_live_lease_per_partition_and_group_under_16_concurrent_poppers(cluster: ClusterThread) -> None:
    partitions, per_partition = 4, 60
    create_topic(cluster.bootstrap, "work", partitions)
    for p in range(partitions):
        produce(cluster.bootstrap, "work", [b"%d-%d" % (p, i) for i in range(per_partition)], partition=p)
    held: list[tuple[int, float, float, int, int]] = []  # partition, popped at, ack sent at, start, end
    lock = threading.Lock()
    errors: list[BaseException] = []
    # The workers stop once every record is acknowledged (bounded), not after a few empty pops:
    # 16 poppers share 4 partitions, so most pops find them all leased, and on a loaded machine
    # every worker could count its empty pops out before the last records were done.
    all_acked = threading.Event()
    acked = [0]
    give_up = time.monotonic() + 60

    def worker() -> None:
        try:
            with QueueConsumer(cluster.bootstrap, "work", "g", max_records=3) as q:
                while not all_acked.is_set() and time.monotonic() < give_up:
                    lease = q.pop(timeout=0.2)
                    if lease is None:
                        continue
                    popped = time.monotonic()
                    time.sleep(0.002)
                    sent = time.monotonic()
                    q.ack(lease)
                    with lock:
                        held.append((lease.partition, popped, sent, lease.start_offset, lease.end_offset))
                        acked[0] += lease.end_offset - lease.start_offset
                        if acked[0] >= partitions * per_partition:
                            all_acked.set()
        except BaseException as e:  # noqa: BLE001 - reported by the test thread
            errors.append(e)

    run_in_threads(worker, 16, 60)
    assert not errors, errors
    for p in range(partitions):
        mine = sorted((h for h in held if h[0] == p), key=lambda h: h[1])
        # the leases of one partition never overlap in time, and they cover it in offset order
        for a, b in zip(mine, mine[1:]):
            assert a[2] <= b[1], f"partition {p}: two workers held it at once: {a} {b}"
            assert a[4] == b[3], f"partition {p}: not in offset order: {a} then {b}"
        assert mine[0][3] == 0 and mine[-1][4] == per_partition


def test_two_groups_progress_independently(cluster: ClusterThread) -> None:
    create_topic(cluster.bootstrap, "shared")
    produce(cluster.bootstrap, "shared", [b"a", b"b", b"c"])
    with QueueConsumer(cluster.bootstrap, "shared", "billing") as billing, \
            QueueConsumer(cluster.bootstrap, "shared", "email") as email:
        held = billing.pop(timeout=WAIT_S)
        assert held is not None and len(held) == 3
        # billing holds the partition; email is not blocked by it
        other = email.pop(timeout=WAIT_S)
        assert other is not None and [r.value for r in other.records] == [b"a", b"b", b"c"]
        assert email.ack(other) == 3
        assert email.pop(timeout=0.2) is None
        billing.nack(held, "not yet")
        back = billing.pop(timeout=WAIT_S)
        assert back is not None and back.start_offset == 0 and back.delivery_count == 1


def test_nack_brings_the_records_back_and_acknowledges_those_before_the_failed_one(cluster: ClusterThread) -> None:
    create_topic(cluster.bootstrap, "retry")
    produce(cluster.bootstrap, "retry", [b"r%d" % i for i in range(5)])
    with QueueConsumer(cluster.bootstrap, "retry", "g") as q:
        lease = q.pop(timeout=WAIT_S)
        assert lease is not None
        result = q.nack(lease, "handler failed on r2", failed_offset=2)
        assert (result.acked_offset, result.delivery_count, result.dead_lettered) == (2, 1, False)
        back = q.pop(timeout=WAIT_S)
        assert back is not None
        assert [r.value for r in back.records] == [b"r2", b"r3", b"r4"] and back.delivery_count == 1
        with pytest.raises(InvalidArgumentError, match="failed_offset must be within 2..4"):
            q.nack(back, "x", failed_offset=0)
        q.release(back)  # default: the first record failed
        again = q.pop(timeout=WAIT_S)
        assert again is not None and again.start_offset == 2 and again.delivery_count == 2


def test_max_delivery_attempts_dead_letters_the_head_with_headers(cluster: ClusterThread) -> None:
    create_topic(cluster.bootstrap, "orders", max_delivery_attempts=2)
    produce(cluster.bootstrap, "orders", [b"poison", b"fine"], trace=b"t-1")
    with QueueConsumer(cluster.bootstrap, "orders", "g") as q:
        first = q.pop(timeout=WAIT_S)
        assert first is not None
        assert q.nack(first, "ValueError: bad total").dead_lettered is False
        second = q.pop(timeout=WAIT_S)
        assert second is not None and second.delivery_count == 1
        result = q.nack(second, "ValueError: bad total again")
        assert result.dead_lettered and result.acked_offset == 1
        rest = q.pop(timeout=WAIT_S)
        assert rest is not None and [r.value for r in rest.records] == [b"fine"] and rest.delivery_count == 0
        q.ack(rest)
    [dead] = stored(cluster.bootstrap, "orders.dlq")
    headers = dict(dead.headers)
    assert dead.value == b"poison"
    assert headers["trace"] == b"t-1"  # the record's own headers are kept
    assert headers["dmq.dlq.topic"] == b"orders" and headers["dmq.dlq.partition"] == b"0"
    assert headers["dmq.dlq.offset"] == b"0" and headers["dmq.dlq.group"] == b"g"
    assert headers["dmq.dlq.attempts"] == b"2" and headers["dmq.dlq.reason"] == b"max-delivery-attempts"
    assert headers["dmq.dlq.error"] == b"ValueError: bad total again"


def test_reject_dead_letters_one_record_at_once_and_keeps_the_lease(cluster: ClusterThread) -> None:
    create_topic(cluster.bootstrap, "payments")
    produce(cluster.bootstrap, "payments", [b"p0", b"p1", b"p2"])
    with QueueConsumer(cluster.bootstrap, "payments", "g") as q:
        lease = q.pop(timeout=WAIT_S)
        assert lease is not None
        info = q.reject(lease, 1, "schema invalid")
        assert (info.topic, info.partition, info.offset) == ("payments.dlq", 0, 0)
        assert q.ack(lease) == 3  # p0 was acknowledged by the reject, p2 by this ack
        assert q.pop(timeout=0.2) is None
    [dead] = stored(cluster.bootstrap, "payments.dlq")
    assert dead.value == b"p1"
    headers = dict(dead.headers)
    assert headers["dmq.dlq.reason"] == b"rejected" and headers["dmq.dlq.error"] == b"schema invalid"
    assert headers["dmq.dlq.offset"] == b"1" and headers["dmq.dlq.attempts"] == b"1"


def test_renew_keeps_a_lease_past_its_first_expiry(cluster: ClusterThread) -> None:
    create_topic(cluster.bootstrap, "slow")
    produce(cluster.bootstrap, "slow", [b"x"])
    with QueueConsumer(cluster.bootstrap, "slow", "g", lease_ms=2_000) as q:
        lease = q.pop(timeout=WAIT_S)
        assert lease is not None
        first_expiry_ms = lease.expiry_ms
        renewals = 0
        while wall_ms() <= first_expiry_ms:
            # Renewed every 0.4 s of a 2 s lease: a renewal still lands in time when a loaded
            # machine stalls this thread or the server for over a second (at 250 ms of a 400 ms
            # lease it did not always). The sleep is the point: time passes while the lease is held.
            time.sleep(0.4)
            before_ms = wall_ms()
            assert q.renew(lease) >= before_ms + 2_000
            renewals += 1
        assert renewals >= 2  # the lease outlived its first expiry by renewals alone
        assert q.ack(lease) == 1


def test_expired_lease_is_released_within_a_second_and_a_late_ack_changes_nothing(cluster: ClusterThread) -> None:
    create_topic(cluster.bootstrap, "expiring")
    produce(cluster.bootstrap, "expiring", [b"e0", b"e1"])
    with QueueConsumer(cluster.bootstrap, "expiring", "g", lease_ms=200) as dead_worker, \
            QueueConsumer(cluster.bootstrap, "expiring", "g") as other:
        lease = dead_worker.pop(timeout=WAIT_S)
        assert lease is not None
        # Nothing but the broker's expiry timer can wake this pop: its answer, within the pop's
        # wait, is the release. Read after the answer, the clock is past the expiry: the order is
        # what is guaranteed (how soon after depends on how loaded the machine is).
        again = other.pop(timeout=WAIT_S)
        got_at_ms = time.time() * 1000
        assert again is not None and again.start_offset == 0 and again.delivery_count == 1
        assert got_at_ms >= lease.expiry_ms
        for late in (dead_worker.ack, dead_worker.renew, dead_worker.nack):
            with pytest.raises(LeaseExpiredError, match="expired or was taken over"):
                late(lease)
        assert other.ack(again) == 2  # the late calls changed nothing


def test_delivery_counts_and_dead_letters_survive_a_broker_restart(
    cluster_factory: Callable[..., ClusterThread], tmp_path: pathlib.Path
) -> None:
    data = tmp_path / "restart"
    with ClusterThread(ClusterOptions(data_dir=data)) as first:
        create_topic(first.bootstrap, "durable", max_delivery_attempts=3)
        produce(first.bootstrap, "durable", [b"d0", b"d1", b"d2"])
        with QueueConsumer(first.bootstrap, "durable", "g", max_records=1) as q:
            lease = q.pop(timeout=WAIT_S)
            assert lease is not None
            q.reject(lease, 0, "bad")
            q.ack(lease)
            lease = q.pop(timeout=WAIT_S)
            assert lease is not None and lease.start_offset == 1
            q.nack(lease, "first failure")
            lease = q.pop(timeout=WAIT_S)
            assert lease is not None and lease.delivery_count == 1
            q.nack(lease, "second failure")
    second = cluster_factory(data_dir=data)
    with QueueConsumer(second.bootstrap, "durable", "g", max_records=1) as q:
        lease = q.pop(timeout=WAIT_S)
        assert lease is not None and lease.start_offset == 1 and lease.delivery_count == 2
        assert q.nack(lease, "third failure").dead_lettered
        lease = q.pop(timeout=WAIT_S)
        assert lease is not None and lease.start_offset == 2 and lease.delivery_count == 0
    assert [r.value for r in stored(second.bootstrap, "durable.dlq")] == [b"d0", b"d1"]


def test_bad_requests_get_clear_errors(cluster: ClusterThread) -> None:
    create_topic(cluster.bootstrap, "valid")
    with QueueConsumer(cluster.bootstrap, "valid", "g") as q:
        with pytest.raises(InvalidArgumentError, match="timeout must be within"):
            q.pop(timeout=-1)
        with pytest.raises(InvalidArgumentError, match="max_records must be within 1..100000"):
            q.pop(timeout=0, max_records=1_000_000)
    with pytest.raises(InvalidArgumentError, match="lease_ms must be within"):
        QueueConsumer(cluster.bootstrap, "valid", "g", lease_ms=10)
    with QueueConsumer(cluster.bootstrap, "missing", "g") as q, pytest.raises(TopicNotFoundError):
        q.pop(timeout=0)
    with QueueConsumer(cluster.bootstrap, "valid", "bad\ngroup") as q, pytest.raises(InvalidArgumentError, match="control"):
        q.pop(timeout=0)


def test_leases_that_end_inside_stored_batches_hand_out_every_record_once_in_order(cluster: ClusterThread) -> None:
    """Batches of 25 records popped 7 at a time: most leases end inside a stored batch, which the
    broker cuts (and keeps for the next pop). Two groups interleave at different offsets of the same
    batches, and a nack makes one group take a cut batch again from an earlier offset."""
    create_topic(cluster.bootstrap, "cuts")
    with Producer(cluster.bootstrap, linger_ms=0) as p:
        for k in range(4):
            p.send_many("cuts", [b"c%d" % (25 * k + i) for i in range(25)], partition=0).get(WAIT_S)
    seen: dict[str, list[bytes]] = {"a": [], "b": []}
    with QueueConsumer(cluster.bootstrap, "cuts", "a", max_records=7) as qa, QueueConsumer(
        cluster.bootstrap, "cuts", "b", max_records=5
    ) as qb:
        pending: dict[str, object] = {"a": None, "b": None}
        nacked = False
        while True:
            progressed = False
            for group, q in (("a", qa), ("b", qb)):
                lease = q.pop(timeout=0.5, ack=pending[group])  # type: ignore[arg-type]
                pending[group] = None
                if lease is None:
                    continue
                progressed = True
                if group == "b" and not nacked and lease.start_offset > 30:
                    nacked = True
                    q.nack(lease, "once")  # comes back from its first record
                    continue
                seen[group].extend(r.value for r in lease.records)
                pending[group] = lease
            if not progressed:
                break
    want = [b"c%d" % i for i in range(100)]
    assert seen["a"] == want and seen["b"] == want and nacked


def test_pop_sets_the_lease_length_per_call(cluster: ClusterThread) -> None:
    create_topic(cluster.bootstrap, "per-call")
    produce(cluster.bootstrap, "per-call", [b"p0"])
    # The consumer's own lease is an hour: only the pop's 200 ms lets the other worker in.
    with QueueConsumer(cluster.bootstrap, "per-call", "g", lease_ms=3_600_000) as short, \
            QueueConsumer(cluster.bootstrap, "per-call", "g") as other:
        lease = short.pop(timeout=WAIT_S, lease_ms=200)
        assert lease is not None
        again = other.pop(timeout=WAIT_S)
        assert again is not None and again.start_offset == 0 and again.delivery_count == 1
        assert other.ack(again) == 1
        with pytest.raises(InvalidArgumentError, match=r"lease_ms must be within 100\.\.3600000"):
            short.pop(timeout=0, lease_ms=50)
