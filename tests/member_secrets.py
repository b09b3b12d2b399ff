"""Raw-RPC test clients that keep their members' secrets, as the real consumer does.

Since issue 18 every request of a group member carries the secret its JoinGroup answer issued
(DescribeGroup never shows it). Tests that drive the group service with raw RPCs are about
membership, assignment and commits, not about that proof, so their channels take these
interceptors: a JoinGroup answer's secret is remembered by member id, and a later request naming
that member without a secret gets it filled in. A request naming a member the channel never
joined goes out as written (tests/security/test_member_secrets.py covers the refusals).
"""

from __future__ import annotations

from typing import Any

import grpc

SECRETS: dict[str, str] = {}  # member id -> secret; member ids are random, so one table serves all


def _fill(request: Any) -> Any:
    fields = getattr(getattr(request, "DESCRIPTOR", None), "fields_by_name", {})
    if "member_secret" in fields and not request.member_secret and request.member_id in SECRETS:
        filled = type(request)()
        filled.CopyFrom(request)
        filled.member_secret = SECRETS[request.member_id]
        return filled
    return request


def _is_join(method: str | bytes) -> bool:
    return (method.decode() if isinstance(method, bytes) else method).endswith("/JoinGroup")


def _remember(response: Any) -> None:
    if response.member_secret:
        SECRETS[response.member_id] = response.member_secret


# One class per kind of call: a grpc.aio channel files an interceptor under the first kind it is.
class AioMemberSecrets(grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        call = await continuation(details, _fill(request))
        if _is_join(details.method):
            try:
                _remember(await call)
            except grpc.RpcError:
                pass  # the caller sees the error when it awaits the call
        return call


class AioMemberSecretsStream(grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(details, _fill(request))


class SyncMemberSecrets(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        outcome = continuation(details, _fill(request))
        if _is_join(details.method) and outcome.exception() is None:
            _remember(outcome.result())
        return outcome

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(details, _fill(request))


def aio_channel(address: str, **kwargs: Any) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(address, interceptors=[AioMemberSecrets(), AioMemberSecretsStream()], **kwargs)


def sync_channel(address: str, **kwargs: Any) -> grpc.Channel:
    return grpc.intercept_channel(grpc.insecure_channel(address, **kwargs), SyncMemberSecrets())
