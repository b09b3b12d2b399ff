"""Every RPC of the broker and the coordinator, fuzzed over real gRPC from the protobuf descriptors:
no answer is INTERNAL or UNKNOWN, and no status message is unbounded (issue 13)."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import descriptor as d
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dmq.client.cli.runner import ClusterThread
from dmq.proto import dmq_pb2 as pb
from dmq.proto import records
from dmq.proto.grpc_options import channel_options
from tests.integration.test_names_and_validation import ALLOWED as ACTIONABLE

# The statuses a client can act on (test_names_and_validation's), and DEADLINE_EXCEEDED: long polls
# and watches cut short by the test's own timeout.
ALLOWED = ACTIONABLE | {grpc.StatusCode.DEADLINE_EXCEEDED}
# Registering brokers at random addresses would make later calls wait on brokers that do not exist.
SKIPPED = {"RegisterBroker"}
TIMEOUT_S = 1.0

_INTS = {
    d.FieldDescriptor.TYPE_INT32: st.one_of(st.integers(-3, 12), st.integers(-(2**31), 2**31 - 1)),
    d.FieldDescriptor.TYPE_SINT32: st.integers(-(2**31), 2**31 - 1),
    d.FieldDescriptor.TYPE_UINT32: st.integers(0, 2**32 - 1),
    d.FieldDescriptor.TYPE_INT64: st.one_of(st.integers(-3, 12), st.integers(-(2**63), 2**63 - 1)),
    d.FieldDescriptor.TYPE_SINT64: st.integers(-(2**63), 2**63 - 1),
    d.FieldDescriptor.TYPE_UINT64: st.integers(0, 2**64 - 1),
}
_STRINGS = st.one_of(
    st.sampled_from(["t", "G_t_a", "", "x" * 249, "x" * 250, "é" * 125, "..", "a b", "a\nb"]),
    st.text(max_size=40),
    st.text("ab._-/ \x00é", max_size=300),
)
_BYTES = st.one_of(st.binary(max_size=64), st.just(records.encode([b"v"])))


def _value(field: d.FieldDescriptor, depth: int) -> st.SearchStrategy:
    if field.type == d.FieldDescriptor.TYPE_MESSAGE:
        return _message(field.message_type, depth + 1)
    if field.type == d.FieldDescriptor.TYPE_STRING:
        return _STRINGS
    if field.type == d.FieldDescriptor.TYPE_BYTES:
        return _BYTES
    if field.type == d.FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if field.type == d.FieldDescriptor.TYPE_ENUM:
        return st.integers(-1, 5)
    if field.type in (d.FieldDescriptor.TYPE_DOUBLE, d.FieldDescriptor.TYPE_FLOAT):
        return st.floats(allow_nan=True)
    return _INTS.get(field.type, st.integers(0, 10))


def _message(desc: d.Descriptor, depth: int = 0) -> st.SearchStrategy:
    cls = getattr(pb, desc.name)
    if depth > 2:
        return st.builds(cls)
    parts = {}
    for field in desc.fields:
        value = _value(field, depth)
        if field.is_repeated:
            value = st.lists(value, max_size=3)
        parts[field.name] = st.none() | value
    return st.fixed_dictionaries(parts).map(lambda kw: cls(**{k: v for k, v in kw.items() if v is not None}))


METHODS = [
    (service, method)
    for service in (pb.DESCRIPTOR.services_by_name[n] for n in ("Broker", "Metadata", "GroupCoordinator"))
    for method in service.methods
    if method.name not in SKIPPED
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from dmq.client.cli.runner import ClusterOptions

    with ClusterThread(ClusterOptions(data_dir=tmp_path_factory.mktemp("fuzz"))) as cluster:
        channel = grpc.insecure_channel(cluster.bootstrap, options=channel_options())
        yield channel
        channel.close()


@pytest.mark.parametrize(("service", "method"), METHODS, ids=[f"{s.name}.{m.name}" for s, m in METHODS])
def test_fuzzed_rpc_never_answers_internal(server, service, method) -> None:
    path = f"/{service.full_name}/{method.name}"
    request_type = getattr(pb, method.input_type.name)

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(request=_message(method.input_type))
    def check(request) -> None:
        data = request.SerializeToString()
        assert request_type.FromString(data) == request
        try:
            if method.server_streaming:
                for _ in server.unary_stream(path)(data, timeout=TIMEOUT_S):
                    pass
            else:
                server.unary_unary(path)(data, timeout=TIMEOUT_S)
        except grpc.RpcError as e:
            assert e.code() in ALLOWED, (method.name, e.code(), e.details())
            assert e.details() and len(e.details()) <= 2_100, (method.name, len(e.details() or ""))

    check()
