"""What an append to a partition log returns.

A module of its own so that dmq.broker.log.record_ids, which appends for the partition log and
which the partition log imports, names it without importing dmq.broker.log.partition.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AppendInfo:
    base_offset: int
    last_offset: int
    append_time_ms: int
    duplicate: bool = False  # nothing of the batch was written
    # Set when some records were duplicate transaction ids: every record's offset, in order.
    record_offsets: list[int] | None = None
