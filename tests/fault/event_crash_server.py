"""Child process of test_event_index_crash.py: the embedded server (coordinator + broker, flush
policy fsync) that SIGKILLs itself at one step of the append of the event whose payload is CRASH.

Usage: python event_crash_server.py <data_dir> <step>

Steps (the append's order in broker/events/store.py):
  before-log      the condition checked, the batch not yet in the log
  before-index    the batch in the log (not fsynced), its index record not yet written
  before-fsync    the index record written, the log not yet fsynced
  before-answer   the log fsynced, the append not yet answered
  none            no self-kill (the test SIGKILLs the process after the answer, before the
                  index file's fsync)
Prints `READY <host:port>` once it serves.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib
import signal
import sys
from typing import Any

import structlog

from dmq.broker.events.index import EventIndex
from dmq.broker.log import PartitionLog
from dmq.client.cli.runner import ClusterOptions, run_embedded

CRASH = b"crash-here"
STEPS = ("before-log", "before-index", "before-fsync", "before-answer", "none")


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def install(step: str) -> None:
    armed: list[str] = []  # the topic whose crash event is in the log, waiting for its fsync
    append, stage, wait_durable = PartitionLog.append, EventIndex.stage_columns, PartitionLog.wait_durable

    def logged(self: PartitionLog, batch: Any, *args: Any, **kwargs: Any) -> Any:
        if step == "before-log" and CRASH in bytes(batch):
            die()
        return append(self, batch, *args, **kwargs)

    def staged(self: EventIndex, positions: Any, types: Any, tags: Any, batches: Any, payloads: Any, metadata: Any,
               times_ms: Any, end_offset: int, tag_lists: Any = None) -> None:
        crash = CRASH in payloads  # the index step of an append (and of a catch-up: stage() calls it)
        if crash and step == "before-index":
            die()
        stage(self, positions, types, tags, batches, payloads, metadata, times_ms, end_offset, tag_lists)
        if crash and step == "before-fsync":
            die()
        if crash:
            armed.append(self.path)

    async def durable(self: PartitionLog, end_offset: int, **kwargs: Any) -> None:
        await wait_durable(self, end_offset, **kwargs)
        if step == "before-answer" and armed and armed[0].startswith(str(self.directory)):
            die()

    PartitionLog.append = logged  # type: ignore[method-assign]
    EventIndex.stage_columns = staged  # type: ignore[method-assign]
    PartitionLog.wait_durable = durable  # type: ignore[method-assign]


def main(data_dir: str, step: str) -> None:
    assert step in STEPS, step
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    install(step)

    def ready(cluster: Any) -> None:
        print("READY", cluster.bootstrap, flush=True)

    asyncio.run(run_embedded(ClusterOptions(data_dir=pathlib.Path(data_dir)), ready))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
