"""Hypothesis fuzzing of the authentication and authorization layer's inputs (issue 18).

Whatever the metadata values and token strings, `authenticate` either names the principal of a
token signed with the cluster's key (or of a verified certificate) or raises AuthenticationError:
no other exception (no crash), and no principal out of a token the cluster did not sign (no
bypass). ACL decisions never raise and never allow what no entry allows.
"""

from __future__ import annotations

import time

import jwt
from hypothesis import given, settings
from hypothesis import strategies as st

from dmq.proto.security.acls import Acl, AclSet, Operation, ResourceType
from dmq.proto.security.settings import ServerSecurity
from dmq.proto.security.tokens import AuthenticationError
from dmq.proto.server.security.interceptor import SecurityInterceptor
from tests.security.conftest import SECRET

INTERCEPTOR = SecurityInterceptor(ServerSecurity(token_secret=SECRET))
keys = st.sampled_from(["authorization", "Authorization", "x-other", "authorization-bin", ""])
values = st.one_of(
    st.text(max_size=200),
    st.builds(lambda t: "Bearer " + t, st.text(max_size=200)),
    st.binary(max_size=50),
    st.builds(lambda claims, key, alg: "Bearer " + jwt.encode(claims, key, algorithm=alg),
              st.fixed_dictionaries({}, optional={"sub": st.one_of(st.text(max_size=30), st.integers()),
                                                  "exp": st.integers(-(2**31), 2**40)}),
              st.sampled_from(["wrong-key-of-at-least-32-characters!!", SECRET]),  # ours too: valid ones
              st.just("HS256")),
)


@settings(max_examples=200, deadline=None)
@given(metadata=st.lists(st.tuples(keys, values), max_size=4),
       common_names=st.lists(st.binary(max_size=40), max_size=2))
def test_authenticate_never_crashes_and_never_accepts_an_unsigned_principal(metadata, common_names):
    try:
        principal = INTERCEPTOR.authenticate(tuple(metadata), {"x509_common_name": common_names})
    except AuthenticationError as e:
        assert SECRET not in str(e)
        for _k, v in metadata:
            if isinstance(v, str) and len(v) > 20:
                assert v.removeprefix("Bearer ") not in str(e)  # the token is never echoed
        return
    # Only a token signed with our key could name a principal (no certificates: no CA here).
    (token,) = [v for k, v in metadata if k == "authorization"]
    claims = jwt.decode(token.removeprefix("Bearer ").strip(), SECRET, algorithms=["HS256"])
    assert claims["sub"] == principal and claims["exp"] > time.time() - 60


acl_words = st.builds(
    lambda p, rt, name, op, perm, pt: (p, rt, name, op, perm, pt),
    st.sampled_from(["*", "alice", "bob"]), st.sampled_from(["topic", "group"]),
    st.sampled_from(["a", "ab", "abc", "*", "b"]), st.sampled_from([o.value for o in Operation]),
    st.sampled_from(["allow", "deny"]), st.sampled_from(["literal", "prefixed"]))


@settings(max_examples=200, deadline=None)
@given(entries=st.lists(acl_words, max_size=8), principal=st.sampled_from(["alice", "bob", "carol"]),
       rtype=st.sampled_from([ResourceType.TOPIC, ResourceType.GROUP]), name=st.text("ab*", max_size=4),
       op=st.sampled_from(list(Operation)))
def test_acl_decisions_match_a_naive_reading(entries, principal, rtype, name, op):
    acls = []
    for p, rt, n, o, perm, pt in entries:
        try:
            acls.append(Acl.parse(p, rt, n, o, perm, pt))
        except ValueError:
            continue
    decided = AclSet(acls).allows(principal, rtype, name, op)

    def matches(a: Acl) -> bool:
        named = name.startswith(a.resource_name) if a.pattern_type == "prefixed" else a.resource_name in ("*", name)
        return a.principal in ("*", principal) and a.resource_type is rtype and named

    denied = any(matches(a) and a.permission == "deny" and a.operation is op for a in acls)
    implied = {Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER} if op is Operation.DESCRIBE else set()
    allowed = any(matches(a) and a.permission == "allow" and (a.operation is op or a.operation in implied) for a in acls)
    assert decided == (allowed and not denied)
