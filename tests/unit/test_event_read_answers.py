"""EventStore.read() pages through both answer shapes: the columnar one (this broker's, asked
for with `columnar`) and one message per event (a broker from before columnar answers ignores
the field). The broker is replaced by canned answers here: the real one always answers columnar."""

from __future__ import annotations

import pickle
from dataclasses import FrozenInstanceError
from typing import Any

import pytest

from dmq.client.events import Event, EventStore, ReadResult, SequencedEvent
from dmq.proto import dmq_pb2 as pb

EVENTS = [SequencedEvent(p, Event("t", (f"k:{p}", "x"), b"p%d" % p, b"m"), 1_000 + p) for p in range(1, 8)]
HEAD = 6  # event 7 was appended after the read began: never returned


def _rows(events: list[SequencedEvent]) -> pb.EventReadResponse:
    return pb.EventReadResponse(head=HEAD, events=[
        pb.SequencedEvent(position=e.position, append_time_ms=e.append_time_ms,
                          event=pb.Event(type=e.type, tags=list(e.tags), payload=e.payload, metadata=e.metadata))
        for e in events
    ])


def _columns(events: list[SequencedEvent], read_to: int = 0) -> pb.EventReadResponse:
    answer = pb.EventReadResponse(head=HEAD, read_to=read_to)
    for e in events:
        answer.positions.append(e.position)
        answer.types.append(e.type)
        answer.tags.append("\n".join(e.tags))
        answer.payloads.append(e.payload)
        answer.metadata.append(e.metadata)
        answer.append_times_ms.append(e.append_time_ms)
    return answer


def _store(shape: Any, page: int) -> tuple[EventStore, list[pb.EventReadRequest]]:
    """A store whose EventRead answers `page` events at a time after the request's cursor."""
    store = EventStore("127.0.0.1:1", "es")
    store.close()  # no call reaches a broker
    requests: list[pb.EventReadRequest] = []

    def call(method: str, request: pb.EventReadRequest, **_: object) -> pb.EventReadResponse:
        assert method == "EventRead" and request.columnar
        requests.append(request)
        limit = request.limit or page
        return shape([e for e in EVENTS if e.position > request.after][: min(page, limit)])

    store._call = call  # type: ignore[method-assign]
    return store, requests


def test_columnar_answers_are_paged_up_to_the_head() -> None:
    store, requests = _store(_columns, 4)
    result = store.read()
    assert result.head == HEAD and list(result.events) == EVENTS[:6]
    assert [r.after for r in requests] == [0, 4]


def test_an_older_brokers_row_shaped_answers_are_read_and_paged_too() -> None:
    store, requests = _store(_rows, 4)
    result = store.read()
    assert result.head == HEAD and list(result.events) == EVENTS[:6]
    assert [r.after for r in requests] == [0, 4]


def test_read_to_saves_the_last_call() -> None:
    # the broker says no match lies past the page's last event up to the head: one call
    store, requests = _store(lambda events: _columns(events, read_to=HEAD), 10)
    assert list(store.read().events) == EVENTS[:6] and len(requests) == 1
    # read_to past the last event but short of the head: the next call starts there
    store, requests = _store(lambda events: _columns(events, read_to=5), 3)
    store.read()
    assert [r.after for r in requests] == [0, 5]


def test_events_of_a_read_are_views_that_behave_as_values() -> None:
    store, _ = _store(_columns, 10)
    got = store.read().events
    assert got == EVENTS[:6] and hash(got[2]) == hash(EVENTS[2]) and got[2].tags == ("k:3", "x")
    assert (got[0].position, got[0].type, got[0].payload, got[0].metadata, got[0].append_time_ms) == (1, "t", b"p1", b"m", 1_001)
    assert pickle.loads(pickle.dumps(got[1])) == EVENTS[1]


def test_a_limit_bounds_the_pages_asked_for() -> None:
    store, requests = _store(_columns, 2)  # a broker whose pages are short (its byte bound)
    assert store.read(limit=5).events == EVENTS[:5]
    assert [(r.after, r.limit) for r in requests] == [(0, 5), (2, 3), (4, 1)]
    assert store.read(limit=0).events == [] and len(requests) == 3  # no call


def test_a_result_iterated_makes_its_events_as_it_goes_and_equals_its_list() -> None:
    store, _ = _store(_columns, 4)
    result = store.read()
    assert len(result) == 6 and [e.position for e in result] == [1, 2, 3, 4, 5, 6]
    assert result._events is None  # iterating made no list of the events: the views were not kept
    assert list(result) == EVENTS[:6] and result.events == EVENTS[:6] and list(result) == result.events
    assert result == ReadResult(EVENTS[:6], HEAD) and result != ReadResult(EVENTS[:5], HEAD)
    assert pickle.loads(pickle.dumps(result)) == result and repr(result).startswith("ReadResult(events=[SequencedEvent(")
    match result:
        case ReadResult(events, head):
            assert (len(events), head) == (6, HEAD)
    with pytest.raises(FrozenInstanceError):
        result.head = 1  # type: ignore[misc]
    # more events than one chunk of the iteration, over two pages
    many = [SequencedEvent(p, Event("t", (), b"%d" % p), p) for p in range(1, 1_001)]
    answers = [_columns(many[:600]), _columns(many[600:])]
    for a in answers:
        a.head = 1_000
    assert list(ReadResult._of_pages([(a, len(a.positions)) for a in answers], 1_000)) == many
