"""Issue 15, the client's part: an acks=all produce refused with NOT_ENOUGH_REPLICAS is retried
(the leader is right: no metadata refresh), and a "not leader" answer refreshes the leaders."""

from __future__ import annotations

import grpc
from test_producer_unit import WAIT_S, FakeBroker, FakeRpcError, make_producer, wait_until

from dmq.client import errors
from dmq.client.producer import Producer
from dmq.proto import error_details


def not_enough_replicas() -> FakeRpcError:
    return FakeRpcError(grpc.StatusCode.UNAVAILABLE, "t[0] on broker 1: 1 in-sync replicas [1], "
                        "min_insync_replicas is 2; acks=all refused", error_details.NOT_ENOUGH_REPLICAS)


def test_not_enough_replicas_is_retriable_and_keeps_the_leader() -> None:
    err = errors.from_rpc_error(not_enough_replicas())
    assert type(err) is errors.NotEnoughReplicasError and err.retriable and not err.invalid_metadata
    broker = FakeBroker(script=[not_enough_replicas()] * 2)
    with make_producer(broker, retry_backoff_ms=1, retry_backoff_max_ms=5) as p:
        assert p.send("t", b"x").get(WAIT_S).offset == 0
        cluster = p.cluster
    assert len(broker.calls) == 3
    assert len({c.request.batch for c in broker.calls}) == 1  # the same batch, same sequence
    assert cluster.invalidated == []  # type: ignore[attr-defined]


def test_not_leader_refreshes_the_leaders_and_retries() -> None:
    broker = FakeBroker(script=[FakeRpcError(grpc.StatusCode.UNAVAILABLE, "broker 1 does not lead t[0]; the leader is "
                                             "127.0.0.1:9", None)])
    with make_producer(broker, retry_backoff_ms=1) as p:
        assert p.send("t", b"x").get(WAIT_S).offset == 0
        cluster = p.cluster
    assert len(broker.calls) == 2
    assert cluster.invalidated == ["t"]  # type: ignore[attr-defined]


def _backing_off_after_not_leader(broker: FakeBroker) -> Producer:
    """A producer whose first send was refused "not leader" and now backs off for 60 s."""
    broker.script = [FakeRpcError(grpc.StatusCode.UNAVAILABLE, "broker 1 does not lead t[0]", None)]
    return make_producer(broker, retry_backoff_ms=60_000, retry_backoff_max_ms=60_000,
                         delivery_timeout_ms=120_000, request_timeout_ms=30_000)


def test_a_new_leader_in_the_metadata_ends_the_backoff_at_once() -> None:
    """A failover: the old leader's "not leader" answer is followed by a long backoff (here 60 s),
    but as soon as the metadata names another live leader the batch goes to it (Kafka's KIP-951).
    Before, the batch waited out the backoff: up to retry_backoff_max_ms added to every failover."""
    broker = FakeBroker()
    with _backing_off_after_not_leader(broker) as p:
        cluster = p.cluster
        handle = p.send("t", b"x")
        wait_until(lambda: cluster.peeks > 0)  # type: ignore[attr-defined]
        assert not handle.done() and len(broker.calls) == 1  # backing off, watching the metadata
        cluster.leader = "fake:3"  # type: ignore[attr-defined]
        assert handle.get(WAIT_S).offset == 0
    assert len(broker.calls) == 2
    assert len({c.request.batch for c in broker.calls}) == 1  # the same batch, same sequence


def test_the_same_leader_in_the_metadata_keeps_the_backoff() -> None:
    broker = FakeBroker()
    with _backing_off_after_not_leader(broker) as p:
        cluster = p.cluster
        handle = p.send("t", b"x")
        wait_until(lambda: cluster.peeks >= 3)  # type: ignore[attr-defined]
        assert not handle.done() and len(broker.calls) == 1
        p.close(0)
