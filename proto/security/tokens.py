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

A client sends the same token with every call, and decoding plus checking the signature costs
~100 µs (PyJWT, HS256; more with RS256/ES256) on the server's event loop, the largest part of an
authenticated call's cost. So a TokenVerifier remembers the tokens it verified: the exact token
string (an entry is reached only by the very bytes whose signature was checked) maps to its
principal and the end of its validity, `exp` plus the leeway. Expiry is judged by one clock, the
verifier's, for cached and fresh tokens alike (PyJWT's own exp check is replaced by the same
comparison, exp <= now - leeway refuses), so a token is refused as expired from the same instant
whether it was cached or not. The cache is an LRU of at most `cache_entries` tokens (each at
most MAX_TOKEN_CHARS), so a flood of distinct tokens costs bounded memory and only evicts;
refusals are not cached.
"""

from __future__ import annotations

import collections
import datetime
import re
import threading
import time
from collections.abc import Callable
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
# Clocks of issuer and server may differ this much: a token is accepted until exp + leeway.
# A setting (ServerSecurity.token_leeway_s, `--token-leeway-s`); the bound keeps an expired token
# from living on for long by mistake.
LEEWAY_S = 30
LEEWAY_S_MAX = 600
VERIFIED_CACHE_ENTRIES = 1024  # distinct live tokens remembered; more are verified again
_PRINCIPAL = re.compile(r"[^\s\x00-\x1f\x7f]{1,256}")
_DURATION = re.compile(r"^\s*(\d+)\s*([smhdw]?)\s*$")
_UNITS_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
PUBLIC_KEY_ALGORITHMS = ("RS256", "ES256")


class AuthenticationError(Exception):
    """The caller's credentials do not name a principal; str() says why (never the secret)."""


def check_principal(name: Any, what: str = "principal") -> str:
    # fullmatch: `$` would let a trailing newline through ("q\n", a principal no token names)
    if not isinstance(name, str) or not _PRINCIPAL.fullmatch(name) or name == "*":
        raise ValueError(
            f"{what} must be 1..{MAX_PRINCIPAL_CHARS} printable characters without spaces (and not '*'), "
            f"got {str(name)[:40]!r}"
        )
    return name


def check_leeway(leeway_s: object, what: str = "token_leeway_s") -> None:
    if isinstance(leeway_s, bool) or not isinstance(leeway_s, int) or not 0 <= leeway_s <= LEEWAY_S_MAX:
        raise ValueError(f"{what} must be whole seconds within 0..{LEEWAY_S_MAX}, got {leeway_s!r}")


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
    """Checks tokens against one key; `principal(token)` or AuthenticationError.

    Safe to share between threads; `clock` (seconds since the epoch) is for tests of the cache.
    """

    def __init__(
        self,
        *,
        secret: str | None = None,
        public_key_pem: bytes | None = None,
        cache_entries: int = VERIFIED_CACHE_ENTRIES,
        clock: Callable[[], float] = time.time,
        leeway_s: int = LEEWAY_S,
    ) -> None:
        if (secret is None) == (public_key_pem is None):
            raise ValueError("give exactly one of secret (HS256) or public_key_pem (RS256/ES256)")
        if cache_entries < 0:
            raise ValueError(f"cache_entries must be >= 0, got {cache_entries}")
        check_leeway(leeway_s)
        self.leeway_s = leeway_s
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
        self.cache_entries = cache_entries
        self._clock = clock
        self._lock = threading.Lock()
        # token -> (principal, the instant it stops being accepted: exp + leeway_s); oldest use first
        self._verified: collections.OrderedDict[str, tuple[str, float]] = collections.OrderedDict()

    def __repr__(self) -> str:
        return f"<TokenVerifier algorithms={self._algorithms} cached={len(self._verified)}>"

    @property
    def cached(self) -> int:
        return len(self._verified)

    def principal(self, token: str) -> str:
        if not token or len(token) > MAX_TOKEN_CHARS:
            raise AuthenticationError(f"the bearer token is empty or longer than {MAX_TOKEN_CHARS} characters")
        now = self._clock()
        with self._lock:
            hit = self._verified.get(token)
            if hit is not None:
                if now < hit[1]:
                    self._verified.move_to_end(token)
                    return hit[0]
                del self._verified[token]
        if hit is not None:  # verified once, expired since: what the full check would say now
            raise _expired(hit[1] - self.leeway_s)
        principal, until = self._verify(token, now)
        if self.cache_entries:
            with self._lock:
                self._verified[token] = (principal, until)
                while len(self._verified) > self.cache_entries:
                    self._verified.popitem(last=False)
        return principal

    def _verify(self, token: str, now: float) -> tuple[str, float]:
        """The full check: the principal and the end of the token's validity (exp + leeway).

        Expiry is judged here, by `now` of our clock, as PyJWT would (refused once exp <= now -
        leeway): one clock decides, whether the token comes from the cache or not."""
        try:
            claims = jwt.decode(
                token, self._key, algorithms=self._algorithms, leeway=self.leeway_s,
                options={"require": ["exp", "sub"], "verify_exp": False},
            )
        except jwt.InvalidSignatureError:
            raise AuthenticationError("the token's signature does not verify with this cluster's key") from None
        except jwt.InvalidAlgorithmError:
            raise AuthenticationError(f"the token is not signed with {'/'.join(self._algorithms)}, the cluster's algorithm") from None
        except jwt.MissingRequiredClaimError as e:
            raise AuthenticationError(f"the token has no {e.claim!r} claim (tokens need 'sub' and 'exp')") from None
        except jwt.InvalidTokenError as e:
            raise AuthenticationError(f"the token is not a valid JWT ({type(e).__name__})") from None
        try:
            exp = int(claims["exp"])
        except (ValueError, TypeError, OverflowError):
            raise AuthenticationError("the token's 'exp' claim is not a time (seconds since the epoch)") from None
        if now >= exp + self.leeway_s:
            raise _expired(exp)
        try:
            principal = check_principal(claims.get("sub"), "the token's 'sub' claim")
        except ValueError as e:
            raise AuthenticationError(str(e)) from None
        return principal, float(exp + self.leeway_s)


def _expired(exp: float) -> AuthenticationError:
    try:
        when = " at " + datetime.datetime.fromtimestamp(int(exp), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):  # an absurd 'exp' (year < 1 or > 9999): no date to show
        when = ""
    return AuthenticationError(f"the token expired{when}: get a new one (dmq tokens create)")
