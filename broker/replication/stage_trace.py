"""Stage timestamps of the replicated produce path, for bench/replication_bench.py's end-to-end
latency breakdown (issue 31). Off unless the broker process's environment names a file in
DMQ_STAGE_TRACE; then each stage a batch passes appends one line

    <time.time_ns()> <stage> <topic> <partition> <offset>

where offset is the end (last offset + 1) the stage reached, so the bench finds, per record, the
first line of each stage whose offset passes it. Stages (who writes them):

    produce_received   leader: a Produce arrived (offset: the log end before its append)
    leader_appended    leader: the batch is in the log (not yet durable)
    leader_durable     leader: its fsync covers the batch (acks=all, flush_policy fsync)
    replica_fetch.<b>  leader: follower b fetched from offset (it holds everything below, durably)
    high_watermark     leader: the high watermark moved to offset
    consumer_answer    leader: a consumer fetch is answered with records below offset
    produce_acked      leader: the Produce is answered
    follower_received  follower: a fetch answer brought the log end to offset
    follower_durable   follower: its fsync covers offset

Times are wall-clock nanoseconds so that the bench can line them up across processes on one
machine. The writes are buffered (a few microseconds a line); at most MAX_LINES lines are written,
then the trace stops, so a forgotten setting cannot fill a disk.
"""

from __future__ import annotations

import os
import time
from typing import TextIO

TRACE_ENV = "DMQ_STAGE_TRACE"
MAX_LINES = 5_000_000


class StageTrace:
    """Owned by the broker node, closed by its stop()."""

    __slots__ = ("_file", "_lines")

    def __init__(self, path: str | None) -> None:
        self._file: TextIO | None = open(path, "a", buffering=1 << 20) if path else None  # noqa: SIM115 - closed by close()
        self._lines = 0

    @classmethod
    def from_environment(cls) -> StageTrace:
        return cls(os.environ.get(TRACE_ENV) or None)

    @property
    def enabled(self) -> bool:
        return self._file is not None

    def mark(self, stage: str, topic: str, partition: int, offset: int) -> None:
        f = self._file
        if f is None:
            return
        f.write(f"{time.time_ns()} {stage} {topic} {partition} {offset}\n")
        self._lines += 1
        if self._lines >= MAX_LINES:
            self.close()

    def close(self) -> None:
        f, self._file = self._file, None
        if f is not None:
            f.close()
