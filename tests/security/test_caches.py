"""The caches of the authenticated call path keep every security property (issue 18, bench follow-up).

  - verified tokens (TokenVerifier): an expired token is refused after it was cached, exactly when
    the full check would refuse it; only the very token string verified is served; bounded LRU;
  - ACL decisions (AclSet, per set): an ACL change (a new set, a new version) takes effect at once;
    bounded;
  - wrapped handlers (SecurityInterceptor, per method): made once, remade for another handler;
  - the token channels' call metadata: the token replaces any `authorization` entry given.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import jwt
import pytest

from dmq.proto.security import acls as acls_module
from dmq.proto.security.acls import Acl, AclSet, Operation, ResourceType
from dmq.proto.security.settings import ServerSecurity
from dmq.proto.security.token_channels import CallToken
from dmq.proto.security.tokens import LEEWAY_S, AuthenticationError, TokenVerifier, create_token
from dmq.proto.server.security.interceptor import AclView, Refusal, SecurityInterceptor
from dmq.proto.server.security.rpc_table import rule_for
from tests.clocks import ManualClock
from tests.security.conftest import SECRET

T = ResourceType.TOPIC


def test_a_cached_token_is_refused_once_expired_as_the_full_check_would():
    clock = ManualClock(time.time())
    verifier = TokenVerifier(secret=SECRET, clock=clock)
    token = create_token("alice", ttl_s=60, secret=SECRET)
    exp = jwt.decode(token, SECRET, algorithms=["HS256"])["exp"]
    assert verifier.principal(token) == "alice" and verifier.cached == 1
    clock.now = exp + LEEWAY_S - 1  # within the leeway: the full check would still accept it
    assert verifier.principal(token) == "alice"
    clock.now = exp + LEEWAY_S
    with pytest.raises(AuthenticationError, match="expired at") as info:
        verifier.principal(token)
    assert token not in str(info.value) and verifier.cached == 0
    with pytest.raises(AuthenticationError, match="expired"):  # and every time after
        verifier.principal(token)


def test_only_the_verified_token_string_is_served_from_the_cache():
    verifier = TokenVerifier(secret=SECRET)
    token = create_token("alice", ttl_s=60, secret=SECRET)
    assert verifier.principal(token) == "alice"
    header, payload, signature = token.split(".")
    tampered = ".".join((header, payload, signature[:-2] + ("AA" if signature[-2:] != "AA" else "BB")))
    with pytest.raises(AuthenticationError, match="signature|not a valid JWT"):
        verifier.principal(tampered)
    forged = create_token("alice", ttl_s=60, secret="another-secret-of-at-least-32-chars!!")
    with pytest.raises(AuthenticationError, match="signature"):
        verifier.principal(forged)
    assert verifier.cached == 1  # refusals are not cached


def test_the_token_cache_is_a_bounded_lru():
    verifier = TokenVerifier(secret=SECRET, cache_entries=2)
    tokens = [create_token(f"p{i}", ttl_s=60, secret=SECRET) for i in range(3)]
    for i, token in enumerate(tokens):
        assert verifier.principal(token) == f"p{i}"
        assert verifier.cached == min(i + 1, 2)
    assert verifier.principal(tokens[0]) == "p0"  # evicted, verified again: still accepted
    assert verifier.cached == 2
    uncached = TokenVerifier(secret=SECRET, cache_entries=0)
    assert uncached.principal(tokens[1]) == "p1" and uncached.cached == 0


def test_an_acl_change_takes_effect_at_once():
    view = AclView(AclSet([Acl.parse("alice", "topic", "t", "read")], version=1))
    interceptor = SecurityInterceptor(ServerSecurity(token_secret=SECRET), view)
    rule = rule_for("/dmq.v1.Broker/Fetch")
    assert rule is not None and rule.needs is not None
    needs = rule.needs(type("Req", (), {"partitions": [type("P", (), {"topic": "t"})()]})())
    interceptor.authorize("alice", "/dmq.v1.Broker/Fetch", rule, needs)  # allowed, and the decision cached
    view.replace(AclSet([Acl.parse("alice", "topic", "t", "read", "deny")], version=2))
    with pytest.raises(Refusal, match="'alice' may not read topic 't'"):
        interceptor.authorize("alice", "/dmq.v1.Broker/Fetch", rule, needs)
    view.replace(AclSet([Acl.parse("alice", "topic", "t", "read")], version=1))  # an older set is ignored
    with pytest.raises(Refusal):
        interceptor.authorize("alice", "/dmq.v1.Broker/Fetch", rule, needs)


def test_acl_decisions_are_bounded(monkeypatch):
    monkeypatch.setattr(acls_module, "DECISION_CACHE_ENTRIES", 4)
    acls = AclSet([Acl.parse("alice", "topic", "t.", "read", pattern_type="prefixed")])
    for i in range(10):
        assert acls.allows("alice", T, f"t.{i}", Operation.READ)
        assert not acls.allows("alice", T, f"u.{i}", Operation.READ)
        assert len(acls._decisions) <= 4


def test_wrapped_handlers_are_made_once_per_method_handler():
    interceptor = SecurityInterceptor(ServerSecurity(token_secret=SECRET))

    async def behavior(request: object, context: object) -> bytes:
        return b""

    first, second = grpc.unary_unary_rpc_method_handler(behavior), grpc.unary_unary_rpc_method_handler(behavior)
    details = type("Details", (), {"method": "/dmq.v1.Broker/Fetch"})()

    async def wrap(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        async def continuation(_details: object) -> grpc.RpcMethodHandler:
            return handler

        return await interceptor.intercept_service(continuation, details)

    async def main() -> None:
        a, b = await wrap(first), await wrap(first)
        assert a is b and a is not first  # wrapped (authentication is on), once
        c = await wrap(second)
        assert c is not a and c is not second
        assert await wrap(second) is c

    asyncio.run(main())


def test_call_metadata_carries_the_token_in_place_of_any_given():
    fixed = CallToken("tok")
    assert fixed.metadata(None) == (("authorization", "Bearer tok"),)
    assert fixed.metadata([("x-a", "1"), ("authorization", "Bearer other")]) == (
        ("x-a", "1"), ("authorization", "Bearer tok"))
    minted = iter(["one", "two"])
    source = CallToken(source=lambda: next(minted))
    assert source.metadata(()) == (("authorization", "Bearer one"),)
    assert source.metadata(()) == (("authorization", "Bearer two"),)  # asked per call
    assert "tok" not in repr(fixed)
    with pytest.raises(ValueError):
        CallToken()


def test_an_absurd_expiry_is_refused_with_a_reason_not_a_crash():
    verifier = TokenVerifier(secret=SECRET)
    assert verifier.principal(jwt.encode({"sub": "alice", "exp": 10**30}, SECRET, algorithm="HS256")) == "alice"
    for exp in (-10**30, "soon", [1]):
        with pytest.raises(AuthenticationError, match="expired|'exp'"):
            verifier.principal(jwt.encode({"sub": "alice", "exp": exp}, SECRET, algorithm="HS256"))
