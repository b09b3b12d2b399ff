"""EventAppendStream's bounds and failure handling (broker/events/append_stream.py): refusals
answered per message, fuzzed messages, the in-flight bound, streams per connection, the idle end
and the broker's close(); the client reopening a stream the broker ended, and threads sharing a
store each getting their own answer."""

from __future__ import annotations

import asyncio
import time
from concurrent import futures
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dmq.broker.events.append_stream import AppendStreams
from dmq.client.events import Event, EventStore
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import error_details
from dmq.proto.grpc_options import channel_options
from tests.integration.test_rpc_fuzz import _message

pytestmark = pytest.mark.timeout(180)

NEVER = {grpc.StatusCode.INTERNAL.value[0], grpc.StatusCode.UNKNOWN.value[0]}
METHOD = "/dmq.v1.Broker/EventAppendStream"


def _event_store(channel: grpc.Channel, name: str) -> str:
    pb_grpc.MetadataStub(channel).CreateTopic(
        pb.CreateTopicRequest(name=name, partitions=1, config=pb.TopicConfig(kind="event-store")), timeout=10)
    return name


def _append(topic: str, type_: str = "t") -> pb.EventAppendRequest:
    return pb.EventAppendRequest(topic=topic, events=[pb.Event(type=type_, tags=["k:v"])])


def _stream(channel: grpc.Channel, requests: list[Any]) -> list[pb.EventAppendResponse]:
    """Every answer of one stream carrying `requests` (messages, or raw bytes)."""
    raw = [r if isinstance(r, bytes) else r.SerializeToString() for r in requests]
    call = channel.stream_stream(METHOD)(iter(raw), timeout=30)
    return [pb.EventAppendResponse.FromString(a) for a in call]


def _code(answer: pb.EventAppendResponse) -> grpc.StatusCode:
    return next(c for c in grpc.StatusCode if c.value[0] == answer.status_code)


@pytest.fixture
def channel(cluster):
    ch = grpc.insecure_channel(cluster.bootstrap, options=channel_options())
    yield ch
    ch.close()


def test_refusals_are_answers_and_the_stream_goes_on(channel):
    topic = _event_store(channel, "es")
    answers = _stream(channel, [
        _append(topic),
        pb.EventAppendRequest(topic=topic),  # no events
        pb.EventAppendRequest(topic="bad name!", events=[pb.Event(type="t")]),
        pb.EventAppendRequest(topic=topic, events=[pb.Event(type="t")],
                              condition=pb.AppendCondition(after=-1)),
        pb.EventAppendRequest(topic=topic, events=[pb.Event(type="t")], condition=pb.AppendCondition(after=0)),
        pb.EventAppendRequest(topic="missing", events=[pb.Event(type="t")]),
        _append(topic),
    ])
    codes = [_code(a) for a in answers]
    S = grpc.StatusCode
    assert codes == [S.OK, S.INVALID_ARGUMENT, S.INVALID_ARGUMENT, S.INVALID_ARGUMENT,
                     S.FAILED_PRECONDITION, S.NOT_FOUND, S.OK]
    assert "events" in answers[1].status_message
    assert "topic" in answers[2].status_message
    assert "condition.after" in answers[3].status_message
    metadata = {m.name: m.value for m in answers[4].status_metadata}
    assert metadata == {error_details.REASON_KEY: error_details.APPEND_CONDITION_FAILED,
                        error_details.CONFLICT_POSITION_KEY: "1"}
    assert [answers[0].last_position, answers[-1].last_position] == [1, 2]


def test_a_message_that_does_not_decode_ends_the_stream_invalid_argument_after_the_answers_before_it(channel):
    topic = _event_store(channel, "es")
    call = channel.stream_stream(METHOD)(iter([_append(topic).SerializeToString(), b"\xff"]), timeout=30)
    answers = []
    with pytest.raises(grpc.RpcError) as e:
        for a in call:
            answers.append(pb.EventAppendResponse.FromString(a))
    assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "dmq.v1.EventAppendRequest" in e.value.details()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=st.lists(_message(pb.EventAppendRequest.DESCRIPTOR), min_size=1, max_size=8))
def test_fuzzed_messages_are_each_answered_never_internal(cluster, messages):
    ch = grpc.insecure_channel(cluster.bootstrap, options=channel_options())
    try:
        answers = _stream(ch, messages)  # the stream ends OK: no RpcError
    finally:
        ch.close()
    assert len(answers) == len(messages)
    for a in answers:
        assert a.status_code not in NEVER, a
        assert len(a.status_message) <= 2_100


# -- the bounds (AppendStreams on its own, no gRPC) --------------------------------------------------


class _Context:
    def __init__(self, peer: str = "ipv4:127.0.0.1:5000") -> None:
        self._peer = peer
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    def peer(self) -> str:
        return self._peer

    async def abort(self, code: grpc.StatusCode, message: str, trailing_metadata: Any = ()) -> None:
        self.aborted = (code, message)
        raise grpc.aio.AbortError()


async def _requests(n: int, sent: list[int]) -> Any:
    for i in range(n):
        sent.append(i)
        yield _append("es")


def test_one_message_at_a_time_each_appended_before_the_next_is_read():
    async def run() -> tuple[int, list[str], int]:
        release = asyncio.Event()
        appended: list[str] = []

        async def append(request: pb.EventAppendRequest) -> pb.EventAppendResponse:
            if not appended:
                await release.wait()  # the first append is slow: the next must wait for it
            appended.append(request.events[0].type)
            return pb.EventAppendResponse(last_position=len(appended))

        async def requests(sent: list[int]) -> Any:
            for i in range(5):
                sent.append(i)
                yield _append("es", f"t{i}")

        streams = AppendStreams(append, lambda e, r: None)  # type: ignore[arg-type, return-value]
        sent: list[int] = []
        answers = streams.serve(requests(sent), _Context())  # type: ignore[arg-type]
        first = asyncio.ensure_future(answers.__anext__())
        await asyncio.sleep(0.1)
        read_before = len(sent)
        release.set()
        positions = [(await first).last_position] + [a.last_position async for a in answers]
        return read_before, appended, positions[-1]

    read_before, appended, last = asyncio.run(run())
    assert read_before == 1  # one read and in flight; the next waits for its answer
    assert appended == [f"t{i}" for i in range(5)] and last == 5  # stored in the order sent


def test_a_request_the_interceptor_refused_is_answered_with_its_status_and_the_stream_goes_on():
    from dmq.proto.server.security.interceptor import RefusedRequest

    async def run() -> list[pb.EventAppendResponse]:
        async def append(request: pb.EventAppendRequest) -> pb.EventAppendResponse:
            return pb.EventAppendResponse(last_position=5)

        async def requests() -> Any:
            yield RefusedRequest(grpc.StatusCode.PERMISSION_DENIED, "principal 'bob' may not write topic 'b'")
            yield _append("a")

        streams = AppendStreams(append, lambda e, r: None)  # type: ignore[arg-type, return-value]
        return [a async for a in streams.serve(requests(), _Context())]  # type: ignore[arg-type]

    refused, stored = asyncio.run(run())
    assert _code(refused) is grpc.StatusCode.PERMISSION_DENIED and "bob" in refused.status_message
    assert stored.status_code == 0 and stored.last_position == 5


def test_streams_per_connection_are_bounded():
    async def run() -> _Context:
        async def append(request: pb.EventAppendRequest) -> pb.EventAppendResponse:
            return pb.EventAppendResponse(last_position=1)

        streams = AppendStreams(append, lambda e, r: None, streams_per_connection_max=1)  # type: ignore[arg-type, return-value]
        hold = asyncio.Event()

        async def never() -> Any:
            await hold.wait()
            yield _append("es")

        first = streams.serve(never(), _Context())  # type: ignore[arg-type]
        task = asyncio.ensure_future(first.__anext__())
        await asyncio.sleep(0.05)
        assert streams.open_count == 1
        ctx = _Context()
        with pytest.raises(grpc.aio.AbortError):
            await streams.serve(never(), ctx).__anext__()  # type: ignore[arg-type]
        other = _Context("ipv4:127.0.0.1:5001")  # another connection may open one
        second = asyncio.ensure_future(streams.serve(never(), other).__anext__())  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        assert streams.open_count == 2
        await streams.close()  # the broker stopping: both end (OK, nothing was read)
        for t in (task, second):
            with pytest.raises(StopAsyncIteration):
                await t
        assert streams.open_count == 0
        return ctx

    ctx = asyncio.run(run())
    assert ctx.aborted is not None and ctx.aborted[0] is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "streams_per_connection" not in ctx.aborted[1] and "1 on this connection" in ctx.aborted[1]


def test_an_idle_stream_ends_ok_after_answering_what_it_read():
    async def run() -> list[pb.EventAppendResponse]:
        async def append(request: pb.EventAppendRequest) -> pb.EventAppendResponse:
            return pb.EventAppendResponse(last_position=7)

        streams = AppendStreams(append, lambda e, r: None, idle_timeout_s=0.1)  # type: ignore[arg-type, return-value]
        hold = asyncio.Event()

        async def one_then_nothing() -> Any:
            yield _append("es")
            await hold.wait()
            yield _append("es")

        return [a async for a in streams.serve(one_then_nothing(), _Context())]  # type: ignore[arg-type]

    answers = asyncio.run(asyncio.wait_for(run(), 5))
    assert [a.last_position for a in answers] == [7]


def test_the_client_opens_a_new_stream_after_the_broker_ends_an_idle_one(cluster, channel):
    topic = _event_store(channel, "es")
    streams = cluster.cluster.brokers[0].event_service._append_streams
    streams.idle_timeout_s = 0.2
    with EventStore(cluster.bootstrap, topic) as store:
        assert store.append(Event("t", b"1")) == 1
        first = store._stream._call
        deadline = time.monotonic() + 10
        while not first.done() and time.monotonic() < deadline:  # the broker ended it, OK
            time.sleep(0.05)
        assert first.code() is grpc.StatusCode.OK and streams.open_count == 0
        assert store.append(Event("t", b"2")) == 2  # on a new stream, the append stored once
        assert store._stream._call is not first
    with EventStore(cluster.bootstrap, topic) as reader:
        assert [e.position for e in reader.read().events] == [1, 2]


def test_threads_sharing_an_event_store_each_get_their_own_answer(cluster, channel):
    topic = _event_store(channel, "es")
    with EventStore(cluster.bootstrap, topic) as store, futures.ThreadPoolExecutor(8) as pool:
        def work(t: int) -> list[tuple[int, bytes]]:
            out = []
            for i in range(25):
                data = f"{t}:{i}".encode()
                out.append((store.append(Event("t", data)), data))
            return out

        answered = dict(p for ps in pool.map(work, range(8)) for p in ps)
        assert sorted(answered) == list(range(1, 201))
        # each thread got its own append's position, not another's answer
        assert {e.position: e.data for e in store.read().events} == answered
