"""The server's security interceptor: authenticate, authorize, throttle, audit — one place, every RPC.

For each call (grpc.aio ServerInterceptor; the rule comes from dmq.proto.server.security.rpc_table):
  1. authenticate (when the server's ServerSecurity authenticates): the principal is the `sub` of
     the bearer token in the `authorization` metadata, or else the common name of the verified
     client certificate. Neither, or a bad token: UNAUTHENTICATED with the reason (an expired
     token says so; the token itself is never repeated, in the answer or in the logs);
  2. authorize: the cluster principal may call anything, and it alone the cluster-internal RPCs;
     super-users anything else; other principals need every permission the rule lists, by the
     ACLs (AclView: the coordinator's own, or a broker's cached copy with its version).
     Refusals: PERMISSION_DENIED naming the principal, the operation and the resource. A method
     the table does not know is refused too;
  3. quotas (dmq.proto.server.security.quotas): requests and produced bytes delay the call before the
     handler, fetched bytes delay the answer;
  4. audit: admin operations (the rule's `admin`) are logged to the "dmq.audit" logger with the
     principal, the method, the resources and the outcome (ok, or the status code).
With security off (no authentication), every call is ANONYMOUS and allowed; calls that are
neither admin operations nor subject to a quota are not wrapped at all, so the plain path pays
one dict lookup.

The principal of the call in progress is in `current_principal` (a ContextVar), for handlers that
bind what they create to it; and what it may do is `current_access`, for handlers that learn the
resources a call touches only from their own state (a queue lease id's topic and group: the
table's Access.HANDLER rules), which decide with the same ACLs, super-users and cluster principal.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import grpc
import structlog

from dmq.proto.security.acls import AclSet
from dmq.proto.security.settings import AUTHORIZATION_KEY, BEARER, ServerSecurity, read_pem
from dmq.proto.security.tokens import AuthenticationError, TokenVerifier, check_principal
from dmq.proto.server.handlers import Behavior, WrappingInterceptor, call_behavior, rewrap, stream_behavior
from dmq.proto.server.security.quotas import Quotas, QuotaSettings
from dmq.proto.server.security.rpc_table import Access, Need, RpcRule, rule_for
from dmq.proto.server.server_errors import fail

__all__ = ["ANONYMOUS", "AclView", "CallAccess", "RefusedRequest", "SecurityInterceptor", "current_access",
           "current_principal"]

ANONYMOUS = "ANONYMOUS"
current_principal: contextvars.ContextVar[str] = contextvars.ContextVar("dmq_principal", default=ANONYMOUS)
audit_log = structlog.get_logger("dmq.audit")
log = structlog.get_logger(__name__)
AuthContext = Mapping[str, Sequence[bytes]]
class AclView:
    """The ACLs a server decides with: replaced whole (immutable sets), read without a lock."""

    def __init__(self, acls: AclSet | None = None) -> None:
        self.current = acls or AclSet()

    def __repr__(self) -> str:
        return f"<AclView {self.current!r}>"

    @property
    def version(self) -> int:
        return self.current.version

    def replace(self, acls: AclSet, *, newer_only: bool = True) -> None:
        """Take `acls`; with newer_only (the default) only if not older than the current set."""
        if not newer_only or acls.version >= self.current.version:
            self.current = acls


class CallAccess:
    """What the principal of the call in progress may do (`current_access`): `allows(needs)`, or
    `require(needs, rpc)` raising PERMISSION_DENIED (RpcAbort) as the interceptor words it."""

    __slots__ = ("principal", "_interceptor")

    def __init__(self, principal: str, interceptor: SecurityInterceptor | None) -> None:
        self.principal = principal
        self._interceptor = interceptor  # None: security off, everything allowed

    def __repr__(self) -> str:
        return f"<CallAccess principal={self.principal!r} open={self._interceptor is None}>"

    def denied(self, needs: Sequence[Need]) -> Need | None:
        """The first need refused, or None when all are allowed."""
        return None if self._interceptor is None else self._interceptor.denied(self.principal, needs)

    def allows(self, needs: Sequence[Need]) -> bool:
        return self.denied(needs) is None

    def require(self, needs: Sequence[Need], rpc: str) -> None:
        need = self.denied(needs)
        if need is not None:
            fail(grpc.StatusCode.PERMISSION_DENIED, _denial(self.principal, need, rpc))


# Security off (or a call the interceptor did not wrap because nothing is checked): all allowed.
OPEN_ACCESS = CallAccess(ANONYMOUS, None)
current_access: contextvars.ContextVar[CallAccess] = contextvars.ContextVar("dmq_access", default=OPEN_ACCESS)


def _denial(principal: str, need: Need, rpc: str) -> str:
    return (f"principal {principal!r} may not {need.operation} {need.resource_type} "
            f"{need.name!r} ({rpc}): no ACL allows it, or one denies it")


class RefusedRequest:
    """A request of a request stream that the interceptor refused (unauthenticated, not permitted,
    naming no resources it can tell), handed to the handler in its place: the handler answers it
    with `code` and `message`, as the unary call would have ended, and reads on."""

    __slots__ = ("code", "message")

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"<RefusedRequest {self.code.name} {self.message!r}>"


class Refusal(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.principal = ANONYMOUS  # who was refused, once known (for the audit event)
        self.needs: list[Need] = []



class SecurityInterceptor(WrappingInterceptor):
    def __init__(
        self,
        security: ServerSecurity | None = None,
        acls: AclView | None = None,
        quotas: QuotaSettings | None = None,
    ) -> None:
        self.security = security or ServerSecurity()
        self.acls = acls or AclView()
        self.quotas = Quotas(quotas) if quotas is not None and quotas.enabled else None
        self._verifier: TokenVerifier | None = None
        if self.security.token_secret is not None:
            self._verifier = TokenVerifier(secret=self.security.token_secret, leeway_s=self.security.token_leeway_s)
        elif self.security.token_public_key is not None:
            self._verifier = TokenVerifier(public_key_pem=read_pem(self.security.token_public_key, "token_public_key"),
                                           leeway_s=self.security.token_leeway_s)
        super().__init__()

    def __repr__(self) -> str:
        return (f"<SecurityInterceptor authenticates={self.security.authenticates} tls={self.security.tls} "
                f"acls={self.acls!r} quotas={self.quotas is not None}>")

    # -- decisions (pure: tested without a server) ------------------------------------------------

    def authenticate(self, metadata: Any, auth_context: AuthContext | Callable[[], AuthContext] | None) -> str:
        """The caller's principal, or AuthenticationError saying what is missing or wrong.

        `auth_context` may be the call's `context.auth_context` method: it is then asked only when
        no token names the principal (it copies the peer's certificate properties on every ask)."""
        tokens = [v for k, v in (metadata or ()) if k == AUTHORIZATION_KEY]
        if len(tokens) > 1:
            raise AuthenticationError("more than one 'authorization' metadata entry; send one bearer token")
        if tokens:
            value = tokens[0]
            if not isinstance(value, str) or not value.startswith(BEARER):
                raise AuthenticationError("the 'authorization' metadata must be 'Bearer <token>'")
            if self._verifier is None:
                raise AuthenticationError("this server accepts no tokens; authenticate with a client certificate")
            return self._verifier.principal(value[len(BEARER):].strip())
        if callable(auth_context):
            auth_context = auth_context()
        names = (auth_context or {}).get("x509_common_name") or []
        if names and self.security.verifies_client_certs:
            try:
                return check_principal(names[0].decode("utf-8", "replace"), "the client certificate's common name")
            except ValueError as e:
                raise AuthenticationError(str(e)) from None
        how = []
        if self._verifier is not None:
            how.append("a token (metadata 'authorization: Bearer <token>', e.g. DMQ_TOKEN / --token)")
        if self.security.verifies_client_certs:
            how.append("a client certificate signed by the cluster's CA")
        raise AuthenticationError("no credentials: this cluster requires " + " or ".join(how))

    def authorize(self, principal: str, method: str, rule: RpcRule, needs: list[Need]) -> None:
        """Nothing when allowed; Refusal(PERMISSION_DENIED) naming principal, operation and resource."""
        if principal == self.security.cluster_principal:
            return
        name = method.rsplit("/", 1)[-1]
        if rule.access is Access.CLUSTER:
            raise Refusal(grpc.StatusCode.PERMISSION_DENIED,
                          f"{name} is cluster-internal: only the cluster's own principal may call it, "
                          f"not {principal!r}")
        if rule.access in (Access.AUTHENTICATED, Access.HANDLER):  # HANDLER: the handler decides
            return
        need = self.denied(principal, needs)
        if need is not None:
            raise Refusal(grpc.StatusCode.PERMISSION_DENIED, _denial(principal, need, name))

    def denied(self, principal: str, needs: Sequence[Need]) -> Need | None:
        """The first of `needs` the ACLs refuse `principal` (None: all allowed; the cluster
        principal and super-users are allowed everything but cluster-internal RPCs)."""
        if principal == self.security.cluster_principal or principal in self.security.super_users:
            return None
        acls = self.acls.current
        for need in needs:
            if not acls.allows(principal, need.resource_type, need.name, need.operation):
                return need
        return None

    # -- the interceptor -------------------------------------------------------------------------

    def wrap(self, handler: grpc.RpcMethodHandler[Any, Any], method: str) -> grpc.RpcMethodHandler[Any, Any]:
        rule = rule_for(method)
        if self.security.authenticates or self.quotas is not None or (rule is not None and rule.admin is not False):
            if handler.request_streaming:  # each request of the stream admitted as a call of its own
                return rewrap(handler, unary=lambda b: self._wrap_unary(method, rule, b),
                              stream=lambda b: self._wrap_request_stream(method, rule, b))
            return rewrap(handler, unary=lambda b: self._wrap_unary(method, rule, b),
                          stream=lambda b: self._wrap_stream(method, rule, b))
        return handler  # the plain path: nothing to check, throttle or record

    async def _admit(self, method: str, rule: RpcRule | None, request: Any, context: Any) -> tuple[str, list[Need]]:
        """Authenticate, authorize and throttle one call; the principal and what it touches."""
        if rule is None:
            if self.security.authenticates:
                raise Refusal(grpc.StatusCode.PERMISSION_DENIED, f"{method} is not in the permission table")
            return ANONYMOUS, []
        try:
            rule = rule.for_request(request)  # a follower's Fetch: the cluster's (rpc_table)
            needs = rule.needs(request) if rule.needs is not None else []
        except (AttributeError, TypeError, ValueError) as e:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"cannot tell which resources the request names ({e})") from None
        principal = ANONYMOUS
        if self.security.authenticates:
            try:
                principal = self.authenticate(context.invocation_metadata(), context.auth_context)
            except AuthenticationError as e:
                raise Refusal(grpc.StatusCode.UNAUTHENTICATED, str(e)) from None
            try:
                self.authorize(principal, method, rule, needs)
            except Refusal as r:
                r.principal, r.needs = principal, needs
                raise
        if self.quotas is not None and principal != self.security.cluster_principal:
            delay = self.quotas.delay_s(principal, "requests", 1)
            if rule.quota == "produce":
                # a Produce's batch; other writes (event appends) by their encoded size
                size = len(request.batch) if hasattr(request, "batch") else getattr(request, "ByteSize", lambda: 0)()
                delay = max(delay, self.quotas.delay_s(principal, "produce", size))
            if delay > 0:
                await asyncio.sleep(delay)
        return principal, needs

    async def _throttle_answer(self, principal: str, rule: RpcRule | None, answer: Any) -> None:
        if self.quotas is not None and rule is not None and rule.quota == "fetch" and isinstance(answer, bytes):
            if principal != self.security.cluster_principal:
                delay = self.quotas.delay_s(principal, "fetch", len(answer))
                if delay > 0:
                    await asyncio.sleep(delay)

    def _audit(self, method: str, rule: RpcRule | None, request: Any, principal: str,
               needs: list[Need], outcome: str) -> None:
        if rule is not None and rule.is_admin(request):
            audit_log.info("audit", method=method.rsplit("/", 1)[-1], principal=principal,
                           resources=[str(n) for n in needs], outcome=outcome)

    def _wrap_unary(self, method: str, rule: RpcRule | None, behavior: Behavior) -> Callable[..., Awaitable[Any]]:
        async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            try:
                principal, needs = await self._admit(method, rule, request, context)
            except Refusal as r:
                self._audit(method, rule, request, r.principal, r.needs, r.code.name)
                await context.abort(r.code, str(r))
            token = current_principal.set(principal)
            access = current_access.set(CallAccess(principal, self)) if self.security.authenticates else None
            outcome = "UNKNOWN"
            try:
                answer = await call_behavior(behavior, request, context)
                outcome = context.code().name if isinstance(context.code(), grpc.StatusCode) else "OK"
                await self._throttle_answer(principal, rule, answer)
                return answer
            except BaseException as e:
                outcome = _outcome(e, context)
                raise
            finally:
                current_principal.reset(token)
                if access is not None:
                    current_access.reset(access)
                self._audit(method, rule, request, principal, needs, outcome)

        return wrapped

    def _wrap_stream(self, method: str, rule: RpcRule | None, behavior: Behavior) -> Callable[..., AsyncIterator[Any]]:
        async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            try:
                principal, needs = await self._admit(method, rule, request, context)
            except Refusal as r:
                await context.abort(r.code, str(r))
            del needs
            # Not reset: the call's task (and with it this context) ends with the stream.
            current_principal.set(principal)
            if self.security.authenticates:
                current_access.set(CallAccess(principal, self))
            async for item in stream_behavior(behavior, request, context):
                yield item

        return wrapped


    def _wrap_request_stream(self, method: str, rule: RpcRule | None,
                             behavior: Behavior) -> Callable[..., AsyncIterator[Any]]:
        """A stream of requests (EventAppendStream): every request is authenticated, authorized
        and throttled as the unary call it stands for before the handler sees it; a refused one
        reaches the handler as a RefusedRequest, which it answers with that status, and the
        stream goes on (one append refused is not the stream refused)."""
        async def wrapped(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            async def admitted() -> AsyncIterator[Any]:
                async for request in requests:
                    try:
                        principal, _needs = await self._admit(method, rule, request, context)
                    except Refusal as r:
                        # one request refused, not the stream: the handler answers it so and goes on
                        yield RefusedRequest(r.code, str(r))
                        continue
                    # Not reset: the call's task (and with it this context) ends with the stream.
                    current_principal.set(principal)
                    if self.security.authenticates:
                        current_access.set(CallAccess(principal, self))
                    yield request

            async for item in stream_behavior(behavior, admitted(), context):
                yield item

        return wrapped


def _outcome(error: BaseException, context: Any) -> str:
    code = context.code() if hasattr(context, "code") else None
    if isinstance(code, grpc.StatusCode):
        return code.name
    if isinstance(error, asyncio.CancelledError):
        return "CANCELLED"
    return type(error).__name__
