"""How the metadata service writes a change: to the metadata store first, then to memory, and the
pair completes even if the calling RPC is cancelled (complete_even_if_cancelled). A store failure
becomes the refusal a client can act on (coordinator_disk_full): a full disk RESOURCE_EXHAUSTED
with the disk-full reason, a lost compare-and-swap or an unreachable store UNAVAILABLE; nothing
changed in either case, so the same request succeeds once the cause is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import structlog

from dmq.coordinator.metadata_errors import CoordinatorDiskFullError, MetadataStoreUnavailableError
from dmq.coordinator.metastore.base import StoreConflict, StoreError, StoreFullError

T = TypeVar("T")

log = structlog.get_logger(__name__)


@contextlib.contextmanager
def coordinator_disk_full() -> Iterator[None]:
    """Around a store write: a full disk becomes CoordinatorDiskFullError (its message says where), any
    other store failure MetadataStoreUnavailableError."""
    try:
        yield
    except StoreFullError as e:
        raise CoordinatorDiskFullError(str(e)) from e
    except StoreConflict as e:
        raise MetadataStoreUnavailableError(f"the cluster metadata changed under this coordinator, nothing was written: {e}") from e
    except StoreError as e:
        raise MetadataStoreUnavailableError(f"the metadata store did not confirm the change: {e}: retry") from e


async def complete_even_if_cancelled(coro: Coroutine[Any, Any, T]) -> T:
    """Run coro to its end even when the caller is cancelled; then re-raise the cancellation.

    Used for "write SQLite, then apply to memory": stopping half-way would leave memory behind disk.
    """
    task = asyncio.ensure_future(coro)
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        # The caller is gone, so nobody awaits the write's outcome: a failure is logged here, and
        # retrieving it keeps asyncio from reporting "Task exception was never retrieved".
        error = None if task.cancelled() else task.exception()
        if error is not None:
            log.warning("a metadata write failed after its caller was cancelled", error=str(error) or repr(error))
        raise asyncio.CancelledError
    return task.result()
