"""Look-ups `dmq produce` / `dmq consume` and their reader still call with a Session.

They are the AdminClient's own operations under the names those commands use; the other commands
call the AdminClient directly (`dmq.client.cli._errors.admin`). Kept until the data commands move
onto the client library's multi-partition reader.
"""

from __future__ import annotations

from collections.abc import Iterable

from dmq.client.admin import OffsetInfo, TopicDescription
from dmq.client.admin import check_topic_name as check_topic_name
from dmq.client.cli._session import Session


def describe_topic(sess: Session, name: str) -> TopicDescription:
    return sess.admin.describe_topic(name)


def list_offsets(sess: Session, topic_info: TopicDescription, partitions: Iterable[int],
                 timestamp_ms: int) -> dict[int, OffsetInfo]:
    """ListOffsets for some partitions of one topic, grouped by leader: partition -> answer."""
    answers = sess.admin.list_partition_offsets({(topic_info.name, p): timestamp_ms for p in partitions})
    return {partition: a for (_topic, partition), a in answers.items()}
