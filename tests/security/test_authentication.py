"""Authentication (slice 2 of issue 18): tokens and client certificates name the principal.

Refusals are UNAUTHENTICATED with a reason a person can act on, and never contain the token.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import jwt
import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from dmq.client import AdminClient
from dmq.client.cli import cli
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto.grpc_options import channel_options
from dmq.proto.security.settings import ServerSecurity, sync_channel
from dmq.proto.security.tokens import AuthenticationError, TokenVerifier, create_token, parse_duration_s
from dmq.proto.server.security.interceptor import SecurityInterceptor
from tests.security.conftest import SECRET, client_as, tls_client, token_for

pytestmark = pytest.mark.timeout(60)


def _list_topics(bootstrap: str, security) -> grpc.RpcError | pb.ListTopicsResponse:
    channel = sync_channel(bootstrap, security, channel_options())
    try:
        return pb_grpc.MetadataStub(channel).ListTopics(pb.ListTopicsRequest(), timeout=5)
    except grpc.RpcError as e:
        return e
    finally:
        channel.close()


def _refused(answer, code=grpc.StatusCode.UNAUTHENTICATED) -> str:
    assert isinstance(answer, grpc.RpcError), answer
    assert answer.code() is code, (answer.code(), answer.details())
    return answer.details()


def test_tokens_name_the_principal_and_bad_tokens_are_refused(secure_cluster, certs):
    c = secure_cluster("tokens", brokers=2, shared_port=False)  # nodes authenticate with minted tokens
    assert isinstance(_list_topics(c.bootstrap, tls_client(certs, token=token_for("admin"))), pb.ListTopicsResponse)

    assert "no credentials" in _refused(_list_topics(c.bootstrap, tls_client(certs)))
    expired = create_token("admin", ttl_s=60, secret=SECRET, now_s=time.time() - 3600)
    assert "expired" in _refused(_list_topics(c.bootstrap, tls_client(certs, token=expired)))
    forged = create_token("admin", ttl_s=60, secret="another-secret-of-at-least-32-chars!!")
    details = _refused(_list_topics(c.bootstrap, tls_client(certs, token=forged)))
    assert "signature" in details and forged not in details
    unsigned = jwt.encode({"sub": "admin", "exp": int(time.time()) + 60}, None, algorithm="none")
    assert "not signed with HS256" in _refused(_list_topics(c.bootstrap, tls_client(certs, token=unsigned)))
    no_exp = jwt.encode({"sub": "admin"}, SECRET, algorithm="HS256")
    assert "'exp'" in _refused(_list_topics(c.bootstrap, tls_client(certs, token=no_exp)))
    assert "not a valid JWT" in _refused(_list_topics(c.bootstrap, tls_client(certs, token="garbage")))

    # A client that is authenticated but not allowed gets PERMISSION_DENIED, not UNAUTHENTICATED.
    _refused(_list_topics(c.bootstrap, tls_client(certs, token=token_for("alice"))), grpc.StatusCode.PERMISSION_DENIED)


def test_client_certificate_names_the_principal(secure_cluster, certs):
    c = secure_cluster("mtls")
    assert isinstance(_list_topics(c.bootstrap, client_as(certs, "mtls", "admin")), pb.ListTopicsResponse)
    details = _refused(_list_topics(c.bootstrap, client_as(certs, "mtls", "alice")), grpc.StatusCode.PERMISSION_DENIED)
    assert "'alice'" in details


def test_clients_raise_authentication_errors_with_the_reason(secure_cluster, certs):
    c = secure_cluster("tokens")
    expired = create_token("admin", ttl_s=60, secret=SECRET, now_s=time.time() - 3600)
    with AdminClient(c.bootstrap, ssl_cafile=str(certs / "ca.pem"), token=expired) as admin:
        with pytest.raises(Exception, match="expired") as info:
            admin.list_topics()
    assert expired not in str(info.value)


@pytest.mark.parametrize("kind", ["rsa", "ec"])
def test_public_key_tokens_and_the_public_key_cannot_forge_hs256(kind):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048) if kind == "rsa" else ec.generate_private_key(ec.SECP256R1())
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    verifier = TokenVerifier(public_key_pem=public)
    assert verifier.principal(create_token("alice", ttl_s=60, private_key_pem=private)) == "alice"
    # The classic confusion attack: an HS256 token "signed" with the public key as the secret.
    confused = jwt.encode({"sub": "admin", "exp": int(time.time()) + 60}, "x" * 40, algorithm="HS256")
    with pytest.raises(AuthenticationError, match="not signed with"):
        verifier.principal(confused)


def test_authenticate_decisions_without_a_server(certs):
    i = SecurityInterceptor(ServerSecurity(token_secret=SECRET, tls_cafile=str(certs / "ca.pem"), require_client_cert=True,
                                           tls_certfile=str(certs / "server.pem"), tls_keyfile=str(certs / "server.key")))
    token = token_for("alice")
    assert i.authenticate((("authorization", f"Bearer {token}"),), None) == "alice"
    assert i.authenticate((), {"x509_common_name": [b"bob"]}) == "bob"
    # The token wins over a certificate: it names the principal explicitly.
    assert i.authenticate((("authorization", f"Bearer {token}"),), {"x509_common_name": [b"bob"]}) == "alice"
    with pytest.raises(AuthenticationError, match="more than one"):
        i.authenticate((("authorization", f"Bearer {token}"), ("authorization", f"Bearer {token}")), None)
    with pytest.raises(AuthenticationError, match="Bearer"):
        i.authenticate((("authorization", token),), None)
    with pytest.raises(AuthenticationError, match="longer than"):
        i.authenticate((("authorization", "Bearer " + "a" * 9000),), None)


def test_dmq_tokens_create_issues_a_token_the_cluster_accepts(tmp_path):
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET)
    result = CliRunner().invoke(cli, ["tokens", "create", "--principal", "alice", "--ttl", "30d",
                                      "--secret-file", str(secret_file)])
    assert result.exit_code == 0, result.output
    claims = jwt.decode(result.output.strip(), SECRET, algorithms=["HS256"])
    assert claims["sub"] == "alice" and abs(claims["exp"] - time.time() - 30 * 86400) < 60
    assert parse_duration_s("15m") == 900
    bad = CliRunner().invoke(cli, ["tokens", "create", "--principal", "alice", "--ttl", "soon",
                                   "--secret-file", str(secret_file)])
    assert bad.exit_code == 2 and "--ttl" in bad.output


def test_dmq_certs_create_makes_a_working_set(tmp_path):
    result = CliRunner().invoke(cli, ["certs", "create", str(tmp_path / "c"), "--client", "carol"])
    assert result.exit_code == 0, result.output
    assert {p.name for p in (tmp_path / "c").iterdir()} == {
        "ca.pem", "ca.key", "server.pem", "server.key", "carol.pem", "carol.key"}
    assert (tmp_path / "c" / "carol.key").stat().st_mode & 0o077 == 0
    again = CliRunner().invoke(cli, ["certs", "create", str(tmp_path / "c")])
    assert again.exit_code == 1 and "already holds a CA" in again.output


def test_token_channels_carry_the_token_on_every_kind_of_call(secure_cluster, certs):
    """Sync and grpc.aio channels, unary and streaming answers; a caller's own `authorization`
    entry is replaced by the channel's token; a token source is asked per call."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from dmq.proto.security.settings import ClientSecurity, aio_channel

    c = secure_cluster("tokens")
    stale = [("authorization", "Bearer " + token_for("alice"))]  # not a super-user: would be refused
    asked = []

    def source() -> str:
        asked.append(1)
        return token_for("admin")

    for security in (tls_client(certs, token=token_for("admin")), ClientSecurity(ssl_cafile=str(certs / "ca.pem"),
                                                                                  token_source=source)):
        channel = sync_channel(c.bootstrap, security, channel_options())
        try:
            assert isinstance(pb_grpc.MetadataStub(channel).ListTopics(pb.ListTopicsRequest(), timeout=5, metadata=stale),
                              pb.ListTopicsResponse)
            future = pb_grpc.MetadataStub(channel).ListTopics.future(pb.ListTopicsRequest(), timeout=5)
            assert isinstance(future.result(), pb.ListTopicsResponse)
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=5)
            assert next(iter(watch)).status == health_pb2.HealthCheckResponse.SERVING
            watch.cancel()
        finally:
            channel.close()

        async def over_aio(security: ClientSecurity = security) -> None:
            channel = aio_channel(c.bootstrap, security, channel_options())
            try:
                answer = await pb_grpc.MetadataStub(channel).ListTopics(pb.ListTopicsRequest(), timeout=5, metadata=stale)
                assert isinstance(answer, pb.ListTopicsResponse)
                watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=5)
                async for event in watch:
                    assert event.status == health_pb2.HealthCheckResponse.SERVING
                    break
                watch.cancel()
            finally:
                await channel.close()

        asyncio.run(over_aio())
    assert len(asked) == 5  # once per call made with the source
