"""Issue 15, the client's part: an acks=all produce refused with NOT_ENOUGH_REPLICAS is retried
(the leader is right: no metadata refresh), and a "not leader" answer refreshes the leaders."""

from __future__ import annotations

import grpc
from test_producer_unit import WAIT_S, FakeBroker, make_producer
from test_storage_errors import RpcErrorWithReason

from dmq.client import errors
from dmq.proto import error_details


def not_enough_replicas() -> RpcErrorWithReason:
    return RpcErrorWithReason(grpc.StatusCode.UNAVAILABLE, "t[0] on broker 1: 1 in-sync replicas [1], "
                              "min_insync_replicas is 2; acks=all refused", error_details.NOT_ENOUGH_REPLICAS)


def test_not_enough_replicas_is_retriable_and_keeps_the_leader() -> None:
    err = errors.from_rpc_error(not_enough_replicas())
    assert type(err) is errors.NotEnoughReplicasError and err.retriable and not err.invalid_metadata
    broker = FakeBroker()
    broker.script = [not_enough_replicas()] * 2
    with make_producer(broker, retry_backoff_ms=1, retry_backoff_max_ms=5) as p:
        assert p.send("t", b"x").get(WAIT_S).offset == 0
        cluster = p.cluster
    assert len(broker.calls) == 3
    assert len({c.request.batch for c in broker.calls}) == 1  # the same batch, same sequence
    assert cluster.invalidated == []  # type: ignore[attr-defined]


def test_not_leader_refreshes_the_leaders_and_retries() -> None:
    broker = FakeBroker()
    broker.script = [RpcErrorWithReason(grpc.StatusCode.UNAVAILABLE, "broker 1 does not lead t[0]; the leader is "
                                        "127.0.0.1:9", None)]
    with make_producer(broker, retry_backoff_ms=1) as p:
        assert p.send("t", b"x").get(WAIT_S).offset == 0
        cluster = p.cluster
    assert len(broker.calls) == 2
    assert cluster.invalidated == ["t"]  # type: ignore[attr-defined]
