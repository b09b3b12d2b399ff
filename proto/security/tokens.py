"""Signed tokens (JWTs) that name a principal: issuing them and checking them.

A token is a JWT (PyJWT) whose `sub` claim is the principal's name and whose `exp` claim ends it;
both are required. Keys:
  - HS256 with a shared secret (`token_secret`, at least 32 characters): the simple setup; the
    servers can then also mint the cluster's own tokens;
  - RS256 or ES256 with a public key (`token_public_key`): tokens are issued elsewhere, with the
    private key, and a server holding only the public key cannot forge one.
The algorithm is taken from the key, never from the token's header, so an `alg: none` token or an
HS256 token "signed" with the public key is refused.

Errors (AuthenticationError) say what is wrong in words a person can act on ("the token expired
at 2026-01-02T03:04:05Z: get a new one"), and never repeat the token.
"""

from __future__ import annotations

import datetime
import re
import time
from typing import Any

import jwt

__all__ = [
    "AuthenticationError",
    "DEFAULT_CLUSTER_TOKEN_TTL_S",
    "MAX_TOKEN_CHARS",
    "TokenVerifier",
    "check_principal",
    "create_token",
    "parse_duration_s",
]

MAX_TOKEN_CHARS = 8192  # a JWT with a few claims is ~300 characters; more is not a token of ours
MAX_PRINCIPAL_CHARS = 256
DEFAULT_CLUSTER_TOKEN_TTL_S = 3600
LEEWAY_S = 30  # clocks of issuer and server may differ this much
_PRINCIPAL = re.compile(r"^[^\s\x00-\x1f\x7f]{1,256}$")
_DURATION = re.compile(r"^\s*(\d+)\s*([smhdw]?)\s*$")
_UNITS_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
PUBLIC_KEY_ALGORITHMS = ("RS256", "ES256")


class AuthenticationError(Exception):
    """The caller's credentials do not name a principal; str() says why (never the secret)."""


def check_principal(name: Any, what: str = "principal") -> str:
    if not isinstance(name, str) or not _PRINCIPAL.match(name) or name == "*":
        raise ValueError(
            f"{what} must be 1..{MAX_PRINCIPAL_CHARS} printable characters without spaces (and not '*'), "
            f"got {str(name)[:40]!r}"
        )
    return name


def parse_duration_s(text: str) -> int:
    """Seconds from "90", "90s", "15m", "12h", "30d" or "2w"."""
    match = _DURATION.match(text)
    if not match or int(match.group(1)) <= 0:
        raise ValueError(f"a duration is a positive number with an optional unit s/m/h/d/w (e.g. '30d'), got {text!r}")
    return int(match.group(1)) * _UNITS_S[match.group(2)]


def create_token(
    principal: str,
    *,
    ttl_s: int,
    secret: str | None = None,
    private_key_pem: bytes | None = None,
    algorithm: str | None = None,
    now_s: float | None = None,
) -> str:
    """A token naming `principal`, valid for `ttl_s` seconds: HS256 with `secret`, or RS256 /
    ES256 (`algorithm`, default from the key) with `private_key_pem`."""
    check_principal(principal)
    if ttl_s <= 0:
        raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
    now = int(time.time() if now_s is None else now_s)
    claims = {"sub": principal, "iat": now, "exp": now + ttl_s}
    if (secret is None) == (private_key_pem is None):
        raise ValueError("give exactly one of secret (HS256) or private_key_pem (RS256/ES256)")
    if secret is not None:
        return jwt.encode(claims, secret, algorithm="HS256")
    assert private_key_pem is not None
    if algorithm is None:
        algorithm = "ES256" if b"EC PRIVATE KEY" in private_key_pem or _is_ec(private_key_pem) else "RS256"
    if algorithm not in PUBLIC_KEY_ALGORITHMS:
        raise ValueError(f"algorithm must be one of {PUBLIC_KEY_ALGORITHMS} with a private key, got {algorithm!r}")
    return jwt.encode(claims, private_key_pem, algorithm=algorithm)


def _is_ec(pem: bytes) -> bool:
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    return isinstance(load_pem_private_key(pem, password=None), ec.EllipticCurvePrivateKey)


class TokenVerifier:
    """Checks tokens against one key; `principal(token)` or AuthenticationError."""

    def __init__(self, *, secret: str | None = None, public_key_pem: bytes | None = None) -> None:
        if (secret is None) == (public_key_pem is None):
            raise ValueError("give exactly one of secret (HS256) or public_key_pem (RS256/ES256)")
        self._key: Any
        if secret is not None:
            self._key, self._algorithms = secret, ["HS256"]
        else:
            from cryptography.hazmat.primitives.asymmetric import ec
            from cryptography.hazmat.primitives.serialization import load_pem_public_key

            assert public_key_pem is not None
            try:
                key = load_pem_public_key(public_key_pem)
            except ValueError as e:
                raise ValueError(f"token_public_key is not a PEM public key ({e})") from None
            self._key = key
            self._algorithms = ["ES256"] if isinstance(key, ec.EllipticCurvePublicKey) else ["RS256"]

    def __repr__(self) -> str:
        return f"<TokenVerifier algorithms={self._algorithms}>"

    def principal(self, token: str) -> str:
        if not token or len(token) > MAX_TOKEN_CHARS:
            raise AuthenticationError(f"the bearer token is empty or longer than {MAX_TOKEN_CHARS} characters")
        try:
            claims = jwt.decode(
                token, self._key, algorithms=self._algorithms, leeway=LEEWAY_S,
                options={"require": ["exp", "sub"]},
            )
        except jwt.ExpiredSignatureError:
            expired = _unverified_exp(token)
            when = f" at {expired}" if expired else ""
            raise AuthenticationError(f"the token expired{when}: get a new one (dmq tokens create)") from None
        except jwt.InvalidSignatureError:
            raise AuthenticationError("the token's signature does not verify with this cluster's key") from None
        except jwt.InvalidAlgorithmError:
            raise AuthenticationError(f"the token is not signed with {'/'.join(self._algorithms)}, the cluster's algorithm") from None
        except jwt.MissingRequiredClaimError as e:
            raise AuthenticationError(f"the token has no {e.claim!r} claim (tokens need 'sub' and 'exp')") from None
        except jwt.InvalidTokenError as e:
            raise AuthenticationError(f"the token is not a valid JWT ({type(e).__name__})") from None
        try:
            return check_principal(claims.get("sub"), "the token's 'sub' claim")
        except ValueError as e:
            raise AuthenticationError(str(e)) from None


def _unverified_exp(token: str) -> str | None:
    try:
        exp = jwt.decode(token, options={"verify_signature": False}).get("exp")
        if not isinstance(exp, (int, float)):
            return None
        return datetime.datetime.fromtimestamp(int(exp), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except Exception:  # noqa: BLE001 - only decoration of an already refused token
        return None
