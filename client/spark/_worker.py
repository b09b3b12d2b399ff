"""Set-up of the Spark Python worker processes that run the source's and sink's code.

Spark runs a data source's code in Python worker processes it forks from `pyspark.daemon`: one
kind answers the driver's planning calls (schema, partitions), another runs the tasks (read,
write). With `spark.python.worker.reuse` (the default) each process serves many calls, and after
every one the daemon runs a full `gc.collect()`. A process that has imported pyspark, pyarrow,
numpy, gRPC and dmq holds ~60,000 container objects, so each of those collections walks all of
them: 13-47 ms of CPU measured per call on a 2-core machine, four or five per query (planning
and each task), spent while the query's own tasks want the cores.

`prepare_worker()` therefore moves what the process holds after its imports into the collector's
permanent generation (`gc.freeze()`, as pre-fork servers do), once per process. Later collections
walk only what was allocated since: a task's garbage. What it freezes is import-time state -
modules, classes, functions - that lives as long as the process; an object frozen while alive
and later dropped is still freed by reference counting; only a reference cycle among frozen
objects would outlive its use, and the collection just before the freeze leaves none behind.

It also makes the process-wide choices a process owner makes (logging, the allocator), since in
a Spark worker nobody else does.

Nothing happens outside a Spark worker (a driver, a test, an application): the heap there is the
application's business.
"""

from __future__ import annotations

import gc
import logging
import os
import sys

from dmq.client._log import ROOT_LOGGER
from dmq.client._malloc_tuning import keep_large_buffers

__all__ = ["LOG_LEVEL_ENV", "prepare_worker"]

LOG_LEVEL_ENV = "DMQ_SPARK_LOG_LEVEL"

_frozen = False


def _in_spark_worker() -> bool:
    """True in a Python process Spark's worker factory started (readers, writers, planners, the
    streaming source runner); never in the driver."""
    return "PYTHON_WORKER_FACTORY_SECRET" in os.environ


def _configure_logging() -> None:
    """The source and sink log through the standard `logging` module under ``dmq`` (silent by
    default, like the rest of the client library). A Spark worker is a process DMQ's code runs in
    but nobody configures, so its set-up is this process owner's job: unless the process (or the
    job, through its own handlers) configured logging already, show the ``dmq`` lines of warning
    and above on stderr, which Spark keeps in the executor's log; DMQ_SPARK_LOG_LEVEL (e.g. via
    spark.executorEnv.DMQ_SPARK_LOG_LEVEL=debug) asks for more or less."""
    library = logging.getLogger(ROOT_LOGGER)
    configured = logging.getLogger().handlers or any(
        not isinstance(h, logging.NullHandler) for h in library.handlers
    )
    if configured:
        return
    level = os.environ.get(LOG_LEVEL_ENV, "warning").upper()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    library.addHandler(handler)
    library.setLevel(level if level in logging.getLevelNamesMapping() else logging.WARNING)


def prepare_worker() -> bool:
    """Logging, then (once per process) the allocator and a freeze of the import-time heap;
    returns whether this call froze it. A no-op outside Spark workers."""
    global _frozen
    if not _in_spark_worker():
        return False
    _configure_logging()
    if _frozen:
        return False
    _frozen = True
    # A worker reading a topic holds multi-megabyte Fetch buffers: keep them in the heap instead
    # of page-faulting fresh mmap()s in (see dmq.client._malloc_tuning).
    keep_large_buffers()
    gc.collect()  # nothing unreachable goes into the permanent generation
    gc.freeze()
    return True
