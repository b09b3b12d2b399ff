"""Requests that do not decode: INVALID_ARGUMENT naming the message type, on every method.

grpc.aio decodes a request (its handler's `request_deserializer`) before any interceptor
behaviour or servicer runs, and answers an exception there UNKNOWN ("Unexpected <class
'google.protobuf.message.DecodeError'>..."), a status no request may get from a DMQ server. So
`DecodeGuard`, an interceptor every server has (dmq.client.cli.runner), swaps each method's
deserializer for one that never raises: bytes that do not decode become an `Undecodable` naming
the message type, and the guard's behaviour, outside the security interceptor's (no rule reads
the resources of a request that has none), answers it INVALID_ARGUMENT:

    request: the bytes do not decode as a dmq.v1.QueuePopRequest (Error parsing message ...)

Every service the servers register goes through it, the health service included. A method whose
requests arrive as a stream (EventAppendStream) gets its iterator guarded: a message that does not
decode ends the stream so, before the handler sees it. Raw-bytes methods are left as they are
(nothing to decode).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from dmq.proto.names import cap_message
from dmq.proto.server.handlers import Behavior, WrappingInterceptor, awaitable_behavior, stream_behavior

__all__ = ["DecodeGuard", "Undecodable"]

class Undecodable:
    """What a request that did not decode is handed on as; `message` is its status message."""

    __slots__ = ("message",)

    def __init__(self, message_type: str, error: Exception) -> None:
        self.message = cap_message(f"request: the bytes do not decode as a {message_type} ({error})")

    def __repr__(self) -> str:
        return f"<Undecodable {self.message!r}>"


def message_type_of(deserializer: Callable[[bytes], Any], method: str) -> str:
    """The full protobuf name of what `deserializer` makes (a generated class's FromString)."""
    cls = getattr(deserializer, "__self__", None)
    descriptor = getattr(cls, "DESCRIPTOR", None)
    name = getattr(descriptor, "full_name", None)
    return name if isinstance(name, str) else f"request of {method}"


def tolerant(deserializer: Callable[[bytes], Any], message_type: str) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as e:  # noqa: BLE001 - whatever the parser raises, the bytes are the client's
            return Undecodable(message_type, e)

    return deserialize


def _guard_unary(behavior: Behavior) -> Callable[..., Awaitable[Any]]:
    inner = awaitable_behavior(behavior)  # no call_behavior coroutine per call

    async def guarded(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if type(request) is Undecodable:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        return await inner(request, context)

    return guarded


def _guard_stream(behavior: Behavior) -> Callable[..., AsyncIterator[Any]]:
    async def guarded(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        if type(request) is Undecodable:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        async for item in stream_behavior(behavior, request, context):
            yield item

    return guarded


def _guard_request_stream(behavior: Behavior) -> Callable[..., AsyncIterator[Any]]:
    """A stream of requests (EventAppendStream): one that does not decode ends the stream with
    INVALID_ARGUMENT naming its type, before the handler sees it."""
    async def guarded(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        async def decoded() -> AsyncIterator[Any]:
            async for request in requests:
                if type(request) is Undecodable:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
                yield request

        async for item in stream_behavior(behavior, decoded(), context):
            yield item

    return guarded


def guard(handler: grpc.RpcMethodHandler[Any, Any], method: str) -> grpc.RpcMethodHandler[Any, Any]:
    """`handler` with a deserializer that never raises and a behaviour refusing what it could not
    decode; unchanged when its requests are raw bytes (or a stream answered once: none is)."""
    deserializer = handler.request_deserializer
    if deserializer is None or handler.stream_unary is not None:
        return handler
    decode = tolerant(deserializer, message_type_of(deserializer, method))
    if handler.stream_stream is not None:
        return grpc.stream_stream_rpc_method_handler(_guard_request_stream(handler.stream_stream), decode,
                                                     handler.response_serializer)
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(_guard_unary(handler.unary_unary), decode,
                                                   handler.response_serializer)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(_guard_stream(handler.unary_stream), decode,
                                                    handler.response_serializer)
    return handler


class DecodeGuard(WrappingInterceptor):
    """The interceptor of `guard`: put it before the security interceptor, so an undecodable
    request is refused before any rule reads its fields."""

    def __repr__(self) -> str:
        return f"<DecodeGuard methods={self.wrapped_count}>"

    def wrap(self, handler: grpc.RpcMethodHandler[Any, Any], method: str) -> grpc.RpcMethodHandler[Any, Any]:
        return guard(handler, method)
