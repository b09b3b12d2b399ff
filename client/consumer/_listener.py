"""ConsumerRebalanceListener: the application's hooks into assignment changes.

Callbacks run on the application's thread, inside poll() (and close()), in this order:

    on_partitions_revoked(revoked)    after the positions were committed and the partitions
                                      handed back (GetAssignment); their fetched-but-unreturned
                                      records were dropped
    on_partitions_assigned(assigned)  before their positions are looked up, so a seek() here
                                      decides where consumption starts
    on_partitions_lost(lost)          the membership ended without a hand-off (session expired,
                                      max_poll_interval_ms exceeded, coordinator restarted):
                                      someone else may own them already, so committing is
                                      pointless. Defaults to on_partitions_revoked, like Kafka.

Each receives a set of TopicPartition and is only called with a non-empty set. An exception
raised by a callback propagates out of poll() after the consumer's own state is consistent.
"""

from __future__ import annotations

from dmq.client.consumer._records import TopicPartition


class ConsumerRebalanceListener:
    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        """Partitions this consumer gave up in a rebalance (or on close())."""

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        """Partitions this consumer gained."""

    def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
        """Partitions taken away without a hand-off; by default treated as revoked."""
        self.on_partitions_revoked(lost)
