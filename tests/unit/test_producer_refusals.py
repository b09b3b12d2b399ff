"""Issue 13, what the producer makes of a broker's refusals:

- A batch the broker refuses as too large no longer advises "lower the producer's batch_size below
  the topic's max_message_bytes" (the producer never builds a batch over the topic's limit as its
  metadata gives it): the message says the broker's limit is lower than that metadata, the
  metadata is refreshed, and what a record this large needs.
- A RESOURCE_EXHAUSTED carrying a reason (disk-full, server-busy, or one this client does not
  know) is never taken for a batch too large and never gets that advice.
- acks=0 batches dropped after an error answer are counted in metrics()["records_failed"].
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from test_producer_unit import WAIT_S, FakeBroker, FakeRpcError, make_producer, wait_until

from dmq.client import errors
from dmq.proto import error_details

OLD_ADVICE = "batch_size"


def exhausted(reason: str | None, details: str = "no room") -> FakeRpcError:
    return FakeRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, details, reason)


def test_a_batch_too_large_says_what_to_do_and_refreshes_the_metadata() -> None:
    broker = FakeBroker(script=[exhausted(None, "batch is 2000 bytes; the limit (max_batch_bytes) is 1024")])
    with make_producer(broker, retry_backoff_ms=1) as p:
        h = p.send("t", b"x" * 100)
        p.flush(WAIT_S)
        with pytest.raises(errors.RecordTooLargeError) as info:
            h.get(0)
        cluster = p.cluster
    message = str(info.value)
    assert OLD_ADVICE not in message, message
    assert "the limit (max_batch_bytes) is 1024" in message  # the broker's own words
    assert "1 records" in message and "max_message_bytes on the topic" in message
    assert "t" in cluster.invalidated  # type: ignore[attr-defined]  # later batches use the new limit
    assert len(broker.calls) == 1  # not retried


@pytest.mark.parametrize("reason", [error_details.DISK_FULL, error_details.BUSY])
def test_a_known_reason_is_retried_and_never_told_to_lower_batch_size(reason: str) -> None:
    broker = FakeBroker(script=[exhausted(reason)] * 1000)
    with make_producer(broker, retry_backoff_ms=5, retry_backoff_max_ms=5, delivery_timeout_ms=2000,
                       request_timeout_ms=50) as p:
        with pytest.raises(errors.DMQTimeoutError) as info:
            p.send("t", b"a").get(WAIT_S)
    assert "no room" in str(info.value) and OLD_ADVICE not in str(info.value)
    assert len(broker.calls) > 1


def test_an_unknown_reason_is_resource_exhausted_not_too_large() -> None:
    broker = FakeBroker(script=[exhausted("some-later-reason")])
    with make_producer(broker, retry_backoff_ms=1) as p:
        h = p.send("t", b"a")
        p.flush(WAIT_S)
        with pytest.raises(errors.ResourceExhaustedError) as info:
            h.get(0)
        cluster = p.cluster
    assert not isinstance(info.value, errors.RecordTooLargeError)
    assert OLD_ADVICE not in str(info.value) and "no room" in str(info.value)
    assert cluster.invalidated == []  # type: ignore[attr-defined]


def test_acks_0_batches_dropped_after_an_error_are_counted_as_failed() -> None:
    broker = FakeBroker(script=[exhausted(error_details.DISK_FULL), None, exhausted(None, "too large")])
    with make_producer(broker, acks=0, enable_idempotence=False) as p:
        for i in range(3):
            h = p.send("t", b"v%d" % i)
            assert h.get(WAIT_S).offset == -1  # acks=0: resolved once handed to gRPC
            wait_until(lambda n=i + 1: len(broker.calls) == n)
        wait_until(lambda: p.metrics()["incomplete_batches"] == 0)
        assert p.metrics()["records_failed"] == 2


def test_an_acks_0_batch_not_sent_yet_is_retried_or_fails_its_handle() -> None:
    """No leader to send to: the batch never reached gRPC, so it is retried like any batch, and
    when that fails its handle (not yet resolved) fails rather than reporting it sent."""
    broker = FakeBroker()
    with make_producer(broker, acks=0, enable_idempotence=False, retry_backoff_ms=1, delivery_timeout_ms=300,
                       request_timeout_ms=100) as p:
        cluster = p.cluster
        leader_for = cluster.leader_for  # type: ignore[attr-defined]
        failures = [errors.BrokerUnavailableError("no live leader for t[0]")]

        def flaky_leader(topic: str, partition: int, **kwargs: Any) -> str:
            if failures:
                raise failures.pop()
            return leader_for(topic, partition, **kwargs)  # type: ignore[no-any-return]

        cluster.leader_for = flaky_leader  # type: ignore[attr-defined]
        assert p.send("t", b"a").get(WAIT_S).offset == -1
        assert len(broker.calls) == 1 and p.metrics()["records_failed"] == 0

        def no_leader(topic: str, partition: int, **kwargs: Any) -> str:
            raise errors.BrokerUnavailableError(f"no live leader for {topic}[{partition}]")

        cluster.leader_for = no_leader  # type: ignore[attr-defined]
        with pytest.raises(errors.DMQTimeoutError, match="delivery_timeout_ms"):
            p.send("t", b"b").get(WAIT_S)
        assert p.metrics()["records_failed"] == 1
    assert len(broker.calls) == 1
