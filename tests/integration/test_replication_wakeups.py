"""Replication wake-ups on the acks=all path (issue 31): what a leader's append wakes must not wait
behind the leader's own fsync. Three real brokers on loopback (tests/integration/_replication_cluster.py);
the mechanism is asserted by order of events, not by durations."""

from __future__ import annotations

import time

import pytest

from dmq.proto import dmq_pb2 as pb
from dmq.proto import records
from tests.integration._replication_cluster import ReplicationCluster, until
from tests.integration._replication_cluster import rc as rc  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(60)

# How long the leader's fsync holds out for the followers; it only runs out when they cannot
# fetch while it runs (the defect), so a passing test never waits for it.
HOLD_S = 5.0


async def test_followers_take_a_batch_while_the_leaders_fsync_of_it_runs(rc: ReplicationCluster):
    await rc.create("t", [1, 2, 3])
    stub = rc.brokers[1].stub
    await stub.Produce(pb.ProduceRequest(topic="t", partition=0, batch=records.encode([b"first"]), acks=pb.ACKS_ALL),
                       timeout=10)
    await until(lambda: rc.log_end(2, "t") == rc.log_end(3, "t") == 1, what="followers in step")
    leader = rc.brokers[1].node.logs.get("t", 0)
    followers = [rc.brokers[b].node.logs.get("t", 0) for b in (2, 3)]
    # A fast disk: the leader may fsync on its event loop's thread (fsync_placement.py).
    placement = rc.brokers[1].node.logs.fsync_placement
    placement.inline_max_s, placement.max_loop_share, placement.ewma_s = 10.0, 1.0, 0.0
    real_fsync = leader._fsync
    followers_had_it: list[bool] = []

    def fsync(fd: int) -> None:
        # The leader's first fsync of the second batch holds until both followers have appended
        # it: they can only if the leader answers their parked fetches while it fsyncs.
        if leader.log_end_offset >= 2 and not followers_had_it:
            deadline = time.monotonic() + HOLD_S
            while time.monotonic() < deadline and not all(f.log_end_offset >= 2 for f in followers):
                time.sleep(0.001)
            followers_had_it.append(all(f.log_end_offset >= 2 for f in followers))
        real_fsync(fd)

    leader._fsync = fsync
    answer = await stub.Produce(
        pb.ProduceRequest(topic="t", partition=0, batch=records.encode([b"second"]), acks=pb.ACKS_ALL), timeout=10)
    assert answer.base_offset == 1
    assert followers_had_it == [True]
