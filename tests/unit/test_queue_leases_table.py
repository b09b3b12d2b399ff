"""The lease table's rules without servers (dmq.broker.queue.leases): one live lease per
(partition, group), expiry by the caller's clock, busy leases never expire, renewals move expiry."""

from __future__ import annotations

import pytest

from dmq.broker.queue.leases import LeaseTable


def test_one_live_lease_per_partition_and_group() -> None:
    table = LeaseTable()
    a = table.grant("t", 0, "g", 0, 10, 1000, now=0.0, now_ms=0)
    with pytest.raises(ValueError, match="already leased"):
        table.grant("t", 0, "g", 0, 10, 1000, now=0.0, now_ms=0)
    b = table.grant("t", 0, "other", 0, 10, 1000, now=0.0, now_ms=0)  # another group: independent
    c = table.grant("t", 1, "g", 0, 10, 1000, now=0.0, now_ms=0)  # another partition
    assert len({a.lease_id, b.lease_id, c.lease_id}) == 3 and len(table) == 3
    table.release(a)
    assert table.held("t", 0, "g") is None
    assert table.grant("t", 0, "g", 10, 20, 1000, now=0.0, now_ms=0).start_offset == 10


def test_expiry_renewal_and_busy() -> None:
    table = LeaseTable()
    lease = table.grant("t", 0, "g", 0, 5, 1000, now=0.0, now_ms=0)
    assert table.get(lease.lease_id, 0.5) is lease
    assert table.expired(0.5) == []
    table.renew(lease, 1000, now=0.9, now_ms=900)
    assert table.expired(1.5) == []  # the renewal moved it to 1.9
    assert table.get(lease.lease_id, 2.0) is None  # past expiry: not live even before the sweep
    lease.busy = True  # an ack waiting for its fsync
    assert table.get(lease.lease_id, 2.0) is lease
    assert table.expired(2.0) == []
    lease.busy = False
    assert table.expired(2.1) == [lease]
    table.release(lease)
    assert table.expired(3.0) == [] and len(table) == 0


def test_the_expiry_heap_stays_bounded_under_many_renewals() -> None:
    table = LeaseTable()
    lease = table.grant("t", 0, "g", 0, 5, 1000, now=0.0, now_ms=0)
    for i in range(10_000):
        table.renew(lease, 1000, now=i / 1000, now_ms=i)
    assert len(table._expiries) <= 4 * len(table) + 65


def test_hand_over_and_take_back() -> None:
    table = LeaseTable()
    old = table.grant("t", 0, "g", 0, 5, 1000, now=0.0, now_ms=0)
    new = table.hand_over(old, 9, 2000, now=1.0, now_ms=1000)  # the ack of old rides on this pop
    assert (new.start_offset, new.end_offset, new.expiry_ms) == (5, 9, 3000)
    assert table.held("t", 0, "g") is new and table.get(old.lease_id, 1.0) is None
    table.take_back(new, old)  # the write of both failed: old holds the pair again
    assert table.held("t", 0, "g") is old and table.get(new.lease_id, 1.0) is None and len(table) == 1
    assert table.expired(1.0) == [old]  # and expires as it would have
