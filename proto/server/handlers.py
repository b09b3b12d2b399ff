"""Wrapping a grpc.aio method handler: what every server interceptor of ours repeats.

A grpc.aio ServerInterceptor sees the call's method before the request is read; to act on the
request, the context or the answer it must return a new handler of the same kind whose behavior
wraps the original one. `rewrap(handler, unary=..., stream=...)` does the four-way dispatch
(unary/stream request × unary/stream answer), and `call_behavior` / `stream_behavior` run the
original behavior whichever way it was written (a coroutine, a plain function, an async or plain
generator, or a coroutine writing with context.write()). `WrappingInterceptor` is the interceptor
that wraps each method's handler once (`wrap`) and hands out that wrapping on every later call.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

if TYPE_CHECKING:
    # grpc-stubs types the interceptor by request and response; grpcio's class takes no parameters.
    ServerInterceptorBase = grpc.aio.ServerInterceptor[Any, Any]
else:
    ServerInterceptorBase = grpc.aio.ServerInterceptor

__all__ = ["WrappingInterceptor", "awaitable_behavior", "call_behavior", "rewrap", "stream_behavior"]

# Wrappings an interceptor keeps (one per method): a server has a few dozen methods; a call naming
# an unknown one gets no handler and is never wrapped, so the bound is only a backstop.
MAX_WRAPPED_METHODS = 1024

Behavior = Callable[..., Any]


def rewrap(
    handler: grpc.RpcMethodHandler[Any, Any],
    *,
    unary: Callable[[Behavior], Callable[..., Awaitable[Any]]],
    stream: Callable[[Behavior], Callable[..., AsyncIterator[Any]]],
) -> grpc.RpcMethodHandler[Any, Any]:
    """The handler with its behavior wrapped by `unary` (one answer) or `stream` (a stream)."""
    # (behavior, the grpc factory for its kind, the wrapping for its answer): at most one is set
    kinds: tuple[tuple[Behavior | None, Callable[..., grpc.RpcMethodHandler[Any, Any]], Callable[[Behavior], Any]], ...] = (
        (handler.unary_unary, grpc.unary_unary_rpc_method_handler, unary),
        (handler.stream_unary, grpc.stream_unary_rpc_method_handler, unary),
        (handler.unary_stream, grpc.unary_stream_rpc_method_handler, stream),
        (handler.stream_stream, grpc.stream_stream_rpc_method_handler, stream),
    )
    for behavior, factory, wrap in kinds:
        if behavior is not None:
            return factory(wrap(behavior), handler.request_deserializer, handler.response_serializer)
    return handler  # no behavior at all: grpc answers UNIMPLEMENTED as it would without us


async def call_behavior(behavior: Behavior, request: Any, context: Any) -> Any:
    result = behavior(request, context)
    return (await result) if inspect.isawaitable(result) else result


def awaitable_behavior(behavior: Behavior) -> Callable[..., Awaitable[Any]]:
    """A unary behavior as a function whose result is awaited: the behavior itself when it is a
    coroutine function (every servicer and wrapper of ours), so a wrapper awaits it with no
    `call_behavior` coroutine in between, once per call; else `call_behavior` bound to it."""
    if inspect.iscoroutinefunction(behavior):
        return behavior
    return functools.partial(call_behavior, behavior)


async def stream_behavior(behavior: Behavior, request: Any, context: Any) -> AsyncIterator[Any]:
    result = behavior(request, context)
    if inspect.isasyncgen(result):
        async for item in result:
            yield item
    elif inspect.isawaitable(result):  # a coroutine that writes with context.write()
        await result
    else:  # a plain generator
        for item in result:
            yield item


class WrappingInterceptor(ServerInterceptorBase):
    """A server interceptor that wraps each method's handler with `wrap(handler, method)`.

    grpc.aio passes the same handler object for a method call after call, so the wrapping is made
    once and reused while the handler is the same; at most `max_wrapped_methods` are kept (beyond
    that a method is wrapped per call). Subclasses define `wrap`, and may read `wrapped_count`."""

    max_wrapped_methods = MAX_WRAPPED_METHODS

    def __init__(self) -> None:
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler[Any, Any], grpc.RpcMethodHandler[Any, Any]]] = {}

    @property
    def wrapped_count(self) -> int:
        return len(self._wrapped)

    def wrap(self, handler: grpc.RpcMethodHandler[Any, Any], method: str) -> grpc.RpcMethodHandler[Any, Any]:
        raise NotImplementedError

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        known = self._wrapped.get(method)
        if known is not None and known[0] is handler:
            return known[1]
        wrapped = self.wrap(handler, method)
        if len(self._wrapped) < self.max_wrapped_methods:
            self._wrapped[method] = (handler, wrapped)
        return wrapped
