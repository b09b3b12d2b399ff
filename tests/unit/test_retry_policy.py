"""The client's one retry policy (dmq.client._calls): backoff growth, cap, jitter, deadline, and the
retry loop every call shape is built on. Pure: no servers, no real sleeps."""

from __future__ import annotations

import random
import time

import pytest

from dmq.client._calls import RetryPolicy, retry_call, retry_call_async
from dmq.client.errors import BrokerUnavailableError, DMQError, TopicNotFoundError


def test_backoff_doubles_from_retry_backoff_ms_without_jitter() -> None:
    policy = RetryPolicy(retry_backoff_ms=100, retry_backoff_max_ms=10_000, jitter=0.0)
    assert [policy.backoff_s(n) for n in range(1, 6)] == [0.1, 0.2, 0.4, 0.8, 1.6]


def test_backoff_is_capped_at_retry_backoff_max_ms() -> None:
    policy = RetryPolicy(retry_backoff_ms=100, retry_backoff_max_ms=1_000, jitter=0.0)
    assert [policy.backoff_s(n) for n in (4, 5, 6, 50, 10_000)] == [0.8, 1.0, 1.0, 1.0, 1.0]


def test_a_cap_below_the_first_backoff_leaves_the_first_backoff() -> None:
    # Kafka's rule: retry_backoff_max_ms below retry_backoff_ms means no growth, not a shorter pause.
    policy = RetryPolicy(retry_backoff_ms=500, retry_backoff_max_ms=100, jitter=0.0)
    assert [policy.backoff_s(n) for n in (1, 2, 3)] == [0.5, 0.5, 0.5]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_jitter_stays_within_its_bounds_and_varies(seed: int) -> None:
    policy = RetryPolicy(retry_backoff_ms=100, retry_backoff_max_ms=1_000, jitter=0.2, rng=random.Random(seed))
    for retry in range(1, 8):
        base_s = min(1.0, 0.1 * 2 ** (retry - 1))
        pauses = [policy.backoff_s(retry) for _ in range(200)]
        assert all(base_s * 0.8 <= p <= base_s * 1.2 for p in pauses), f"seed {seed}, retry {retry}"
        assert len(set(pauses)) > 1, f"seed {seed}: jitter drew one value 200 times"


def test_deadline_is_request_timeout_ms_after_now_unless_given() -> None:
    policy = RetryPolicy(request_timeout_ms=2_500)
    assert policy.deadline(now=100.0) == 102.5
    assert policy.deadline(0.25, now=100.0) == 100.25
    assert policy.deadline(-1.0, now=100.0) == 100.0  # a negative wait is no wait
    assert policy.timeout_s == 2.5


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"retry_backoff_ms": -1}, "retry_backoff_ms"),
        ({"retry_backoff_max_ms": -1}, "retry_backoff_max_ms"),
        ({"request_timeout_ms": 0}, "request_timeout_ms"),
        ({"jitter": 1.0}, "jitter"),
        ({"jitter": -0.1}, "jitter"),
    ],
)
def test_bad_settings_are_refused_naming_them(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_retry_backoff_counts_from_one() -> None:
    with pytest.raises(ValueError, match="retry counts from 1"):
        RetryPolicy().backoff_s(0)


class _Script:
    """An attempt that fails with the given errors in turn, then returns "ok"; the pauses slept."""

    def __init__(self, *errors: DMQError) -> None:
        self.errors = list(errors)
        self.calls = 0
        self.pauses: list[float] = []

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"

    def sleep(self, pause_s: float) -> None:
        self.pauses.append(pause_s)


def test_retry_call_retries_retriable_errors_with_the_policy_pauses() -> None:
    policy = RetryPolicy(retry_backoff_ms=10, retry_backoff_max_ms=30, jitter=0.0)
    script = _Script(*(BrokerUnavailableError("down") for _ in range(4)))
    told: list[float] = []
    result = retry_call(script, policy=policy, deadline=time.monotonic() + 60, sleep=script.sleep,
                        on_retry=lambda e, pause_s: told.append(pause_s))
    assert result == "ok"
    assert script.calls == 5
    assert script.pauses == told == [0.01, 0.02, 0.03, 0.03]


def test_retry_call_raises_a_non_retriable_error_at_once() -> None:
    script = _Script(TopicNotFoundError("gone"))
    with pytest.raises(TopicNotFoundError):
        retry_call(script, policy=RetryPolicy(), deadline=time.monotonic() + 60, sleep=script.sleep)
    assert (script.calls, script.pauses) == (1, [])


def test_retry_call_gives_up_when_the_next_pause_would_pass_the_deadline() -> None:
    policy = RetryPolicy(retry_backoff_ms=1_000, jitter=0.0)
    script = _Script(BrokerUnavailableError("down"))
    with pytest.raises(BrokerUnavailableError):
        # 0.5 s left, the first pause is 1 s: no retry would finish in time.
        retry_call(script, policy=policy, deadline=time.monotonic() + 0.5, sleep=script.sleep)
    assert (script.calls, script.pauses) == (1, [])


def test_retry_call_makes_at_most_max_attempts_and_stops_when_asked() -> None:
    policy = RetryPolicy(retry_backoff_ms=1, jitter=0.0)
    script = _Script(*(BrokerUnavailableError("down") for _ in range(10)))
    with pytest.raises(BrokerUnavailableError):
        retry_call(script, policy=policy, deadline=time.monotonic() + 60, max_attempts=3, sleep=script.sleep)
    assert script.calls == 3
    stopped = _Script(*(BrokerUnavailableError("down") for _ in range(10)))
    with pytest.raises(BrokerUnavailableError):
        retry_call(stopped, policy=policy, deadline=time.monotonic() + 60, stop=lambda: stopped.calls >= 2,
                   sleep=stopped.sleep)
    assert stopped.calls == 2


def test_retry_call_uses_the_callers_retriable_rule() -> None:
    script = _Script(DMQError("not retriable by class"), DMQError("again"))
    assert retry_call(script, policy=RetryPolicy(retry_backoff_ms=1), deadline=time.monotonic() + 60,
                      retriable=lambda e: True, sleep=script.sleep) == "ok"
    assert script.calls == 3


async def test_the_asyncio_loop_follows_the_same_policy() -> None:
    policy = RetryPolicy(retry_backoff_ms=1, retry_backoff_max_ms=2, jitter=0.0)
    script = _Script(BrokerUnavailableError("down"), BrokerUnavailableError("down"), TopicNotFoundError("gone"))
    told: list[float] = []

    async def attempt() -> str:
        return script()

    with pytest.raises(TopicNotFoundError):
        await retry_call_async(attempt, policy=policy, deadline=time.monotonic() + 60,
                               on_retry=lambda e, pause_s: told.append(pause_s))
    assert script.calls == 3
    assert told == [0.001, 0.002]
