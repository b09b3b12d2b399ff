"""The contract's offset markers: sentinels in place of an offset or a timestamp.

Shared by the broker (ListOffsets), the coordinator (a group's start position) and every client
(consumers, the admin client, the CLI, the Spark source), so that a marker has one value and one
meaning everywhere.
"""

from __future__ import annotations

__all__ = ["EARLIEST", "LATEST", "START_AT_LOG_START", "START_BY_TIMESTAMP"]

# dmq.v1.OffsetQuery.timestamp_ms: the log start offset / the log end offset instead of a time.
EARLIEST = -2
LATEST = -1
# dmq.v1.StartPosition.offset for a partition with no committed offset: from the log start, or
# from the first offset at or after the group's from_ms.
START_AT_LOG_START = -2
START_BY_TIMESTAMP = -3
