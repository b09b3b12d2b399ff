"""Channels that send the bearer token with every call, as `authorization: Bearer <token>` metadata.

A token channel wraps a grpc (or grpc.aio) channel; each multi-callable it hands a stub adds the
token to the call's metadata (replacing any `authorization` entry the caller gave) and calls the
wrapped channel's own multi-callable. A fixed token is one prepared tuple per call; a token source
(the nodes' cluster token, re-minted before it expires) is asked per call.

Why not one of grpc's own mechanisms:
  - client interceptors (what this replaced): grpcio's interceptor machinery cost ~100 µs of
    client CPU per call (the sync one makes a new multi-callable and call-details object per call),
    a third of a small call's whole client cost (bench/RESULTS.md, "Security");
  - call credentials (grpc.access_token_call_credentials): a Python plugin that gRPC runs per call
    on one of its threads, slower still in the same measurement, and sent only over TLS, while a
    token may also travel on a plain loopback channel.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import grpc

__all__ = ["AUTHORIZATION_KEY", "AioTokenChannel", "BEARER", "CallToken", "SyncTokenChannel"]

AUTHORIZATION_KEY = "authorization"
BEARER = "Bearer "
Entries = tuple[tuple[str, str | bytes], ...]

class CallToken:
    """The `authorization` entry every call carries: a fixed token, or one asked of `source` per call."""

    __slots__ = ("_fixed", "_source")

    def __init__(self, token: str | None = None, source: Callable[[], str] | None = None) -> None:
        if (token is None) == (source is None):
            raise ValueError("give exactly one of token or source")
        self._fixed: Entries | None = ((AUTHORIZATION_KEY, BEARER + token),) if token is not None else None
        self._source = source

    def __repr__(self) -> str:
        return f"<CallToken {'fixed' if self._fixed is not None else 'from a source'}>"  # never the token

    def metadata(self, given: Iterable[tuple[str, str | bytes]] | None) -> Entries:
        """The call's metadata: what the caller gave, without any `authorization` entry, plus ours."""
        entry = self._fixed
        if entry is None:
            assert self._source is not None
            entry = ((AUTHORIZATION_KEY, BEARER + self._source()),)
        if not given:
            return entry
        return (*((k, v) for k, v in given if k != AUTHORIZATION_KEY), *entry)


class _SyncCalls:
    """A multi-callable of a SyncTokenChannel (any of the four kinds): the wrapped one, with the token."""

    __slots__ = ("_inner", "_token")

    def __init__(self, inner: Any, token: CallToken) -> None:
        self._inner = inner
        self._token = token

    def __call__(self, request: Any, timeout: float | None = None, metadata: Any = None, credentials: Any = None,
                 wait_for_ready: bool | None = None, compression: Any = None) -> Any:
        return self._inner(request, timeout=timeout, metadata=self._token.metadata(metadata), credentials=credentials,
                           wait_for_ready=wait_for_ready, compression=compression)

    def with_call(self, request: Any, timeout: float | None = None, metadata: Any = None, credentials: Any = None,
                  wait_for_ready: bool | None = None, compression: Any = None) -> Any:
        return self._inner.with_call(request, timeout=timeout, metadata=self._token.metadata(metadata),
                                     credentials=credentials, wait_for_ready=wait_for_ready, compression=compression)

    def future(self, request: Any, timeout: float | None = None, metadata: Any = None, credentials: Any = None,
               wait_for_ready: bool | None = None, compression: Any = None) -> Any:
        return self._inner.future(request, timeout=timeout, metadata=self._token.metadata(metadata),
                                  credentials=credentials, wait_for_ready=wait_for_ready, compression=compression)


def _multi_callable(kind: str, calls: type[_SyncCalls] | type[_AioCalls]) -> Any:
    """A channel's `kind` method ("unary_unary", ...): the wrapped channel's multi-callable in `calls`."""

    def make(self: Any, method: str, request_serializer: Any = None, response_deserializer: Any = None,
             _registered_method: bool | None = False) -> Any:
        inner = getattr(self._channel, kind)(method, request_serializer, response_deserializer,
                                             _registered_method=_registered_method)
        return calls(inner, self._token)

    make.__name__ = make.__qualname__ = kind
    return make


class SyncTokenChannel(grpc.Channel):
    """A synchronous channel whose every call carries the token; the rest is the wrapped channel's."""

    def __init__(self, channel: grpc.Channel, token: CallToken) -> None:
        self._channel = channel
        self._token = token

    def __repr__(self) -> str:
        return f"<SyncTokenChannel {self._channel!r} {self._token!r}>"

    def subscribe(self, callback: Callable[[grpc.ChannelConnectivity], None], try_to_connect: bool = False) -> None:
        self._channel.subscribe(callback, try_to_connect=try_to_connect)

    def unsubscribe(self, callback: Callable[[grpc.ChannelConnectivity], None]) -> None:
        self._channel.unsubscribe(callback)

    unary_unary = _multi_callable("unary_unary", _SyncCalls)
    unary_stream = _multi_callable("unary_stream", _SyncCalls)
    stream_unary = _multi_callable("stream_unary", _SyncCalls)
    stream_stream = _multi_callable("stream_stream", _SyncCalls)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> SyncTokenChannel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._channel.close()


class _AioCalls:
    """A multi-callable of an AioTokenChannel (any of the four kinds): the wrapped one, with the token."""

    __slots__ = ("_inner", "_token")

    def __init__(self, inner: Any, token: CallToken) -> None:
        self._inner = inner
        self._token = token

    def __call__(self, request: Any = None, *, timeout: float | None = None, metadata: Any = None,
                 credentials: Any = None, wait_for_ready: bool | None = None, compression: Any = None) -> Any:
        # request is the request iterator of stream-request calls, and may be omitted there
        args = () if request is None else (request,)
        return self._inner(*args, timeout=timeout, metadata=self._token.metadata(metadata), credentials=credentials,
                           wait_for_ready=wait_for_ready, compression=compression)


class AioTokenChannel(grpc.aio.Channel):
    """A grpc.aio channel whose every call carries the token; the rest is the wrapped channel's."""

    def __init__(self, channel: grpc.aio.Channel, token: CallToken) -> None:
        self._channel = channel
        self._token = token

    def __repr__(self) -> str:
        return f"<AioTokenChannel {self._channel!r} {self._token!r}>"

    async def __aenter__(self) -> AioTokenChannel:
        return self

    async def __aexit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        await self._channel.close(None)

    async def close(self, grace: float | None = None) -> None:
        await self._channel.close(grace)

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return self._channel.get_state(try_to_connect)

    async def wait_for_state_change(self, last_observed_state: grpc.ChannelConnectivity) -> None:
        await self._channel.wait_for_state_change(last_observed_state)

    async def channel_ready(self) -> None:
        await self._channel.channel_ready()

    unary_unary = _multi_callable("unary_unary", _AioCalls)
    unary_stream = _multi_callable("unary_stream", _AioCalls)
    stream_unary = _multi_callable("stream_unary", _AioCalls)
    stream_stream = _multi_callable("stream_stream", _AioCalls)
