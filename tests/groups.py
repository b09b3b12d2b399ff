"""Consumer-group states the tests set up through the client library."""

from __future__ import annotations

from collections.abc import Mapping

from dmq.client.consumer import DMQConsumer, TopicPartition
from tests import polling

# Short heartbeats and session: a member joins and a rebalance settles in well under a second.
FAST_MEMBER = {"heartbeat_interval_ms": 200, "session_timeout_ms": 3000, "retry_backoff_ms": 50}


def commit_as_sole_member(
    bootstrap: str, group_id: str, topic: str, offsets: Mapping[int, int], timeout_s: float = 15.0
) -> None:
    """Join group_id as its only member, wait until it owns the partitions of `offsets`, commit
    them (partition -> offset) and leave: the group then has committed offsets and no members."""
    consumer = DMQConsumer(bootstrap_servers=bootstrap, group_id=group_id, enable_auto_commit=False, **FAST_MEMBER)
    try:
        consumer.subscribe(topic)
        polling.wait_for(lambda: consumer.poll(200) is not None and len(consumer.assignment()) == len(offsets),
                         "the assignment", timeout_s, poll_s=0.05)
        consumer.commit_sync({TopicPartition(topic, p): offset for p, offset in offsets.items()})
    finally:
        consumer.close()
