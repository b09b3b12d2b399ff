"""The event store's vocabulary as the DCB specification names it (Event(type, data, tags),
Query, QueryItem, AppendCondition(fail_if_events_match, after), EventType(name, attributes)) and
DMQ's earlier names, which stay accepted and mean the same."""

from __future__ import annotations

import pickle

import pytest

from dmq.client import AppendCondition, Event, EventType, Query, QueryItem
from dmq.client.errors import InvalidArgumentError
from dmq.client.events import SequencedEvent


def test_event_takes_the_specifications_order_and_the_earlier_one() -> None:
    new = Event("course.created", b"{}", ["course_name:Algebra"])
    assert (new.type, new.data, list(new.tags), new.metadata) == ("course.created", b"{}", ["course_name:Algebra"], b"")
    # DMQ's earlier order (type, tags, payload, metadata), told apart by a list of tags second
    assert Event("course.created", ["course_name:Algebra"], b"{}") == new
    assert Event("t", ("a",), b"p", b"m") == Event("t", b"p", ("a",), b"m")
    assert Event("t", ["a"]) == Event("t", b"", ["a"]) == Event("t", tags=["a"])
    assert Event("t", payload=b"p") == Event("t", b"p") == Event(type="t", data=b"p")
    assert new.payload == new.data == b"{}"
    assert Event("t", bytearray(b"x")).data.__class__ is bytes
    assert new.attributes == {"course_name": "Algebra"}


def test_event_refuses_ambiguous_or_wrong_input() -> None:
    with pytest.raises(InvalidArgumentError, match="data must be bytes"):
        Event("t", "text")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="not both"):
        Event("t", b"d", payload=b"p")
    with pytest.raises(InvalidArgumentError, match="tags must be a list"):
        Event("t", b"d", "a:b")


def test_events_compare_hash_pickle_and_stay_frozen() -> None:
    e = Event("t", b"d", ("a",), b"m")
    assert hash(e) == hash(Event("t", ("a",), b"d", b"m"))
    assert pickle.loads(pickle.dumps(e)) == e
    assert repr(e) == "Event(type='t', data=b'd', tags=('a',), metadata=b'm')"
    with pytest.raises(AttributeError):
        e.data = b"x"  # type: ignore[misc]
    seq = SequencedEvent(3, e)
    assert (seq.data, seq.payload, seq.event) == (b"d", b"d", e)


def test_query_is_the_sequence_of_its_items() -> None:
    a, b = QueryItem(types=["t"]), QueryItem(tags=["x:1"])
    q = Query(items=[a, b])
    assert q.items == (a, b) and list(q) == [a, b] and len(q) == 2 and q[1] == b
    assert q == Query.from_items([a, b]) != Query([b, a])
    assert Query.all() == Query() and len(Query.all()) == 0
    assert q.to_proto() == Query((a, b)).to_proto()
    with pytest.raises(InvalidArgumentError, match="list of QueryItems"):
        Query(a)  # type: ignore[arg-type]


def test_append_condition_takes_a_query_or_a_list_of_items() -> None:
    items = [QueryItem(types=["t"], tags=["x:1"])]
    new = AppendCondition(fail_if_events_match=Query(items), after=4)
    old = AppendCondition(items, after=4)
    assert new == old and isinstance(old.fail_if_events_match, Query)
    assert new.to_proto() == old.to_proto()
    # no items: any event after `after` fails the append (the specification's "all" query)
    assert AppendCondition().fail_if_events_match == Query.all() and AppendCondition().after is None
    with pytest.raises(InvalidArgumentError, match="Query or a list"):
        AppendCondition(QueryItem(types=["t"]))  # type: ignore[arg-type]


def test_event_type_declares_attributes_by_either_name() -> None:
    joined = EventType("student.joined", ["course_name", "user_id"])
    assert joined == EventType("student.joined", attributes=("course_name", "user_id"))
    assert joined == EventType("student.joined", payload_attribute_names=["course_name", "user_id"])
    assert joined.attributes == joined.payload_attribute_names == ("course_name", "user_id")
    e = joined.new(b"{}", course_name="Algebra", user_id="joe")
    assert e == Event("student.joined", b"{}", ("course_name:Algebra", "user_id:joe"))
    assert joined.new(payload=b"{}", course_name="Algebra", user_id="joe") == e == \
        joined.new(data=b"{}", course_name="Algebra", user_id="joe")
    with pytest.raises(InvalidArgumentError, match="not both"):
        EventType("t", ["a"], payload_attribute_names=["a"])
    with pytest.raises(InvalidArgumentError, match="not one string"):
        EventType("t", "a")
