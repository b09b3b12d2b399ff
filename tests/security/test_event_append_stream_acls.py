"""EventAppendStream's authorization: the call is authenticated once, and every message needs
WRITE on its own topic (broker/events/append_stream.py); a refused message stores nothing and the
stream goes on."""

from __future__ import annotations

import time
from typing import Any

import grpc
import pytest

from dmq.client._cluster import Cluster
from dmq.client.errors import AuthorizationError
from dmq.client.events import Event, EventStore
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto.grpc_options import channel_options
from dmq.proto.security.settings import sync_channel
from tests.integration.test_event_append_stream_bounds import _append, _code, _event_store, _stream
from tests.security.conftest import client_as

pytestmark = pytest.mark.timeout(180)


def test_each_message_needs_write_on_its_own_topic(secure_cluster, certs):
    """alice may write topic A, not B: on one stream B's message is refused PERMISSION_DENIED and
    stores nothing, while A's before and after it are stored."""
    c = secure_cluster("tokens")
    admin = sync_channel(c.bootstrap, client_as(certs, "tokens", "admin"), channel_options())
    alice = sync_channel(c.bootstrap, client_as(certs, "tokens", "alice"), channel_options())
    try:
        a, b = _event_store(admin, "allowed"), _event_store(admin, "forbidden")
        pb_grpc.MetadataStub(admin).AddAcls(pb.AddAclsRequest(acls=[pb.AclEntry(
            principal="alice", resource_type="topic", resource_name=a, operation="write", permission="allow")]),
            timeout=10)
        answers = _stream(alice, [_append(a), _append(b), _append(a)])
        assert [_code(x) for x in answers] == [grpc.StatusCode.OK, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.OK]
        assert [x.last_position for x in answers] == [1, 0, 2]
        assert "alice" in answers[1].status_message and repr(b) in answers[1].status_message
        broker = pb_grpc.BrokerStub(admin)
        assert broker.EventRead(pb.EventReadRequest(topic=b), timeout=10).head == 0  # nothing stored in B
        assert broker.EventRead(pb.EventReadRequest(topic=a), timeout=10).head == 2
        # no credentials: every message refused UNAUTHENTICATED, nothing stored
        nobody = sync_channel(c.bootstrap, client_as(certs, "tokens", None), channel_options())
        try:
            refused = _stream(nobody, [_append(a), _append(a)])
            assert [_code(x) for x in refused] == [grpc.StatusCode.UNAUTHENTICATED] * 2
            assert broker.EventRead(pb.EventReadRequest(topic=a), timeout=10).head == 2
        finally:
            nobody.close()
        # the client library: the refusal is the unary call's error, and the stream goes on (alice
        # may look both topics up: the refusal comes from the append, not the metadata)
        pb_grpc.MetadataStub(admin).AddAcls(pb.AddAclsRequest(acls=[pb.AclEntry(
            principal="alice", resource_type="topic", resource_name=t, operation="describe", permission="allow")
            for t in (a, b)]), timeout=10)
        with _client(c, certs, b) as store:
            with pytest.raises(AuthorizationError):
                store.append(Event("t", b""))
            stream = store._stream
            assert stream is not None  # the refusal did not end it
            store.topic = a  # the same EventStore's stream, another topic: allowed
            assert store.append(Event("t", b"")) == 3
            assert store._stream is stream
    finally:
        admin.close()
        alice.close()


def _client(c: Any, certs: Any, topic: str) -> EventStore:
    cluster = Cluster(c.bootstrap, security=client_as(certs, "tokens", "alice"))
    store = EventStore(topic=topic, cluster=cluster)
    store._own_cluster = True  # closed with the store
    return store




def test_each_message_is_charged_to_the_principals_produce_quota(secure_cluster, certs):
    """A stream is one call, but every message's bytes count against the produce rate: 6 appends of
    ~1 KB at 2 KB/s (a second of burst) take about two seconds, not a few milliseconds."""
    from dmq.proto.server.security.quotas import QuotaSettings, Rates

    c = secure_cluster("tokens", quotas=QuotaSettings(principals={"alice": Rates(produce_bytes_per_s=2_000)}))
    admin = sync_channel(c.bootstrap, client_as(certs, "tokens", "admin"), channel_options())
    alice = sync_channel(c.bootstrap, client_as(certs, "tokens", "alice"), channel_options())
    try:
        topic = _event_store(admin, "metered")
        pb_grpc.MetadataStub(admin).AddAcls(pb.AddAclsRequest(acls=[pb.AclEntry(
            principal="alice", resource_type="topic", resource_name=topic, operation="write", permission="allow")]),
            timeout=10)
        request = pb.EventAppendRequest(topic=topic, events=[pb.Event(type="t", payload=b"x" * 1_000)])
        started = time.monotonic()
        answers = _stream(alice, [request] * 6)
        elapsed_s = time.monotonic() - started
        assert [a.status_code for a in answers] == [0] * 6
        assert elapsed_s >= 1.5, elapsed_s
    finally:
        admin.close()
        alice.close()
