"""TLS on every port, mutual TLS, and the clients' security settings (slice 1 of issue 18)."""

from __future__ import annotations

import pathlib

import grpc
import pytest

from dmq.client import AdminClient, Producer, SimpleConsumer
from dmq.client.errors import DMQError, InvalidConfigError
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto.grpc_options import channel_options
from dmq.proto.security.settings import ClientSecurity, SecurityConfigError, ServerSecurity, sync_channel
from tests.security.conftest import client_as, tls_client

pytestmark = pytest.mark.timeout(60)


def _round_trip(bootstrap: str, security: ClientSecurity | None, topic: str) -> list[bytes]:
    with AdminClient(bootstrap, **_settings(security)) as admin:
        admin.create_topic(topic, partitions=2)
    with Producer(bootstrap, **_settings(security)) as producer:
        for i in range(5):
            producer.send(topic, f"m{i}".encode(), partition=i % 2)
        producer.flush()
    with SimpleConsumer(bootstrap, **_settings(security)) as consumer:
        got = [r.value for p in (0, 1) for r in consumer.consume(topic, p, 0, max_wait_ms=100)]
    return sorted(got)


def _settings(security: ClientSecurity | None) -> dict[str, object]:
    if security is None:
        return {}
    return {k: v for k, v in (("ssl_cafile", security.ssl_cafile), ("ssl_certfile", security.ssl_certfile),
                              ("ssl_keyfile", security.ssl_keyfile), ("token", security.token)) if v}


@pytest.mark.parametrize("brokers", [1, 2])
def test_tls_only_cluster_serves_clients_and_nodes_talk_over_tls(secure_cluster, certs, brokers):
    c = secure_cluster("tls", brokers=brokers, shared_port=brokers == 1)
    assert _round_trip(c.bootstrap, client_as(certs, "tls", None), "tls-t") == [f"m{i}".encode() for i in range(5)]


def test_mutual_tls_cluster_with_separate_brokers(secure_cluster, certs):
    # Brokers register with the coordinator and the coordinator creates partitions on them: both
    # directions over mutual TLS with the server certificate (the cluster principal).
    c = secure_cluster("mtls", brokers=2, shared_port=False)
    assert len(_round_trip(c.bootstrap, client_as(certs, "mtls", "admin"), "mtls-t")) == 5


def test_plain_client_cannot_talk_to_a_tls_port(secure_cluster):
    c = secure_cluster("tls")
    with pytest.raises(DMQError), AdminClient(c.bootstrap, request_timeout_ms=2_000) as admin:
        admin.list_topics()


def test_client_certificate_from_another_ca_is_refused(secure_cluster, certs: pathlib.Path):
    c = secure_cluster("mtls")
    stranger = ClientSecurity(ssl_cafile=str(certs / "ca.pem"), ssl_certfile=str(certs / "other/mallory.pem"),
                              ssl_keyfile=str(certs / "other/mallory.key"))
    channel = sync_channel(c.bootstrap, stranger, channel_options())
    try:
        with pytest.raises(grpc.RpcError) as info:
            pb_grpc.MetadataStub(channel).ListTopics(pb.ListTopicsRequest(), timeout=5)
        assert info.value.code() is grpc.StatusCode.UNAVAILABLE  # the handshake fails: no call at all
    finally:
        channel.close()


def test_environment_variables_configure_every_client(secure_cluster, certs, monkeypatch):
    c = secure_cluster("mtls")
    monkeypatch.setenv("DMQ_SSL_CAFILE", str(certs / "ca.pem"))
    monkeypatch.setenv("DMQ_SSL_CERTFILE", str(certs / "admin.pem"))
    monkeypatch.setenv("DMQ_SSL_KEYFILE", str(certs / "admin.key"))
    with AdminClient(c.bootstrap) as admin:
        admin.create_topic("env-t", partitions=1)
        assert "env-t" in {t.name for t in admin.list_topics()}


def test_bad_security_settings_name_the_setting(tmp_path):
    with pytest.raises(InvalidConfigError, match="ssl_certfile and ssl_keyfile"):
        Producer("127.0.0.1:1", ssl_certfile="x.pem")
    with pytest.raises(InvalidConfigError, match="ssl_cafile: cannot read"):
        AdminClient("127.0.0.1:1", ssl_cafile=str(tmp_path / "missing.pem")).list_topics()
    with pytest.raises(InvalidConfigError, match="security_protocol"):
        SimpleConsumer("127.0.0.1:1", security_protocol="SASL")
    assert "token" not in repr(tls_client(pathlib.Path("/x"), token="abc.def.ghi")).replace("token=<hidden>", "")


def test_non_loopback_bind_needs_tls_and_auth_or_insecure(certs):
    with pytest.raises(SecurityConfigError, match="--insecure"):
        ServerSecurity().check_bind("0.0.0.0")
    assert "insecure" in (ServerSecurity(insecure=True).check_bind("0.0.0.0") or "")
    assert ServerSecurity().check_bind("127.0.0.1") is None
    assert ServerSecurity().check_bind("localhost") is None
