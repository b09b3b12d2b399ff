"""Regression tests for issue 26 item 6: a request that does not decode is INVALID_ARGUMENT.

grpc.aio decodes a request before any handler or interceptor behaviour runs; a DecodeError there
was answered UNKNOWN ("Unexpected <class 'google.protobuf.message.DecodeError'>...") on every
method. Now every method of every service the servers register (Broker, Metadata,
GroupCoordinator, grpc.health.v1.Health), on the coordinator's server and on a broker's, answers
INVALID_ARGUMENT naming the message type, and no bytes at all make a server answer UNKNOWN or
INTERNAL. Requests are raw bytes over real gRPC channels (no stub serializes them).
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto.grpc_options import channel_options
from dmq.proto.security.settings import sync_channel
from tests.security._stream_answers import AnswerRefused
from tests.security.conftest import tls_client, token_for

pytestmark = pytest.mark.timeout(300)

# (full method name, request message type, server streaming): every method of every service
METHODS = sorted(
    (f"/{service.full_name}/{m.name}", m.input_type.full_name, m.server_streaming)
    for file in (pb.DESCRIPTOR, health_pb2.DESCRIPTOR)
    for service in file.services_by_name.values()
    for m in service.methods
)
NEVER = (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)



def _call(channel: grpc.Channel, method: str, streaming: bool, body: bytes, timeout_s: float) -> grpc.RpcError | None:
    """Send `body` as the request; the error it is answered with (None: answered OK). A stream of
    requests (EventAppendStream) gets `body` as its one message, answered by a message."""
    try:
        if method.endswith("/EventAppendStream"):
            for raw in channel.stream_stream(method)(iter([body]), timeout=timeout_s):
                answer = pb.EventAppendResponse.FromString(raw)
                return AnswerRefused(answer) if answer.status_code else None
            return None
        if streaming:
            call = channel.unary_stream(method)(body, timeout=timeout_s)
            for _ in call:  # the status comes with the first message or the end of the stream
                call.cancel()
                break
        else:
            channel.unary_unary(method)(body, timeout=timeout_s)
    except grpc.RpcError as e:
        if e.code() is grpc.StatusCode.CANCELLED and streaming:
            return None  # ours: the stream answered
        return e
    return None


@pytest.fixture
def servers(cluster_factory) -> Iterator[list[grpc.Channel]]:
    """Raw channels to the coordinator's server and to a broker's (separate ports)."""
    c = cluster_factory(brokers=1, shared_port=False)
    channel = grpc.insecure_channel(c.bootstrap, options=channel_options())
    broker = pb_grpc.MetadataStub(channel).ListBrokers(pb.ListBrokersRequest(), timeout=10).brokers[0]
    channels = [channel, grpc.insecure_channel(f"{broker.host}:{broker.port}", options=channel_options())]
    yield channels
    for ch in channels:
        ch.close()


def _assert_names_the_type(error: grpc.RpcError | None, message_type: str, where: str) -> str | None:
    if error is None:
        return f"{where}: answered OK"
    if error.code() is not grpc.StatusCode.INVALID_ARGUMENT or message_type not in (error.details() or ""):
        return f"{where}: {error.code().name} {error.details()!r}"
    return None


def test_a_byte_that_does_not_decode_is_invalid_argument_naming_the_type_on_every_method(servers):
    assert len(METHODS) > 40 and ("/dmq.v1.Broker/QueuePop", "dmq.v1.QueuePopRequest", False) in METHODS
    failures = []
    for ch, server in zip(servers, ("coordinator", "broker")):
        for method, message_type, streaming in METHODS:
            error = _call(ch, method, streaming, b"\xff", timeout_s=10)
            if error is not None and error.code() is grpc.StatusCode.UNIMPLEMENTED:
                continue  # not a service of this server (the broker's on the coordinator's port...)
            failure = _assert_names_the_type(error, message_type, f"{server} {method}")
            if failure:
                failures.append(failure)
    assert not failures, "\n".join(failures)


def test_with_security_on_too(secure_cluster, certs):
    """The super-user's and a stranger's garbage alike: INVALID_ARGUMENT, never UNKNOWN."""
    c = secure_cluster("tokens")
    failures = []
    for who in ("admin", "nobody"):
        channel = sync_channel(c.bootstrap, tls_client(certs, token=token_for(who)), channel_options())
        try:
            for method in ("/dmq.v1.Broker/QueuePop", "/dmq.v1.Broker/Produce", "/dmq.v1.Metadata/ListTopics",
                           "/dmq.v1.Broker/EventAppend", "/dmq.v1.GroupCoordinator/WatchGroup"):
                message_type = next(t for m, t, _s in METHODS if m == method)
                streaming = method.endswith("WatchGroup")
                failure = _assert_names_the_type(_call(channel, method, streaming, b"\xff", 10), message_type,
                                                 f"{who} {method}")
                if failure:
                    failures.append(failure)
        finally:
            channel.close()
    assert not failures, "\n".join(failures)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.sampled_from(METHODS), server=st.integers(0, 1), body=st.binary(max_size=64))
def test_random_bytes_never_get_unknown_or_internal(servers, which, server, body):
    method, _message_type, streaming = which
    # Bytes that happen to decode make a real request: a long poll or a stream may then run until
    # the deadline, which is a fine answer here; only UNKNOWN and INTERNAL are not.
    error = _call(servers[server], method, streaming, body, timeout_s=2)
    assert error is None or error.code() not in NEVER, (method, body, error.code(), error.details())
