"""EventAppendStream (issue 30): appends as messages on one open stream, each answered in order;
a refused append answered in the response's status fields with what EventAppend's call would end
with, the stream going on. The client's EventStore.append uses it, one append at a time per
store (the others take the unary call), and falls back to the unary call for a broker without it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from dmq.client import AdminClient
from dmq.client.cli.runner import ClusterThread
from dmq.client.errors import AppendConditionError, InvalidArgumentError, TopicNotFoundError
from dmq.client.events import AppendCondition, Event, EventStore, QueryItem
from dmq.client.events import _stream as stream_module
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import error_details

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def store(cluster: ClusterThread) -> Iterator[EventStore]:
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("es", 1, config={"kind": "event-store"})
    s = EventStore(cluster.bootstrap, "es")
    yield s
    s.close()


def test_each_request_is_answered_in_order_and_a_refusal_does_not_end_the_stream(cluster: ClusterThread,
                                                                                  store: EventStore) -> None:
    k1 = pb.EventQuery(items=[pb.EventQueryItem(tags=["k:1"])])
    requests = [
        pb.EventAppendRequest(topic="es", events=[pb.Event(type="t", tags=["k:1"], payload=b"one")]),
        pb.EventAppendRequest(topic="es", events=[pb.Event(type="")]),  # refused: its field named
        pb.EventAppendRequest(topic="es", events=[pb.Event(type="t", tags=["k:1"])],
                              condition=pb.AppendCondition(fail_if_events_match=k1, after=0)),  # conflicts
        pb.EventAppendRequest(topic="nope", events=[pb.Event(type="t")]),  # no such topic
        pb.EventAppendRequest(topic="es", events=[pb.Event(type="t", tags=["k:2"]), pb.Event(type="t")],
                              condition=pb.AppendCondition(fail_if_events_match=k1, after=1)),
    ]
    with grpc.insecure_channel(cluster.bootstrap) as channel:
        answers = list(pb_grpc.BrokerStub(channel).EventAppendStream(iter(requests), timeout=30))
    assert [a.status_code for a in answers] == [0, grpc.StatusCode.INVALID_ARGUMENT.value[0],
                                                 grpc.StatusCode.FAILED_PRECONDITION.value[0],
                                                 grpc.StatusCode.NOT_FOUND.value[0], 0]
    assert [a.last_position for a in answers] == [1, 0, 0, 0, 3]
    assert "events[0].type" in answers[1].status_message
    conflict = {m.name: m.value for m in answers[2].status_metadata}
    assert conflict[error_details.REASON_KEY] == error_details.APPEND_CONDITION_FAILED
    assert "unknown topic: nope" in answers[3].status_message
    assert [e.position for e in store.read()] == [1, 2, 3]


def test_the_client_appends_on_one_stream_and_raises_as_the_unary_call(store: EventStore) -> None:
    assert store.append(Event("t", ["k:1"], b"one")) == 1
    stream = store._stream
    assert stream is not None
    with pytest.raises(AppendConditionError) as failed:
        store.append(Event("t", ["k:1"]), AppendCondition([QueryItem(tags=["k:1"])], 0))
    assert failed.value.position == 1
    with pytest.raises(InvalidArgumentError, match=r"events\[0\]\.tags\[0\]: tag is 600 bytes long"):
        store.append(Event("t", ["x" * 600]))
    assert store.append(Event("t", ["k:1"]), AppendCondition([QueryItem(tags=["k:1"])], 1)) == 2
    assert store._stream is stream  # refusals answered on the stream, which goes on
    store.close()
    assert store._stream is None


def test_a_stream_is_renewed_after_half_its_lifetime(store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store.append(Event("t", ["k:1"]))
    first = store._stream
    assert first is not None
    monkeypatch.setattr(first, "renew_at", 0.0)  # its first half is over
    assert store.append(Event("t", ["k:1"])) == 2
    assert store._stream is not None and store._stream is not first


def test_concurrent_appends_share_the_stream_or_take_the_unary_call(store: EventStore) -> None:
    positions: list[int] = []
    lock = threading.Lock()

    def appender(k: int) -> None:
        for i in range(25):
            p = store.append(Event("t", [f"w:{k}", f"i:{i}"]))
            with lock:
                positions.append(p)

    threads = [threading.Thread(target=appender, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(positions) == list(range(1, 101))
    assert len(store.read().events) == 100


def test_an_unknown_topic_is_topic_not_found(cluster: ClusterThread) -> None:
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("es", 1, config={"kind": "event-store"})
    with EventStore(cluster.bootstrap, "es") as s:
        s.append(Event("t"))
        s.topic = "gone"  # the metadata says nothing of it: as for the unary call
        with pytest.raises(TopicNotFoundError):
            s.append(Event("t"))


class _Unimplemented(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNIMPLEMENTED

    def details(self) -> str:
        return "Method not found!"


def test_a_broker_without_the_stream_gets_unary_appends(store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[Any] = []

    def unimplemented(self: stream_module.AppendStream, request: pb.EventAppendRequest) -> pb.EventAppendResponse:
        sent.append(request)
        raise _Unimplemented()

    monkeypatch.setattr(stream_module.AppendStream, "send", unimplemented)
    assert store.append(Event("t", ["k:1"])) == 1  # nothing was appended on the stream: sent by the unary call
    assert store.append(Event("t", ["k:1"])) == 2
    assert len(sent) == 1 and store._stream is None and not store._stream_supported
    assert [e.position for e in store.read()] == [1, 2]
