"""PartitionReader: the one Fetch path of the client library, for many partitions at once.

Every reader fetches through it: DMQConsumer's Fetcher (which adds its own policy: subscription
epochs, buffering, lazy decoding, pause / seek), SimpleConsumer, the Spark source's executors and
`dmq consume` (through TopicTail). The mechanism they share is here:

  - the partitions asked for are grouped by the broker leading them (leaders from the Cluster's
    metadata cache; how long a look-up may wait for the coordinator is the owner's choice: the
    consumer never waits, a one-shot read does);
  - each broker has at most one Fetch in flight, with its own deadline (max_wait_ms +
    request_timeout_ms), and answers() hands over whichever are done, so a dead or stopped broker
    holds up only its own partitions;
  - a failed Fetch backs its broker off (retry_backoff_ms, doubling up to MAX_BACKOFF_S) and marks
    its topics' leaders stale; a partition answered NOT_LEADER / UNKNOWN_TOPIC_OR_PARTITION marks
    its topic stale and waits retry_backoff_ms, so the next send() asks the coordinator where it
    went instead of spinning on the old leader;
  - answers stay serialised (`FetchPartitionView`: the records are a view into the answer), so
    each owner decodes lazily, only what it hands out.

What a partition's error means (out of range: jump or fail; corrupt: stop there) is the owner's
policy; `partition_error()` maps it onto the client's error classes. `result()` is the
one-partition path: wait for that partition's answer, sending it again while the failure is
retriable, within a number of attempts or a deadline.

Why blocking calls on a pool rather than grpc's `.future()`: a sync channel runs a "spin" thread
only while it has calls in flight, and starts a new one for a call made when it has none, which
is every fetch of a consumer that keeps up (~0.8 ms per poll on this machine, on the path from
an answer to poll() returning). A pooled thread is started once. The pool never holds more
threads than brokers have a Fetch in flight (MAX_FETCH_THREADS at most); `INLINE` runs the call
on the caller's thread instead, for a single blocking fetch that would only wait for the pool.
The asyncio consumer has no pool: its Fetches are tasks on its loop (``start=`` the
AsyncCluster's start_unary), taken in by answers() as the sync ones are; result() is not for it.

Not thread-safe: one owner thread sends and takes answers (the pool's threads only make the
calls and set the wake-up event).
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, NamedTuple

import grpc

from dmq.client._calls import CALL_CANCELLED, PendingCall, RetryPolicy
from dmq.client._cluster import Cluster, fetch_results
from dmq.client._log import get_logger
from dmq.client.errors import (
    ClientClosedError,
    CorruptRecordError,
    DMQError,
    IllegalStateError,
    RequestCancelledError,
    from_partition_error,
    from_rpc_error,
)
from dmq.proto import dmq_pb2 as pb
from dmq.proto.wire import FetchPartitionView

log = get_logger(__name__)

__all__ = ["PartitionReader", "FetchWant", "FetchAnswer", "INLINE", "REFRESH_CODES", "partition_error"]

MAX_FETCH_THREADS = 32
MAX_BACKOFF_S = 1.0
DEFAULT_MAX_WAIT_MS = 500
DEFAULT_PARTITION_MAX_BYTES = 1024 * 1024
DEFAULT_MAX_BYTES = 50 * 1024 * 1024
# Partition codes that mean "the leader we asked is not (or no longer) the one": look it up again.
REFRESH_CODES = frozenset({pb.NOT_LEADER, pb.UNKNOWN_TOPIC_OR_PARTITION})

Key = tuple[str, int]  # (topic, partition); the consumer's TopicPartition is one


class FetchWant(NamedTuple):
    """One partition to fetch: from `offset`, at most `max_bytes` (0: the reader's default).
    `tag` is the owner's, handed back with the answer (the consumer's subscription epoch)."""

    topic: str
    partition: int
    offset: int
    max_bytes: int = 0
    tag: Any = None


class FetchAnswer:
    """One broker's answer: the partitions it was asked for and either its per-partition results
    (`results`, in the broker's order) or why the whole Fetch failed (`error`)."""

    __slots__ = ("address", "wants", "results", "error", "sent_at", "answered_at")

    def __init__(
        self,
        address: str,
        wants: dict[Key, FetchWant],
        results: list[FetchPartitionView],
        error: DMQError | None,
        sent_at: float,
    ) -> None:
        self.address = address
        self.wants = wants
        self.results = results
        self.error = error
        self.sent_at = sent_at
        self.answered_at = time.monotonic()

    def __repr__(self) -> str:
        what = f"error={self.error!r}" if self.error is not None else f"results={len(self.results)}"
        return f"<FetchAnswer {self.address} partitions={len(self.wants)} {what}>"

    @property
    def latency_s(self) -> float:
        return self.answered_at - self.sent_at


def partition_error(result: FetchPartitionView) -> DMQError:
    """The client's error for a partition's error code (with the log's bounds for out-of-range)."""
    return from_partition_error(
        result.error,
        result.error_message,
        result.topic,
        result.partition,
        log_start_offset=result.log_start_offset,
        log_end_offset=result.high_watermark,
    )


class _Inline(concurrent.futures.Executor):
    """Runs the call on the submitting thread: for one blocking fetch, the pool's hop is waste."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as e:  # noqa: BLE001 - handed to whoever reads the future
            future.set_exception(e)
        return future


INLINE: concurrent.futures.Executor = _Inline()


class _InFlight:
    __slots__ = ("future", "wants", "sent_at")

    def __init__(self, future: PendingCall[bytes], wants: dict[Key, FetchWant]) -> None:
        self.future = future
        self.wants = wants
        self.sent_at = time.monotonic()


class PartitionReader:
    """Fetches partitions from their leaders, one Fetch in flight per broker. The owner closes it."""

    def __init__(
        self,
        cluster: Cluster,
        *,
        max_wait_ms: int = DEFAULT_MAX_WAIT_MS,
        min_bytes: int = 1,
        max_bytes: int = DEFAULT_MAX_BYTES,
        partition_max_bytes: int = DEFAULT_PARTITION_MAX_BYTES,
        retry_backoff_ms: int = 100,
        leader_wait_s: float | None = None,
        allow_stale: bool = False,
        leader_hints: Mapping[Key, str] | None = None,
        wakeup: threading.Event | None = None,
        pool: concurrent.futures.Executor | None = None,
        start: Callable[..., PendingCall[bytes]] | None = None,
        name: str = "dmq-reader",
    ) -> None:
        """`leader_wait_s`: how long a leader look-up may wait for the coordinator (None: the
        request timeout; 0: never, a missing entry is fetched in the background); with
        `allow_stale` a known leader is used while its refresh fails. `leader_hints`: leaders
        already known (a planner's), used until they fail. `wakeup`, if given, is set whenever
        a Fetch completes. `pool`: where the blocking calls run (default: the reader's own
        threads; INLINE: the caller's); close() shuts it down. `start`, instead of a pool:
        ``start(call, request, timeout=)`` starts a Fetch without blocking (the asyncio
        consumer's AsyncCluster.start_unary: a task on its loop)."""
        self._cluster = cluster
        self.max_wait_ms = max_wait_ms
        self.min_bytes = min_bytes
        self.max_bytes = max_bytes
        self.partition_max_bytes = partition_max_bytes
        self._retry_backoff_s = retry_backoff_ms / 1000
        # result()'s pauses (dmq.client._calls): retry_backoff_ms doubling up to MAX_BACKOFF_S.
        self._retry = RetryPolicy(retry_backoff_ms, int(MAX_BACKOFF_S * 1000))
        self._leader_wait_s = leader_wait_s
        self._allow_stale = allow_stale
        self._hints = dict(leader_hints or {})
        self._wakeup = wakeup
        self._timeout_s = max_wait_ms / 1000 + cluster.timeout_s
        self._pool: concurrent.futures.Executor | None = None
        if start is None:
            self._pool = pool or concurrent.futures.ThreadPoolExecutor(
                max_workers=MAX_FETCH_THREADS, thread_name_prefix=f"{name}-fetch"
            )
            start = self._pool.submit  # submit(call, request, timeout=): start's signature
        elif pool is not None:
            raise ValueError("give PartitionReader a pool or start, not both")
        self._start = start
        self._inflight: dict[str, _InFlight] = {}  # broker address -> its Fetch in flight
        self._inflight_keys: dict[Key, str] = {}  # partition -> the broker fetching it now
        self._backoff_until: dict[str, float] = {}
        self._backoff_s: dict[str, float] = {}  # the last backoff per broker, doubled per failure
        self._partition_retry_at: dict[Key, float] = {}  # after NOT_LEADER / UNKNOWN_TOPIC_OR_PARTITION
        self.sent = 0  # Fetches sent
        self._closed = False

    def __repr__(self) -> str:
        return f"<PartitionReader in_flight={sorted(self._inflight)} backing_off={sorted(self._backoff_until)}>"

    # -- sending ---------------------------------------------------------------------------------

    def in_flight(self, key: Key) -> bool:
        return key in self._inflight_keys

    @property
    def busy(self) -> bool:
        """Some Fetch is in flight."""
        return bool(self._inflight)

    def send(self, wants: Iterable[FetchWant], *, now: float | None = None) -> dict[Key, DMQError]:
        """Start one Fetch per broker that leads some of `wants`, has none in flight and is not
        backing off; partitions already in flight, or waiting after a leader change, are left
        out. Returns the partitions whose leader could not be looked up, with why."""
        if self._closed:
            return {}
        if now is None:
            now = time.monotonic()
        plan: dict[str, dict[Key, FetchWant]] = {}
        failed: dict[Key, DMQError] = {}
        for want in wants:
            key = (want.topic, want.partition)
            if key in self._inflight_keys:
                continue
            retry_at = self._partition_retry_at.get(key)
            if retry_at is not None:
                if retry_at > now:
                    continue
                del self._partition_retry_at[key]
            try:
                address = self._leader(key)
            except DMQError as e:
                log.debug("no leader to fetch from", topic=key[0], partition=key[1], error=str(e))
                failed[key] = e
                continue
            if address in self._inflight or self._backoff_until.get(address, 0.0) > now:
                continue
            plan.setdefault(address, {})[key] = want
        for address, parts in plan.items():
            self._send(address, parts)
        return failed

    def _leader(self, key: Key) -> str:
        hint = self._hints.get(key)
        if hint:
            return hint
        return self._cluster.leader_for(key[0], key[1], timeout_s=self._leader_wait_s, allow_stale=self._allow_stale)

    def _send(self, address: str, parts: dict[Key, FetchWant]) -> None:
        default = self.partition_max_bytes
        partitions = [
            pb.FetchPartition(topic=w.topic, partition=w.partition, offset=w.offset, max_bytes=w.max_bytes or default)
            for w in parts.values()
        ]
        request = pb.FetchRequest(
            partitions=partitions,
            max_wait_ms=self.max_wait_ms,
            min_bytes=self.min_bytes,
            # no more than the partitions may give, so a one-partition read asks for its own size
            max_bytes=min(self.max_bytes, sum(p.max_bytes for p in partitions)),
        )
        try:
            call = self._cluster.raw_fetch(address)
            future = self._start(call, request, timeout=self._timeout_s)
        except (DMQError, RuntimeError) as e:  # closed client or pool
            log.debug("fetch not sent", broker=address, error=str(e))
            return
        self.sent += 1
        self._inflight[address] = _InFlight(future, parts)
        for key in parts:
            self._inflight_keys[key] = address
        wakeup = self._wakeup
        if wakeup is not None:
            future.add_done_callback(lambda _f: wakeup.set())

    # -- receiving -------------------------------------------------------------------------------

    def answers(self) -> list[FetchAnswer]:
        """The answers of the Fetches that are done (never blocks)."""
        if not self._inflight:
            return []
        out = []
        for address, inflight in list(self._inflight.items()):
            if inflight.future.done():
                answer = self._finish(address, inflight)
                if answer is not None:
                    out.append(answer)
        return out

    @property
    def ready(self) -> bool:
        """Some Fetch in flight is done: answers() has something."""
        return any(f.future.done() for f in self._inflight.values())

    def _finish(self, address: str, inflight: _InFlight) -> FetchAnswer | None:
        del self._inflight[address]
        for key in inflight.wants:
            self._inflight_keys.pop(key, None)
        error: DMQError
        try:
            response = inflight.future.result()
        except grpc.RpcError as e:
            error = from_rpc_error(e, context=f"Fetch from broker {address}")
        except CALL_CANCELLED:
            return None
        except ValueError as e:  # the channel was closed under the call
            log.debug("fetch abandoned", broker=address, error=str(e))
            return None
        else:
            try:
                results = fetch_results(response, f"Fetch from broker {address}")
            except CorruptRecordError as e:
                error = e
            else:
                self._backoff_until.pop(address, None)
                self._backoff_s.pop(address, None)
                for r in results:
                    if r.error in REFRESH_CODES:
                        self._leader_moved((r.topic, r.partition))
                return FetchAnswer(address, inflight.wants, results, None, inflight.sent_at)
        self._failed(address, inflight, error)
        return FetchAnswer(address, inflight.wants, [], error, inflight.sent_at)

    def _failed(self, address: str, inflight: _InFlight, err: DMQError) -> None:
        if self._closed:
            return
        log.warning("fetch failed, will retry", broker=address, error=str(err), retriable=err.retriable)
        delay_s = min(MAX_BACKOFF_S, max(self._retry_backoff_s, 2 * self._backoff_s.get(address, 0.0)))
        self._backoff_s[address] = delay_s
        self._backoff_until[address] = time.monotonic() + delay_s
        # The broker may be gone or no longer lead these partitions: look the leaders up again.
        for key in inflight.wants:
            self._hints.pop(key, None)
        for topic in {key[0] for key in inflight.wants}:
            self._cluster.invalidate(topic)

    def _leader_moved(self, key: Key) -> None:
        log.debug("partition not led by the broker asked; refreshing its leader", topic=key[0], partition=key[1])
        self._hints.pop(key, None)
        self._cluster.invalidate(key[0])
        self._partition_retry_at[key] = time.monotonic() + self._retry_backoff_s

    def retry_at(self, address: str) -> float:
        """When a backing-off broker is asked again (0.0: it is not backing off)."""
        return self._backoff_until.get(address, 0.0)

    # -- one partition ---------------------------------------------------------------------------

    def result(
        self,
        want: FetchWant,
        *,
        attempts: int | None = None,
        deadline: float | None = None,
        retry_codes: Collection[int] = REFRESH_CODES,
    ) -> FetchPartitionView:
        """The answer for `want`'s partition: of its Fetch in flight (send() it first to overlap it
        with other work), else of one sent now. A retriable failure of the Fetch or of the leader
        look-up, or a partition code in `retry_codes`, sends it again after a backoff (doubling
        from retry_backoff_ms up to MAX_BACKOFF_S), until `attempts` tries were made or
        `deadline` (time.monotonic()) has passed (neither given: one try); then the last error
        is raised. Other errors are raised at once; other partition codes are returned (the
        caller's policy)."""
        if attempts is None and deadline is None:
            attempts = 1
        key = (want.topic, want.partition)
        attempt = 0
        while True:
            attempt += 1
            outcome = self._one(want, key)
            if isinstance(outcome, FetchPartitionView):
                if outcome.error not in retry_codes:
                    return outcome
                err = partition_error(outcome)
            else:
                err = outcome
                if not (err.retriable or err.invalid_metadata):
                    raise err
            if attempts is not None and attempt >= attempts:
                raise err
            delay_s = self._retry.backoff_s(attempt)
            if deadline is not None and time.monotonic() + delay_s > deadline:
                raise err
            time.sleep(delay_s)
            self._partition_retry_at.pop(key, None)

    def _one(self, want: FetchWant, key: Key) -> FetchPartitionView | DMQError:
        """One try of result(): the partition's answer, or why there is none."""
        if self._closed:
            return ClientClosedError("the reader is closed")
        address = self._inflight_keys.get(key)
        if address is None:
            try:
                address = self._leader(key)
            except DMQError as e:
                if not e.retriable:
                    raise  # no such topic or partition: asking again cannot help
                return e
            if address in self._inflight:
                raise IllegalStateError(f"result() reads one partition at a time; {address} has another Fetch in flight")
            self._backoff_until.pop(address, None)  # result() paces its own retries
            self._send(address, {key: want})
            if address not in self._inflight:
                return ClientClosedError("the reader is closed")
        inflight = self._inflight[address]
        # A pool's future (result() waits, so it is not for a reader whose Fetches are loop tasks)
        if not isinstance(inflight.future, concurrent.futures.Future):
            raise IllegalStateError("result() waits for a Fetch: the reader must run its calls on a pool")
        concurrent.futures.wait([inflight.future])  # bounded: the call has its deadline
        answer = self._finish(address, inflight)
        if answer is None:
            return RequestCancelledError(f"the Fetch of {key[0]}[{key[1]}] from broker {address} was cancelled")
        if answer.error is not None:
            return answer.error
        for r in answer.results:
            if r.topic == key[0] and r.partition == key[1]:
                return r
        return CorruptRecordError(f"Fetch from broker {address}: the answer does not hold {key[0]}[{key[1]}]")

    # -- lifecycle ---------------------------------------------------------------------------------

    def cancel(self) -> None:
        """Forget the Fetches in flight (their answers are dropped)."""
        for inflight in self._inflight.values():
            inflight.future.cancel()
        self._inflight.clear()
        self._inflight_keys.clear()

    def close(self) -> None:
        """Drop everything; calls still running end when the owner closes the channels."""
        self._closed = True
        self.cancel()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
