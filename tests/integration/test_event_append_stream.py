"""EventAppendStream (broker/events/append_stream.py) and the client's stream path
(client/events/_append_stream.py): per-message authorization and refusals on one stream, bad
messages, fuzzing, the bounds, and the fallback to unary EventAppend at a broker without it."""

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
from dmq.client._calls import RetryPolicy
from dmq.client.errors import AppendConditionError, InvalidArgumentError
from dmq.client.events import AppendCondition, Event, EventStore, Query, QueryItem
from dmq.client.events._append_stream import AppendStream
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
    return next(c for c in grpc.StatusCode if c.value[0] == answer.error_code)


@pytest.fixture
def channel(cluster):
    ch = grpc.insecure_channel(cluster.bootstrap, options=channel_options())
    yield ch
    ch.close()


# -- refusals and bad messages: answered, the stream goes on --------------------------------------------


def test_refusals_are_answers_and_the_stream_goes_on(channel):
    topic = _event_store(channel, "es")
    answers = _stream(channel, [
        _append(topic),
        b"\xff",  # does not decode
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
    assert codes == [S.OK, S.INVALID_ARGUMENT, S.INVALID_ARGUMENT, S.INVALID_ARGUMENT, S.INVALID_ARGUMENT,
                     S.FAILED_PRECONDITION, S.NOT_FOUND, S.OK]
    assert "dmq.v1.EventAppendRequest" in answers[1].error_message
    assert "events" in answers[2].error_message
    assert "topic" in answers[3].error_message
    assert "condition.after" in answers[4].error_message
    metadata = {m.name: m.value for m in answers[5].error_metadata}
    assert metadata == {error_details.REASON_KEY: error_details.APPEND_CONDITION_FAILED,
                        error_details.CONFLICT_POSITION_KEY: "1"}
    assert [answers[0].last_position, answers[-1].last_position] == [1, 2]


def test_the_client_appends_on_one_stream_with_the_unary_errors(cluster, channel):
    topic = _event_store(channel, "es")
    with EventStore(cluster.bootstrap, topic) as store:
        assert store.append(Event("t", b"x", ["k:v"])) == 1
        stream = store._appends
        call = stream._call
        assert call is not None and not call.done()  # the stream stays open between appends
        with pytest.raises(AppendConditionError) as e:
            store.append(Event("t", b"y"), AppendCondition(Query([QueryItem(tags=["k:v"])]), after=0))
        assert e.value.position == 1
        with pytest.raises(InvalidArgumentError):
            store.append([Event("", b"z")])  # no type
        assert store.append(Event("t", b"w", ["k:v"]), AppendCondition(Query([QueryItem(tags=["k:v"])]), after=1)) == 2
        assert stream._call is call  # refusals did not end it
    assert stream._call is None  # close() ended it


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=st.lists(st.one_of(_message(pb.EventAppendRequest.DESCRIPTOR).map(lambda m: m.SerializeToString()),
                                   st.binary(max_size=64)), min_size=1, max_size=8))
def test_fuzzed_messages_are_each_answered_never_internal(cluster, messages):
    ch = grpc.insecure_channel(cluster.bootstrap, options=channel_options())
    try:
        answers = _stream(ch, messages)  # the stream ends OK: no RpcError
    finally:
        ch.close()
    assert len(answers) == len(messages)
    for a in answers:
        assert a.error_code not in NEVER, a
        assert len(a.error_message) <= 2_100


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
        yield _append("es").SerializeToString()


def test_at_most_in_flight_max_messages_are_read_before_an_answer_goes_out():
    async def run() -> tuple[int, int]:
        release = asyncio.Event()
        started: list[int] = []

        async def append(request: pb.EventAppendRequest) -> pb.EventAppendResponse:
            started.append(1)
            await release.wait()
            return pb.EventAppendResponse(last_position=len(started))

        streams = AppendStreams(append, lambda e, r: None, in_flight_max=4)  # type: ignore[arg-type, return-value]
        sent: list[int] = []
        answers = streams.serve(_requests(20, sent), _Context())  # type: ignore[arg-type]
        first = asyncio.ensure_future(answers.__anext__())
        await asyncio.sleep(0.1)
        read_before = len(sent)
        release.set()
        await first
        rest = [a async for a in answers]
        return read_before, 1 + len(rest)

    read_before, answered = asyncio.run(run())
    # four read and in flight, none answered: the reader waits for a slot before reading the fifth
    assert read_before == 4
    assert answered == 20


def test_streams_per_connection_are_bounded():
    async def run() -> _Context:
        async def append(request: pb.EventAppendRequest) -> pb.EventAppendResponse:
            return pb.EventAppendResponse(last_position=1)

        streams = AppendStreams(append, lambda e, r: None, streams_per_connection_max=1)  # type: ignore[arg-type, return-value]
        hold = asyncio.Event()

        async def never() -> Any:
            await hold.wait()
            yield b""

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
            yield _append("es").SerializeToString()
            await hold.wait()
            yield b""

        return [a async for a in streams.serve(one_then_nothing(), _Context())]  # type: ignore[arg-type]

    answers = asyncio.run(asyncio.wait_for(run(), 5))
    assert [a.last_position for a in answers] == [7]


# -- the client: fallback to unary EventAppend ---------------------------------------------------------


class _OldBroker(pb_grpc.BrokerServicer):
    """A broker from before EventAppendStream: only the unary append."""

    def __init__(self) -> None:
        self.appends = 0

    def EventAppend(self, request: pb.EventAppendRequest, context: Any) -> pb.EventAppendResponse:  # noqa: N802
        self.appends += 1
        return pb.EventAppendResponse(last_position=self.appends)


class _FixedCluster:
    def __init__(self, address: str) -> None:
        self.address = address
        self.retry = RetryPolicy(request_timeout_ms=5_000)
        self.channel = grpc.insecure_channel(address)
        self.invalidated = 0

    def leader_for(self, topic: str, partition: int) -> str:
        return self.address

    def broker_stub(self, address: str) -> pb_grpc.BrokerStub:
        return pb_grpc.BrokerStub(self.channel)

    def invalidate(self, topic: str) -> None:
        self.invalidated += 1


def test_a_broker_without_the_stream_gets_unary_appends():
    old = _OldBroker()
    server = grpc.server(futures.ThreadPoolExecutor(2))
    generic = {"EventAppend": grpc.unary_unary_rpc_method_handler(
        old.EventAppend, request_deserializer=pb.EventAppendRequest.FromString,
        response_serializer=pb.EventAppendResponse.SerializeToString)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("dmq.v1.Broker", generic),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    cluster = _FixedCluster(f"127.0.0.1:{port}")
    unary_calls: list[int] = []

    def unary(request: pb.EventAppendRequest) -> pb.EventAppendResponse:
        unary_calls.append(1)
        answer: pb.EventAppendResponse = cluster.broker_stub(cluster.address).EventAppend(request, timeout=5)
        return answer

    stream = AppendStream(cluster, "es", unary)
    try:
        assert stream.append(_append("es")).last_position == 1  # UNIMPLEMENTED, then unary
        assert stream.append(_append("es")).last_position == 2  # straight to unary
        assert len(unary_calls) == 2 and old.appends == 2
        assert cluster.address in stream._unsupported and stream._call is None
    finally:
        stream.close()
        cluster.channel.close()
        server.stop(0)


def test_the_client_opens_a_new_stream_after_the_broker_ends_an_idle_one(cluster, channel):
    topic = _event_store(channel, "es")
    streams = cluster.cluster.brokers[0].event_service._append_streams
    streams.idle_timeout_s = 0.2
    with EventStore(cluster.bootstrap, topic) as store:
        assert store.append(Event("t", b"1")) == 1
        first = store._appends._call
        deadline = time.monotonic() + 10
        while not first.done() and time.monotonic() < deadline:  # the broker ended it, OK
            time.sleep(0.05)
        assert first.code() is grpc.StatusCode.OK and streams.open_count == 0
        assert store.append(Event("t", b"2")) == 2  # on a new stream, the append stored once
        assert store._appends._call is not first
    with EventStore(cluster.bootstrap, topic) as reader:
        assert [e.position for e in reader.read().events] == [1, 2]


class _MeteredAccess:
    """current_access as the security interceptor sets it for a stream: records what is charged."""

    def __init__(self) -> None:
        self.charged: list[tuple[str, int]] = []
        self.required: list[str] = []

    def require(self, needs: Any, rpc: str) -> None:
        self.required.extend(f"{n.operation} {n.name}" for n in needs)

    def quota_delay_s(self, kind: str, amount: int) -> float:
        self.charged.append((kind, amount))
        return 0.0


def test_each_message_is_authorized_and_charged_to_the_quotas():
    from dmq.proto.server.security.interceptor import current_access

    async def run(access: _MeteredAccess) -> int:
        async def append(request: pb.EventAppendRequest) -> pb.EventAppendResponse:
            return pb.EventAppendResponse(last_position=1)

        streams = AppendStreams(append, lambda e, r: None)  # type: ignore[arg-type, return-value]
        current_access.set(access)  # type: ignore[arg-type]  # as the interceptor does for the call
        sent: list[int] = []
        return len([a async for a in streams.serve(_requests(3, sent), _Context())])  # type: ignore[arg-type]

    access = _MeteredAccess()
    assert asyncio.run(run(access)) == 3
    size = len(_append("es").SerializeToString())
    assert access.required == ["write es"] * 3
    assert access.charged == [("requests", 1), ("produce", size)] * 3


class _ScriptedBroker:
    """EventAppendStream as scripted per stream: "answer" (answer every message), "fail" (read one
    message, then end the call UNAVAILABLE), "end" (end OK without reading), "slow" (never answer)."""

    def __init__(self, script: list[str]) -> None:
        self.script = script
        self.streams = 0
        self.read = 0

    def stream(self, requests: Any, context: grpc.ServicerContext) -> Any:
        mode = self.script[min(self.streams, len(self.script) - 1)]
        self.streams += 1
        if mode == "end":
            return
        for _raw in requests:
            self.read += 1
            if mode == "fail":
                context.abort(grpc.StatusCode.UNAVAILABLE, "broker going away")
            if mode == "slow":
                time.sleep(3)
                return
            yield pb.EventAppendResponse(last_position=self.read)


def _scripted(script: list[str]) -> tuple[_ScriptedBroker, Any, _FixedCluster]:
    broker = _ScriptedBroker(script)
    server = grpc.server(futures.ThreadPoolExecutor(4))
    handlers = {"EventAppendStream": grpc.stream_stream_rpc_method_handler(
        broker.stream, request_deserializer=pb.EventAppendRequest.FromString,
        response_serializer=pb.EventAppendResponse.SerializeToString)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("dmq.v1.Broker", handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return broker, server, _FixedCluster(f"127.0.0.1:{port}")


def _never_unary(request: pb.EventAppendRequest) -> pb.EventAppendResponse:
    raise AssertionError("no unary fallback here")


def test_an_append_whose_stream_failed_after_reading_it_is_not_sent_again():
    from dmq.client.errors import DMQError

    broker, server, cluster = _scripted(["fail", "answer"])
    stream = AppendStream(cluster, "es", _never_unary)
    try:
        with pytest.raises(DMQError) as e:
            stream.append(_append("es"))
        assert e.value.code == "UNAVAILABLE" and broker.read == 1 and broker.streams == 1  # outcome unknown: raised
        assert cluster.invalidated == 1  # the leader is looked up again
        assert stream.append(_append("es")).last_position == 2  # the next append opens a new stream
        assert broker.streams == 2
    finally:
        stream.close()
        cluster.channel.close()
        server.stop(0)


def test_an_append_a_stream_ended_without_reading_is_sent_again_on_a_new_one():
    broker, server, cluster = _scripted(["end", "answer"])
    stream = AppendStream(cluster, "es", _never_unary)
    try:
        assert stream.append(_append("es")).last_position == 1
        assert broker.streams == 2 and broker.read == 1  # read once, by the second stream
    finally:
        stream.close()
        cluster.channel.close()
        server.stop(0)


def test_an_append_past_its_deadline_raises_a_timeout_and_the_stream_is_dropped():
    from dmq.client.errors import DMQTimeoutError

    broker, server, cluster = _scripted(["slow", "answer"])
    cluster.retry = RetryPolicy(request_timeout_ms=300)
    stream = AppendStream(cluster, "es", _never_unary)
    try:
        started = time.monotonic()
        with pytest.raises(DMQTimeoutError):
            stream.append(_append("es"))
        assert time.monotonic() - started < 2.0  # the watchdog cancelled it, not the broker's 3 s
        assert stream._call is None
    finally:
        stream.close()
        cluster.channel.close()
        server.stop(0)


def test_threads_sharing_an_event_store_take_turns_on_its_stream(cluster, channel):
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
