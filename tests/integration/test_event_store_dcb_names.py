"""The DCB specification's names over a real broker: what is appended and read with
Event(type, data, tags), Query and AppendCondition(fail_if_events_match, after) is what DMQ's
earlier names (payload, a list of QueryItems, payload_attribute_names) append and read."""

from __future__ import annotations

import pytest

from dmq.client import AdminClient, AppendCondition, Event, EventStore, EventType, Query, QueryItem
from dmq.client.cli.runner import ClusterThread
from dmq.client.errors import AppendConditionError


def test_specification_names_and_earlier_names_store_and_read_the_same(cluster: ClusterThread) -> None:
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("courses", kind="event-store")
    with EventStore(cluster.bootstrap, "courses") as store:
        assert store.append([Event("course.created", b"c1", ["course:algebra"])]) == 1
        assert store.append([Event("course.created", ["course:history"], b"c2")]) == 2  # earlier order
        joined = EventType("student.joined", attributes=["course", "student"])
        assert store.append(joined.new(data=b"j1", course="algebra", student="joe")) == 3

        algebra = Query([QueryItem(tags=["course:algebra"])])
        seen = store.read(algebra)
        assert [(e.position, e.type, e.data) for e in seen] == [(1, "course.created", b"c1"), (3, "student.joined", b"j1")]
        assert seen.head == 3
        assert store.read(list(algebra)) == seen  # a list of items reads the same
        assert [e.payload for e in store.read(Query.all(), after=1, limit=1)] == [b"c2"]
        assert [e.event for e in store.read(Query([QueryItem(types=["course.created"])]))] == [
            Event("course.created", b"c1", ("course:algebra",)), Event("course.created", b"c2", ("course:history",))]

        # the same decision guarded by either spelling of the condition
        for condition in (AppendCondition(fail_if_events_match=algebra, after=1),
                          AppendCondition(list(algebra), after=1)):
            with pytest.raises(AppendConditionError) as conflict:
                store.append(Event("student.joined", b"", ["course:algebra", "student:ann"]), condition)
            assert conflict.value.position == 3
        assert store.append(Event("student.joined", b"j2", ["course:algebra", "student:ann"]),
                            AppendCondition(algebra, after=seen.head)) == 4
        # no items: fail if any event at all follows `after`
        with pytest.raises(AppendConditionError):
            store.append(Event("x", b""), AppendCondition(Query.all(), after=3))
        assert store.append(Event("x", b""), AppendCondition(Query.all(), after=4)) == 5

        with store.subscribe(Query([QueryItem(types=["x"])])) as sub:
            assert next(sub).position == 5
