"""DMQConsumer's commits: synchronous ones, asynchronous ones in flight and their callbacks,
auto-commits per broker.

The rules (who may commit, what a refusal means, when an auto-commit is due and what it
covers) are the ConsumerCore's (_core.py); this module makes the calls through the
OffsetClient and keeps what is in flight. Everything runs on the application's thread; gRPC
threads only complete futures, whose callbacks run later, inside poll(), commit_sync() or
close() (``run_callbacks``), like Kafka's commitAsync callbacks.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from dmq.client._log import KeyValueLogger
from dmq.client._metrics import ClientStats
from dmq.client.consumer._core import ConsumerCore
from dmq.client.consumer._group import Membership
from dmq.client.consumer._offsets import OffsetClient
from dmq.client.consumer._records import OffsetAndMetadata, TopicPartition
from dmq.client.errors import CommitFailedError, DMQError, DMQTimeoutError, ResourceExhaustedError

CommitCallback = Callable[[dict[TopicPartition, OffsetAndMetadata], Exception | None], None]
Offsets = Mapping[TopicPartition, OffsetAndMetadata]


class Commits:
    def __init__(self, offsets: OffsetClient, core: ConsumerCore, stats: ClientStats, log: KeyValueLogger) -> None:
        self._offsets = offsets
        self._core = core
        self._stats = stats
        self._log = log
        self.in_flight: set[concurrent.futures.Future[Any]] = set()
        self._finished: deque[tuple[CommitCallback | None, concurrent.futures.Future[Any]]] = deque()
        self._auto: dict[str, concurrent.futures.Future[Any]] = {}  # broker -> last auto-commit

    def __repr__(self) -> str:
        return f"<Commits in_flight={len(self.in_flight)} finished={len(self._finished)}>"

    def sync(self, offsets: Offsets, memberships: Mapping[str, Membership] | None = None, *, deadline: float) -> None:
        """Commit and wait, per broker in parallel, until `deadline` (time.monotonic())."""
        if not offsets:
            return
        memberships = self._core.memberships if memberships is None else memberships
        self._core.check_can_commit(offsets, memberships)
        # An older async commit landing after this one would move the offset backwards.
        self.wait(deadline)
        outcome = self._offsets.commit_sync(offsets, memberships, timeout_s=deadline - time.monotonic())
        self._stats.committed()
        self._core.subs.mark_committed({tp: o.offset for tp, o in outcome.done.items()})
        error = outcome.error("commit")
        if error is None:
            return
        if isinstance(error, CommitFailedError):
            self._core.commit_refused({tp.topic for tp in outcome.errors})
        elif error.retriable:
            # A broker that answered with the resource it lacks (disk full, busy) keeps that class:
            # "free space on broker N" is not "a broker did not answer in time".
            cls = type(error) if isinstance(error, ResourceExhaustedError) else DMQTimeoutError
            error = cls(f"{error} (gave up at the commit's deadline)", code=error.code, details=error.details)
        raise error

    def send(self, offsets: dict[TopicPartition, OffsetAndMetadata],
             callback: CommitCallback | None) -> concurrent.futures.Future[dict[TopicPartition, OffsetAndMetadata]]:
        """Commit without waiting: a future of the committed offsets; `callback` runs later."""
        try:
            self._core.check_can_commit(offsets)
        except CommitFailedError as e:
            future: concurrent.futures.Future[Any] = concurrent.futures.Future()
            future.set_exception(e)
        else:
            future = self._offsets.commit_async(offsets, self._core.memberships, timeout_s=0)
            self._stats.committed()
        self._track(future, callback)
        return future

    def _track(self, future: concurrent.futures.Future[Any], callback: CommitCallback | None) -> None:
        self.in_flight.add(future)
        finished = self._finished
        future.add_done_callback(lambda f: finished.append((callback, f)))

    def run_callbacks(self) -> None:
        """Record the finished commits and run their callbacks (on the caller's thread)."""
        while self._finished:
            callback, future = self._finished.popleft()
            self.in_flight.discard(future)
            error = future.exception()
            if error is None:
                offsets = future.result()
                self._core.subs.mark_committed({tp: o.offset for tp, o in offsets.items()})
            else:
                offsets = {}
                if not isinstance(error, Exception):  # a BaseException (KeyboardInterrupt): not ours
                    raise error
                if isinstance(error, CommitFailedError):
                    self._core.commit_refused()
                if callback is None:
                    self._log.warning("async commit failed", error=str(error))
            if callback is not None:
                callback(offsets, error)

    def wait(self, deadline: float) -> None:
        """Wait for the commits in flight until `deadline`, then run their callbacks."""
        if self.in_flight:
            concurrent.futures.wait(list(self.in_flight), timeout=max(0.0, deadline - time.monotonic()))
            self.run_callbacks()

    def auto_commit(self, now: float) -> None:
        """Commit the returned positions asynchronously when due, per broker: a broker whose
        previous auto-commit has not answered (stopped, slow) is skipped this time, the others
        are not."""
        offsets = self._core.auto_commit(now)
        if not offsets:
            return
        try:
            calls, _ = self._offsets.commit_calls(offsets, self._core.memberships, timeout_s=0)
        except DMQError as e:
            self._log.debug("auto-commit skipped", error=str(e))
            return
        for call in calls:
            busy = self._auto.get(call.address)
            if busy is not None and not busy.done():
                continue
            future = self._offsets.send_commit(call)
            self._auto[call.address] = future
            self._track(future, None)
