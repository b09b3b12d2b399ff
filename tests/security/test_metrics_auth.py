"""Refused calls on /metrics (issue 29): dmq_auth_failures_total counts authentication and
authorization failures, and the RPC histogram has them under their codes, over a real secured server."""

from __future__ import annotations

import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto.grpc_options import channel_options
from dmq.proto.security.settings import sync_channel
from tests.security.conftest import tls_client, token_for

pytestmark = pytest.mark.timeout(60)


def _list_topics(bootstrap: str, security) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    channel = sync_channel(bootstrap, security, channel_options())
    try:
        pb_grpc.MetadataStub(channel).ListTopics(pb.ListTopicsRequest(), timeout=5)
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        return e.code()
    finally:
        channel.close()


def _samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_auth_failures_are_counted_by_kind(secure_cluster, certs):  # type: ignore[no-untyped-def]
    c = secure_cluster("tokens", metrics_port=0)
    [endpoint] = c.cluster.metrics_endpoints
    before = _samples(endpoint.url)
    assert before[("dmq_auth_failures_total", (("kind", "authentication"),))] == 0
    assert before[("dmq_auth_failures_total", (("kind", "authorization"),))] == 0

    assert _list_topics(c.bootstrap, tls_client(certs)) is grpc.StatusCode.UNAUTHENTICATED
    assert _list_topics(c.bootstrap, tls_client(certs, token="garbage")) is grpc.StatusCode.UNAUTHENTICATED
    assert _list_topics(c.bootstrap, tls_client(certs, token=token_for("alice"))) is grpc.StatusCode.PERMISSION_DENIED
    assert _list_topics(c.bootstrap, tls_client(certs, token=token_for("admin"))) is grpc.StatusCode.OK

    after = _samples(endpoint.url)
    assert after[("dmq_auth_failures_total", (("kind", "authentication"),))] == 2
    assert after[("dmq_auth_failures_total", (("kind", "authorization"),))] == 1
    count = "dmq_rpc_server_duration_seconds_count"
    assert after[(count, (("code", "UNAUTHENTICATED"), ("method", "ListTopics")))] == 2
    assert after[(count, (("code", "PERMISSION_DENIED"), ("method", "ListTopics")))] == 1
    assert after[(count, (("code", "OK"), ("method", "ListTopics")))] == 1


def test_quota_throttle_time_is_counted(secure_cluster, certs):  # type: ignore[no-untyped-def]
    from dmq.proto.server.security.quotas import QuotaSettings, Rates

    # One request a second, a bucket of one: on one channel, calls after the first two each wait
    # about a second (the debt grows by what each arrives early), however fast the machine is.
    c = secure_cluster("tokens", metrics_port=0, quotas=QuotaSettings(principals={"admin": Rates(requests_per_s=1)}))
    [endpoint] = c.cluster.metrics_endpoints
    assert _samples(endpoint.url)[("dmq_quota_throttle_seconds_total", (("kind", "requests"),))] == 0
    channel = sync_channel(c.bootstrap, tls_client(certs, token=token_for("admin")), channel_options())
    try:
        stub = pb_grpc.MetadataStub(channel)
        for _ in range(3):
            stub.ListTopics(pb.ListTopicsRequest(), timeout=10)  # delayed, never refused
    finally:
        channel.close()
    after = _samples(endpoint.url)
    assert after[("dmq_quota_throttle_seconds_total", (("kind", "requests"),))] > 0
    assert after[("dmq_quota_throttle_seconds_total", (("kind", "produce"),))] == 0
