"""Fixtures of the security tests: development certificates, secrets, and secured clusters.

Certificates are made once per session (a CA, the servers' certificate, clients "admin", "alice"
and "bob", and a second CA with its own "mallory" client, whose certificate the cluster must
refuse). Clusters are real servers on loopback (ClusterThread), as everywhere in the suite.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable

import pytest

from dmq.client.cli._certs import create_ca, create_dev_certs, issue
from dmq.client.cli.runner import ClusterThread
from dmq.proto.security.settings import ClientSecurity, ServerSecurity
from dmq.proto.security.tokens import create_token

SECRET = "s3cret-for-tests-only-0123456789abcdef"
SUPER = "admin"


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("certs")
    create_dev_certs(directory, clients=("admin", "alice", "bob"))
    other = directory / "other"
    other.mkdir()
    _ca, ca_cert, ca_key = create_ca(other, "another CA")
    issue(other, "mallory", "admin", ca_cert, ca_key)  # claims to be admin, signed by a stranger
    return directory


def token_for(principal: str, ttl_s: int = 3600, secret: str = SECRET) -> str:
    return create_token(principal, ttl_s=ttl_s, secret=secret)


def tls_client(certs: pathlib.Path, name: str | None = None, token: str | None = None) -> ClientSecurity:
    """Client settings: the cluster's CA, the named client certificate (if any) and a token."""
    return ClientSecurity(
        ssl_cafile=str(certs / "ca.pem"),
        ssl_certfile=str(certs / f"{name}.pem") if name else None,
        ssl_keyfile=str(certs / f"{name}.key") if name else None,
        token=token,
    )


def server_security(certs: pathlib.Path, mode: str, super_users: frozenset[str] = frozenset({SUPER})) -> ServerSecurity:
    """mode: "plain" (nothing), "tls" (TLS only), "tokens" (TLS + HS256 tokens), "mtls" (mutual TLS,
    certificates required)."""
    tls = dict(tls_certfile=str(certs / "server.pem"), tls_keyfile=str(certs / "server.key"),
               tls_cafile=str(certs / "ca.pem"))
    if mode == "plain":
        return ServerSecurity()
    if mode == "tls":
        return ServerSecurity(**tls)
    if mode == "tokens":
        return ServerSecurity(**tls, token_secret=SECRET, super_users=super_users)
    if mode == "mtls":
        return ServerSecurity(**tls, require_client_cert=True, super_users=super_users)
    raise ValueError(mode)


def client_as(certs: pathlib.Path, mode: str, principal: str | None) -> ClientSecurity | None:
    """How `principal` (None: no credentials) connects to a cluster of `mode`."""
    if mode == "plain":
        return None
    if mode == "tls":
        return tls_client(certs)
    if mode == "tokens":
        return tls_client(certs, token=token_for(principal) if principal else None)
    return tls_client(certs, name=principal)  # mtls, certs


@pytest.fixture
def secure_cluster(
    cluster_factory: Callable[..., ClusterThread], certs: pathlib.Path
) -> Callable[..., ClusterThread]:
    """secure_cluster(mode, **options) -> a started ClusterThread, stopped after the test (the
    suite's cluster_factory, with the mode's server security)."""

    def make(mode: str, **kwargs: object) -> ClusterThread:
        security = kwargs.pop("security", None) or server_security(certs, mode)
        return cluster_factory(security=security, **kwargs)

    return make
