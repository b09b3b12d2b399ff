"""Security settings of servers and clients, and the gRPC credentials and channels made from them.

Both sides live here (DESIGN.md "Layout": credentials loading is part of the contract), so the
broker, the coordinator, the client library and the CLI build their channels the same way.

ClientSecurity (what a client, or a node calling another node, presents):
  - ssl_cafile: the CA that signed the servers' certificates; any ssl_* setting turns TLS on
    (with none of the three files given but TLS asked for, the system's roots are used);
  - ssl_certfile + ssl_keyfile: a client certificate, for servers that verify them (mutual TLS);
  - token: a signed JWT (dmq.proto.security.tokens), sent with every call as
    ``authorization: Bearer <token>`` metadata; or token_source, a callable asked per call (the
    nodes' own cluster token, re-minted before it expires).
  From the environment (ClientSecurity.from_env): DMQ_TOKEN, DMQ_SSL_CAFILE, DMQ_SSL_CERTFILE,
  DMQ_SSL_KEYFILE; explicit settings win over the environment, setting by setting.

ServerSecurity (what a server port requires):
  - tls_certfile + tls_keyfile: TLS on the port;
  - tls_cafile: the cluster's CA. It verifies the other nodes' certificates (the node's own calls)
    and, with require_client_cert, client certificates: every client must present one (mutual TLS;
    a client without one fails the TLS handshake, UNAVAILABLE, before any call is made). There is no
    "optional" client certificate: grpcio's server credentials either require one or never ask.
    (grpcio 1.85: ssl_server_credentials(require_client_auth=) and dynamic_ssl_server_credentials
    pass a bool that cygrpc maps to the C core's REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY or
    DONT_REQUEST_CLIENT_CERTIFICATE; REQUEST_CLIENT_CERTIFICATE_AND_VERIFY, which would let a call
    without a certificate reach the interceptor, is not reachable from Python.) So on a mutual-TLS
    port every client presents a certificate, and a token it also sends names its principal;
  - token_secret (HS256) or token_public_key (a PEM file: RS256 / ES256): tokens are accepted;
    token_leeway_s (default 30): a token is accepted until its exp plus this many seconds, for
    clocks of issuer and server that differ;
  - super_users: principals allowed everything a client may do (bootstrap ACLs with them);
  - cluster_principal: the nodes' own principal, the only one that may call the cluster-internal
    RPCs. Nodes present it with the server certificate (mutual TLS: its common name) or a token
    (cluster_token, or minted from token_secret);
  - insecure: allow binding a non-loopback address without TLS and authentication.
  Authentication is on when tokens or client certificates are accepted; then every call must
  name a principal and every RPC is authorized against the ACLs (dmq.proto.server.security.interceptor).
"""

from __future__ import annotations

import ipaddress
import os
import pathlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from dmq.proto.security.token_channels import AUTHORIZATION_KEY, BEARER, AioTokenChannel, CallToken, SyncTokenChannel
from dmq.proto.security.tokens import DEFAULT_CLUSTER_TOKEN_TTL_S, LEEWAY_S, check_leeway, create_token

__all__ = [
    "AUTHORIZATION_KEY",
    "BEARER",
    "ClientSecurity",
    "DEFAULT_CLUSTER_PRINCIPAL",
    "ENV_NAMES",
    "SecurityConfigError",
    "ServerSecurity",
    "aio_channel",
    "is_loopback",
    "sync_channel",
]

DEFAULT_CLUSTER_PRINCIPAL = "dmq-cluster"
# Client settings by environment variable: what a shell, a container or a Spark executor sets once.
ENV_NAMES = {
    "token": "DMQ_TOKEN",
    "ssl_cafile": "DMQ_SSL_CAFILE",
    "ssl_certfile": "DMQ_SSL_CERTFILE",
    "ssl_keyfile": "DMQ_SSL_KEYFILE",
}
MAX_PEM_BYTES = 1 << 20  # a certificate chain or key; a bigger file is a wrong path


class SecurityConfigError(ValueError):
    """A security setting that cannot work (a missing file, a key without a certificate, ...)."""


def read_pem(path: str | os.PathLike[str], setting: str) -> bytes:
    """The bytes of a PEM file named by `setting`, or SecurityConfigError naming both."""
    p = pathlib.Path(path)
    try:
        if p.stat().st_size > MAX_PEM_BYTES:
            raise SecurityConfigError(f"{setting}: {p} is larger than {MAX_PEM_BYTES} bytes; is it a PEM file?")
        data = p.read_bytes()
    except OSError as e:
        raise SecurityConfigError(f"{setting}: cannot read {p} ({e.strerror or e})") from None
    if b"-----BEGIN" not in data:
        raise SecurityConfigError(f"{setting}: {p} is not a PEM file (no '-----BEGIN' line)")
    return data


def is_loopback(host: str) -> bool:
    """Whether a listening host is reachable only from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# -- clients --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClientSecurity:
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    token: str | None = field(default=None, repr=False)
    use_tls: bool = False  # TLS with the system's roots when no ssl_* file is given
    token_source: Callable[[], str] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise SecurityConfigError("ssl_certfile and ssl_keyfile go together (a client certificate and its key)")
        if self.token is not None and (not isinstance(self.token, str) or not self.token.strip()):
            raise SecurityConfigError("token must be a non-empty string (a JWT from `dmq tokens create`)")

    def __repr__(self) -> str:
        shown = [f"{k}={v!r}" for k, v in (("ssl_cafile", self.ssl_cafile), ("ssl_certfile", self.ssl_certfile)) if v]
        if self.token or self.token_source:
            shown.append("token=<hidden>")
        return f"<ClientSecurity tls={self.tls} {' '.join(shown)}>".replace(" >", ">")

    @property
    def tls(self) -> bool:
        return self.use_tls or any((self.ssl_cafile, self.ssl_certfile, self.ssl_keyfile))

    @property
    def has_token(self) -> bool:
        return self.token is not None or self.token_source is not None

    @classmethod
    def from_settings(
        cls, settings: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
    ) -> ClientSecurity | None:
        """From explicit settings (names as ENV_NAMES' keys; None = not given) over the
        environment's; None when neither names anything (a plain channel)."""
        env = os.environ if env is None else env
        given = {k: v for k, v in (settings or {}).items() if v is not None}
        values: dict[str, Any] = {}
        for name, var in ENV_NAMES.items():
            value = given.get(name, env.get(var) or None)
            if value is not None:
                if not isinstance(value, (str, os.PathLike)):
                    raise SecurityConfigError(f"{name} must be a string, got {type(value).__name__}")
                values[name] = os.fspath(value)
        protocol = given.get("security_protocol")
        if protocol is not None:
            if protocol not in ("PLAINTEXT", "SSL"):
                raise SecurityConfigError(f"security_protocol must be 'PLAINTEXT' or 'SSL', got {protocol!r}")
            if protocol == "PLAINTEXT" and any(k.startswith("ssl_") for k in values):
                raise SecurityConfigError("security_protocol 'PLAINTEXT' contradicts the ssl_* settings given")
            values["use_tls"] = protocol == "SSL"
        return cls(**values) if values else None

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=read_pem(self.ssl_cafile, "ssl_cafile") if self.ssl_cafile else None,
            private_key=read_pem(self.ssl_keyfile, "ssl_keyfile") if self.ssl_keyfile else None,
            certificate_chain=read_pem(self.ssl_certfile, "ssl_certfile") if self.ssl_certfile else None,
        )

    def call_token(self) -> CallToken | None:
        """What a channel adds to every call (dmq.proto.security.token_channels); None: no token."""
        if self.token_source is not None:
            return CallToken(source=self.token_source)
        return CallToken(self.token) if self.token is not None else None


def sync_channel(
    address: str, security: ClientSecurity | None, options: Sequence[tuple[str, Any]] = ()
) -> grpc.Channel:
    """A synchronous channel to `address` with the security's TLS and token (plain without)."""
    if security is None:
        return grpc.insecure_channel(address, options=list(options))
    if security.tls:
        channel = grpc.secure_channel(address, security.channel_credentials(), options=list(options))
    else:
        channel = grpc.insecure_channel(address, options=list(options))
    token = security.call_token()
    return channel if token is None else SyncTokenChannel(channel, token)


def aio_channel(
    address: str, security: ClientSecurity | None, options: Sequence[tuple[str, Any]] = ()
) -> grpc.aio.Channel:
    """A grpc.aio channel to `address` with the security's TLS and token (plain without)."""
    if security is None:
        return grpc.aio.insecure_channel(address, options=list(options))
    if security.tls:
        channel = grpc.aio.secure_channel(address, security.channel_credentials(), options=list(options))
    else:
        channel = grpc.aio.insecure_channel(address, options=list(options))
    token = security.call_token()
    return channel if token is None else AioTokenChannel(channel, token)


# -- servers --------------------------------------------------------------------------------------


class _ClusterTokens:
    """The nodes' own token, minted from the shared secret and re-minted at half its life."""

    def __init__(self, principal: str, secret: str, ttl_s: int = DEFAULT_CLUSTER_TOKEN_TTL_S) -> None:
        self._principal = principal
        self._secret = secret
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._token = ""
        self._renew_at = 0.0

    def __call__(self) -> str:
        now = time.time()
        if now >= self._renew_at:
            with self._lock:
                if now >= self._renew_at:
                    self._token = create_token(self._principal, secret=self._secret, ttl_s=self._ttl_s)
                    self._renew_at = now + self._ttl_s / 2
        return self._token


@dataclass(frozen=True)
class ServerSecurity:
    tls_certfile: str | None = None
    tls_keyfile: str | None = None
    tls_cafile: str | None = None
    require_client_cert: bool = False
    token_secret: str | None = field(default=None, repr=False)
    token_public_key: str | None = None
    super_users: frozenset[str] = frozenset()
    cluster_principal: str = DEFAULT_CLUSTER_PRINCIPAL
    cluster_token: str | None = field(default=None, repr=False)
    insecure: bool = False
    token_leeway_s: int = LEEWAY_S
    _tokens: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if (self.tls_certfile is None) != (self.tls_keyfile is None):
            raise SecurityConfigError("the server certificate and its key go together (tls_certfile and tls_keyfile)")
        if self.verifies_client_certs and not (self.tls and self.tls_cafile):
            raise SecurityConfigError(
                "client certificates (mutual TLS) need TLS (tls_certfile, tls_keyfile) and tls_cafile, "
                "the CA that signs the client certificates"
            )
        if self.token_secret is not None and self.token_public_key is not None:
            raise SecurityConfigError("give token_secret (HS256) or token_public_key (RS256/ES256), not both")
        if self.token_secret is not None and len(self.token_secret) < 32:
            raise SecurityConfigError("token_secret must be at least 32 characters (an HS256 key shorter is guessable)")
        try:
            check_leeway(self.token_leeway_s)
        except ValueError as e:
            raise SecurityConfigError(str(e)) from None
        if not self.cluster_principal:
            raise SecurityConfigError("cluster_principal must not be empty")
        if self.cluster_principal in self.super_users:
            raise SecurityConfigError(
                f"{self.cluster_principal!r} is the cluster principal; super_users are client principals"
            )
        if self.token_secret is not None:
            object.__setattr__(self, "_tokens", _ClusterTokens(self.cluster_principal, self.token_secret))

    @property
    def tls(self) -> bool:
        return self.tls_certfile is not None

    @property
    def verifies_client_certs(self) -> bool:
        return self.require_client_cert

    @property
    def accepts_tokens(self) -> bool:
        return self.token_secret is not None or self.token_public_key is not None

    @property
    def authenticates(self) -> bool:
        """Whether calls must name a principal (and are then authorized against the ACLs)."""
        return self.accepts_tokens or self.verifies_client_certs

    def server_credentials(self) -> grpc.ServerCredentials | None:
        if not self.tls:
            return None
        assert self.tls_certfile is not None and self.tls_keyfile is not None
        pair = (read_pem(self.tls_keyfile, "tls_keyfile"), read_pem(self.tls_certfile, "tls_certfile"))
        return grpc.ssl_server_credentials(
            [pair],
            # Given, gRPC asks clients for a certificate and verifies any presented against it.
            root_certificates=read_pem(self.tls_cafile, "tls_cafile")
            if self.tls_cafile and self.verifies_client_certs else None,
            require_client_auth=self.require_client_cert,
        )

    def cluster_client(self) -> ClientSecurity | None:
        """What this node presents when it calls another node (None: a plain channel)."""
        if not self.tls and not self.authenticates:
            return None
        mutual = self.verifies_client_certs
        source = self._tokens if self.cluster_token is None else None
        if self.authenticates and not mutual and self.cluster_token is None and source is None:
            raise SecurityConfigError(
                "the nodes need a credential of their own: with token_public_key give cluster_token "
                "(a token for the cluster principal), or use mutual TLS"
            )
        return ClientSecurity(
            ssl_cafile=self.tls_cafile if self.tls else None,
            ssl_certfile=self.tls_certfile if mutual else None,
            ssl_keyfile=self.tls_keyfile if mutual else None,
            token=self.cluster_token,
            use_tls=self.tls,
            token_source=source if self.accepts_tokens else None,
        )

    def check_bind(self, host: str) -> str | None:
        """Refuse (SecurityConfigError) to listen on a non-loopback host without TLS and
        authentication unless `insecure`; with it, the warning to log. None when all is well."""
        if is_loopback(host) or (self.tls and self.authenticates):
            return None
        missing = " and ".join(w for w, on in (("TLS", self.tls), ("authentication", self.authenticates)) if not on)
        if not self.insecure:
            raise SecurityConfigError(
                f"listening on {host} without {missing} lets anyone who reaches the port do anything; "
                "configure them (see README 'Securing a cluster') or pass --insecure"
            )
        return f"listening on {host} without {missing} (--insecure): anyone who reaches the port can do anything"
