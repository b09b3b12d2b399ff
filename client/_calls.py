"""The client library's one call layer: a retry policy and the call shapes built on it.

Every client object that asks a server again after a retriable failure does it here, with one
policy (as aiokafka has one ``retry_backoff_ms``):

  - `RetryPolicy`: the pause before retry n is ``retry_backoff_ms * 2**(n-1)``, capped at
    ``retry_backoff_max_ms``, times a jitter factor drawn from ``[1 - jitter, 1 + jitter]`` (so
    clients that failed together do not retry together); every call shape gives up once the next
    pause would end past its deadline, ``request_timeout_ms`` after it began unless the caller
    names another. Which failures are retriable is the error classes' (``DMQError.retriable``,
    ``invalid_metadata``), narrowed per shape.
  - `call_coordinator`: one RPC to the coordinator, asked again while the coordinator itself
    answers UNAVAILABLE; a refused connection fails at once (nothing listens: asking again
    only hides a wrong address until the deadline).
  - `call_leader`: one RPC to a partition's leader; a retriable failure marks the topic's
    metadata stale and asks again, at the leader the fresh metadata names (NOT_LEADER, a broker
    gone).
  - `Backoffs`: the same pauses, per key, for loops that may not sleep (poll()).
  - `fan_out_by_leader`: one RPC per leader (or per (topic, leader)) for many partitions, sent
    together; the partitions that failed retriably are asked again, regrouped by their leaders.

The asyncio client uses the same `RetryPolicy` (``backoff_s``) with its own awaits.

`PendingCall` is what the parts shared by both clients (the fetch reader, the position look-ups,
the metadata refresh) ask of a call they started without waiting: a grpc Future in the sync
client, an asyncio task on the loop in the asyncio one (`Cluster.start_unary` starts either).
`CALL_CANCELLED` is what its result() raises when it was cancelled, in either.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import time
from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import grpc

from dmq.client._log import get_logger
from dmq.client.errors import DMQError, UnknownServerError, from_rpc_error, is_connect_failure

log = get_logger(__name__)

__all__ = ["RetryPolicy", "Backoffs", "FanOut", "PendingCall", "CALL_CANCELLED", "call_coordinator", "call_leader",
           "fan_out_by_leader", "retry_call", "retry_call_async"]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
K = TypeVar("K", bound=Hashable)
R = TypeVar("R", bound=Hashable)
V = TypeVar("V")
A = TypeVar("A")  # a call's answer

DEFAULT_RETRY_BACKOFF_MS = 100
DEFAULT_RETRY_BACKOFF_MAX_MS = 1_000
DEFAULT_REQUEST_TIMEOUT_MS = 30_000
DEFAULT_JITTER = 0.2
# Statuses after which a partition's leader is looked up again: it moved, or its broker is gone.
_STALE_METADATA_CODES = frozenset({grpc.StatusCode.NOT_FOUND.name, grpc.StatusCode.UNAVAILABLE.name})
# The shortest per-call gRPC timeout a retry is sent with: a call with less left fails at once.
MIN_CALL_TIMEOUT_S = 0.05
# What a cancelled PendingCall's result() raises: a grpc Future's, a thread pool's, a loop task's.
CALL_CANCELLED: tuple[type[BaseException], ...] = (
    grpc.FutureCancelledError, concurrent.futures.CancelledError, asyncio.CancelledError)


class PendingCall(Protocol[T_co]):
    """A call started without waiting (see the module docstring). result() is asked only once
    done() says so: a loop task cannot be waited for from the loop's own thread."""

    def done(self) -> bool: ...

    def result(self) -> T_co: ...

    def cancel(self) -> bool: ...

    def add_done_callback(self, fn: Callable[[Any], None], /) -> None: ...


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a client asks again: backoff growth, cap, jitter and the deadline (see the module
    docstring). Immutable; one per client object, shared by its call paths."""

    retry_backoff_ms: int = DEFAULT_RETRY_BACKOFF_MS
    retry_backoff_max_ms: int = DEFAULT_RETRY_BACKOFF_MAX_MS
    request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS
    jitter: float = DEFAULT_JITTER
    # Where the jitter is drawn from; a test passes a seeded one.
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.retry_backoff_ms < 0 or self.retry_backoff_max_ms < 0 or self.request_timeout_ms <= 0:
            raise ValueError(
                "retry_backoff_ms and retry_backoff_max_ms must be >= 0 and request_timeout_ms > 0, got "
                f"{self.retry_backoff_ms}, {self.retry_backoff_max_ms}, {self.request_timeout_ms}"
            )
        if not 0.0 <= self.jitter < 1.0:
            raise ValueError(f"jitter must be within [0, 1), got {self.jitter}")

    @property
    def timeout_s(self) -> float:
        return self.request_timeout_ms / 1000

    def deadline(self, timeout_s: float | None = None, *, now: float | None = None) -> float:
        """The time.monotonic() by which a call begun `now` gives up (``request_timeout_ms``
        later unless `timeout_s` says otherwise)."""
        start = time.monotonic() if now is None else now
        return start + (self.timeout_s if timeout_s is None else max(0.0, timeout_s))

    def backoff_s(self, retry: int) -> float:
        """The pause before retry number `retry` (1 = the first retry), in seconds."""
        if retry < 1:
            raise ValueError(f"retry counts from 1, got {retry}")
        cap_ms = max(self.retry_backoff_ms, self.retry_backoff_max_ms)
        # 2**62 already passes any cap; a larger exponent would only build a huge int.
        base_ms: int = min(cap_ms, self.retry_backoff_ms * 2 ** min(retry - 1, 62))
        factor = self.rng.uniform(1 - self.jitter, 1 + self.jitter) if self.jitter else 1.0
        return base_ms * factor / 1000


def call_timeout_s(deadline: float, cap_s: float | None = None) -> float:
    """The gRPC timeout for one try: what is left before `deadline` (at least MIN_CALL_TIMEOUT_S),
    at most `cap_s`."""
    left = max(MIN_CALL_TIMEOUT_S, deadline - time.monotonic())
    return left if cap_s is None else min(cap_s, left)


def retry_call(
    attempt: Callable[[], T],
    *,
    policy: RetryPolicy,
    deadline: float,
    retriable: Callable[[DMQError], bool] = lambda e: e.retriable,
    on_retry: Callable[[DMQError, float], None] | None = None,
    max_attempts: int | None = None,
    stop: Callable[[], bool] = lambda: False,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """`attempt()` until it returns; a DMQError that is `retriable` is followed by the policy's
    pause and another attempt, unless the pause would end past `deadline`, `max_attempts` were
    made or `stop()` says so, when the error is raised. `on_retry(error, pause_s)` is told first
    (to log, to mark metadata stale)."""
    retry = 0
    while True:
        try:
            return attempt()
        except DMQError as e:
            retry += 1
            pause_s = policy.backoff_s(retry)
            if (not retriable(e) or stop() or (max_attempts is not None and retry >= max_attempts)
                    or time.monotonic() + pause_s >= deadline):
                raise
            if on_retry is not None:
                on_retry(e, pause_s)
            sleep(pause_s)


async def retry_call_async(
    attempt: Callable[[], Awaitable[T]],
    *,
    policy: RetryPolicy,
    deadline: float,
    retriable: Callable[[DMQError], bool] = lambda e: e.retriable,
    on_retry: Callable[[DMQError, float], None] | None = None,
) -> T:
    """`retry_call` for the asyncio client: the same policy and rules, the pauses awaited."""
    retry = 0
    while True:
        try:
            return await attempt()
        except DMQError as e:
            retry += 1
            pause_s = policy.backoff_s(retry)
            if not retriable(e) or time.monotonic() + pause_s >= deadline:
                raise
            if on_retry is not None:
                on_retry(e, pause_s)
        await asyncio.sleep(pause_s)


def call_coordinator(
    stub: Any,
    method: str,
    request: Any,
    *,
    policy: RetryPolicy,
    context: str,
    overrides: Mapping[grpc.StatusCode, type[DMQError]] | None = None,
    deadline: float | None = None,
) -> Any:
    """`stub.method(request)` on the coordinator, asked again while the coordinator answers
    UNAVAILABLE itself (starting, electing, its store busy); a refused connection and every other
    status are raised at once as their DMQError (`context` says what was asked where)."""
    end = policy.deadline() if deadline is None else deadline

    def attempt() -> Any:
        try:
            return getattr(stub, method)(request, timeout=call_timeout_s(end))
        except grpc.RpcError as e:
            raise from_rpc_error(e, context=context, overrides=overrides) from e

    def retriable(e: DMQError) -> bool:
        return e.code == grpc.StatusCode.UNAVAILABLE.name and not is_connect_failure(e.details)

    def on_retry(e: DMQError, pause_s: float) -> None:
        log.debug("coordinator unavailable, retrying", what=context, error=str(e), retry_in_ms=int(pause_s * 1000))

    return retry_call(attempt, policy=policy, deadline=end, retriable=retriable, on_retry=on_retry)


def call_leader(
    cluster: Any,
    topic: str,
    leader: Callable[[], str],
    method: str,
    request: Any,
    *,
    policy: RetryPolicy,
    what: str,
    overrides: Mapping[grpc.StatusCode, type[DMQError]] | None = None,
    retriable: Callable[[DMQError], bool] = lambda e: e.retriable,
    max_attempts: int | None = None,
    deadline: float | None = None,
    call_cap_s: float | None = None,
    stop: Callable[[], bool] = lambda: False,
) -> Any:
    """`method(request)` at the broker `leader()` names, asked again while the failure is
    `retriable`: the broker does not lead the partition or cannot be reached. A failure that says
    the leader may have moved marks `topic`'s metadata stale, so `leader()` looks it up afresh. `cluster` is a dmq.client._cluster
    Cluster (typed loosely: this module sits below it)."""
    end = policy.deadline() if deadline is None else deadline

    def attempt() -> Any:
        address = leader()
        try:
            return getattr(cluster.broker_stub(address), method)(request, timeout=call_timeout_s(end, call_cap_s))
        except grpc.RpcError as e:
            err = from_rpc_error(e, context=f"{what} at {address}", overrides=overrides)
            if err.invalid_metadata or err.code in _STALE_METADATA_CODES:
                cluster.invalidate(topic)  # the next look-up asks the coordinator
            raise err from None

    def on_retry(e: DMQError, pause_s: float) -> None:
        log.debug("call to the partition's leader failed; looking it up again", what=what, error=str(e),
                  retry_in_ms=int(pause_s * 1000))

    return retry_call(attempt, policy=policy, deadline=end, retriable=retriable, on_retry=on_retry,
                      max_attempts=max_attempts, stop=stop)


class Backoffs(Generic[K]):
    """Per-key pauses for loops that must not sleep (poll() and the background calls it drives):
    each failure of a key in a row sets when it may be tried again, by the policy's pause for
    that many failures; a success clears the key. Keys are the caller's (topics, brokers), few."""

    def __init__(self, policy: RetryPolicy) -> None:
        self._policy = policy
        self._state: dict[K, tuple[float, int]] = {}  # key -> (retry at, time.monotonic(); failures)

    def __repr__(self) -> str:
        return f"<Backoffs waiting={len(self._state)}>"

    def failed(self, key: K) -> tuple[float, int]:
        """Record a failure: (the pause before the next try, failures in a row)."""
        failures = self._state.get(key, (0.0, 0))[1] + 1
        pause_s = self._policy.backoff_s(failures)
        self._state[key] = (time.monotonic() + pause_s, failures)
        return pause_s, failures

    def succeeded(self, key: K) -> None:
        self._state.pop(key, None)

    def retry_at(self, key: K) -> float:
        """The time.monotonic() before which `key` waits (0.0: it may go now)."""
        return self._state.get(key, (0.0, 0))[0]


@dataclass
class FanOut(Generic[K, V]):
    """What `fan_out_by_leader` got: the answers, and the last error of each key without one."""

    done: dict[K, V] = field(default_factory=dict)
    errors: dict[K, DMQError] = field(default_factory=dict)


def fan_out_by_leader(
    keys: Iterable[K],
    *,
    route: Callable[[list[K], float], tuple[Mapping[R, list[K]], Mapping[K, DMQError]]],
    send: Callable[[R, list[K], float], PendingCall[A]],
    parse: Callable[[A, R], Mapping[K, V | DMQError]],
    error: Callable[[grpc.RpcError, R, list[K]], DMQError],
    policy: RetryPolicy,
    deadline: float,
    what: str,
    retriable: Callable[[DMQError, int], bool] = lambda e, retry: e.retriable,
    on_retry: Callable[[Mapping[K, DMQError]], None] | None = None,
    call_cap_s: float | None = None,
) -> FanOut[K, V]:
    """One call per route (a leader's address, or (topic, address)) for `keys`, all in flight
    together, until every key has an answer, a key failed with an error not `retriable(error,
    retries so far)` (the others are still asked again), or the next pause would end past
    `deadline`. Never raises for a key: the FanOut says what each got.

    `route(keys, timeout_s)` groups keys by leader (and says which have none); `send` starts one
    call (a grpc Future: result() waits for it, so this is for the sync client); `parse` turns its answer into each key's value or DMQError; `error`
    turns a failed call into the error of all its keys. Before a retry `on_retry(errors)` is told
    (the caller marks stale metadata) and only the retriable keys are asked again."""
    out: FanOut[K, V] = FanOut()
    final: dict[K, DMQError] = {}  # keys that failed for good (not retriable)
    pending = list(dict.fromkeys(keys))
    retry = 0
    while True:
        groups, lookup_errors = route(pending, call_timeout_s(deadline, call_cap_s))
        errors: dict[K, DMQError] = dict(lookup_errors)
        calls = []
        for r, part in groups.items():
            try:
                calls.append((r, part, send(r, part, call_timeout_s(deadline, call_cap_s))))
            except (DMQError, ValueError) as e:  # ValueError: a closed channel
                errors.update(dict.fromkeys(part, e if isinstance(e, DMQError) else DMQError(f"{what}: not sent ({e})")))
        for r, part, future in calls:
            try:
                answers = parse(future.result(), r)
            except grpc.RpcError as e:
                errors.update(dict.fromkeys(part, error(e, r, part)))
                continue
            except CALL_CANCELLED:
                errors.update(dict.fromkeys(part, DMQError(f"{what}: cancelled (the client closed)")))
                continue
            for k in part:
                answer = answers.get(k)
                if isinstance(answer, DMQError):
                    errors[k] = answer
                elif k in answers:
                    out.done[k] = answer  # type: ignore[assignment]
                else:
                    errors[k] = UnknownServerError(f"{what}: {r} did not answer for {k}")
        again = {k: e for k, e in errors.items() if retriable(e, retry)}
        final.update((k, e) for k, e in errors.items() if k not in again)
        out.errors = {**final, **again}
        retry += 1
        if not again:
            return out
        pause_s = policy.backoff_s(retry)
        if time.monotonic() + pause_s >= deadline:
            return out
        if on_retry is not None:
            on_retry(again)
        log.debug("retrying", what=what, keys=len(again), error=str(next(iter(again.values()))),
                  retry_in_ms=int(pause_s * 1000))
        time.sleep(pause_s)
        pending = list(again)
