"""DMQ's eventsourcing recorder (dmq.client.events.eventsourcing) over a real broker: the
library's own DCBRecorderTestCase, and an eventsourcing application switched to DMQ by its
environment alone (PERSISTENCE_MODULE), as its other stores are chosen."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator

import eventsourcing.dcb.tests as library_tests
import pytest
from eventsourcing.dcb.api import DCBAppendCondition, DCBEvent, DCBQuery, DCBQueryItem
from eventsourcing.dcb.application import DCBApplication
from eventsourcing.dcb.domain import Decision, Selector, Tagged
from eventsourcing.dcb.persistence import DCBMapper
from eventsourcing.persistence import DataError, IntegrityError, ProgrammingError
from eventsourcing.utils import get_topic, resolve_topic

from dmq.client import AdminClient
from dmq.client.cli.runner import ClusterThread
from dmq.client.events.eventsourcing import DMQDCBFactory, DMQDCBRecorder

pytestmark = pytest.mark.processes  # left out of `make check`

MODULE = "dmq.client.events.eventsourcing"


class TestDMQRecorderPassesTheLibrarysTestCase(library_tests.DCBRecorderTestCase):
    """eventsourcing's DCBRecorderTestCase, each test on a fresh event-store topic of a fresh
    in-process cluster (coordinator and broker on loopback port 0)."""

    @pytest.fixture(autouse=True)
    def _recorder(self, cluster: ClusterThread) -> Iterator[None]:
        self.factory = DMQDCBFactory({"PERSISTENCE_MODULE": MODULE, "DMQ_BOOTSTRAP_SERVERS": cluster.bootstrap})
        self.recorder = self.factory.dcb_recorder()
        yield
        self.factory.close()

    def test_append_read(self) -> None:
        self._test_append_read(self.recorder)

    def test_append_subscribe(self) -> None:
        self._test_append_subscribe(self.recorder)


def test_an_application_switches_to_dmq_by_its_environment(cluster: ClusterThread,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    class Courses(DCBApplication):
        pass

    monkeypatch.setenv("PERSISTENCE_MODULE", MODULE)
    monkeypatch.setenv("COURSES_DMQ_BOOTSTRAP_SERVERS", cluster.bootstrap)  # the app-name prefix works
    with Courses() as app:
        assert isinstance(app.factory, DMQDCBFactory) and isinstance(app.recorder, DMQDCBRecorder)
        assert app.factory.topic == "courses-events"
        joined = DCBEvent(type="StudentJoined", data=b'{"seat": 1}', tags=["course:algebra", "student:joe"])
        assert app.recorder.append([joined]) == 1
        facts = DCBQuery(items=[DCBQueryItem(types=["StudentJoined"], tags=["course:algebra"])])
        seen = app.recorder.read(facts)
        assert [(e.position, e.event) for e in seen] == [(1, joined)] and seen.head == 1
        with pytest.raises(IntegrityError):
            app.recorder.append([joined], DCBAppendCondition(facts, after=0))
        assert app.recorder.append([joined], DCBAppendCondition(facts, after=seen.head)) == 2
    # the topic the factory created is an ordinary DMQ event store, read by DMQ's own client
    with AdminClient(cluster.bootstrap) as admin:
        assert admin.describe_topic("courses-events").partition_count == 1


class CourseRegistered(Decision):
    def __init__(self, name: str, places: int) -> None:
        self.name = name
        self.places = places


class JSONMapper(DCBMapper[Decision]):
    """Decisions as JSON, their class's topic as the event type ("module:Class", as the library's
    own mappers name types)."""

    def to_dcb_event(self, event: Tagged[Decision]) -> DCBEvent:
        return DCBEvent(type=get_topic(type(event.decision)), data=json.dumps(event.decision.as_dict()).encode(),
                        tags=list(event.tags))

    def to_domain_event(self, event: DCBEvent) -> Tagged[Decision]:
        decision = object.__new__(resolve_topic(event.type))
        decision.__dict__.update(json.loads(event.data))
        return Tagged(tags=event.tags, decision=decision)


def test_the_librarys_event_store_decides_on_dmq(cluster: ClusterThread) -> None:
    """The library's own DCBEventStore (selectors of decision classes, a mapper) over the
    recorder: what a DCBApplication configured with MAPPER_TOPIC reads and appends."""
    env = {"PERSISTENCE_MODULE": MODULE, "DMQ_BOOTSTRAP_SERVERS": cluster.bootstrap,
           "MAPPER_TOPIC": get_topic(JSONMapper)}
    with DCBApplication(env) as app:
        course = Selector(types=[CourseRegistered], tags=["course-1"])
        assert list(app.events.read(course)) == [] and app.events.read(course).head is None
        registered = Tagged(tags=["course-1"], decision=CourseRegistered("Algebra", 30))
        assert app.events.append([registered], cb=course, after=None) == 1
        seen = app.events.read(course)
        decisions = [t.decision for t in seen]
        assert [(type(d), d.as_dict()) for d in decisions] == [(CourseRegistered, {"name": "Algebra", "places": 30})]
        assert seen.head == 1
        # a second registration decided on the empty store conflicts; one decided on what was seen does not
        with pytest.raises(IntegrityError):
            app.events.append([registered], cb=course, after=None)
        assert app.events.append([Tagged(tags=["course-2"], decision=CourseRegistered("History", 9))],
                                 cb=course, after=seen.head) == 2


def test_the_recorder_refuses_bad_input_with_the_librarys_errors(cluster: ClusterThread) -> None:
    factory = DMQDCBFactory({"DMQ_BOOTSTRAP_SERVERS": cluster.bootstrap, "DMQ_EVENT_STORE_TOPIC": "es"})
    try:
        recorder = factory.dcb_recorder()
        with pytest.raises(ProgrammingError, match="at least one event"):
            recorder.append([])
        with pytest.raises(DataError, match="type"):
            recorder.append([DCBEvent(type="", data=b"")])
        assert recorder.read().head is None  # nothing stored: the bad appends stored nothing
    finally:
        factory.close()


def test_stop_ends_a_subscription_that_another_thread_waits_on(cluster: ClusterThread) -> None:
    """The subscription's owner stops it from its own thread: the thread iterating it, waiting
    for the next event after the first, returns (StopIteration ends its loop)."""
    factory = DMQDCBFactory({"DMQ_BOOTSTRAP_SERVERS": cluster.bootstrap, "DMQ_EVENT_STORE_TOPIC": "es"})
    try:
        recorder = factory.dcb_recorder()
        subscription = recorder.subscribe()
        seen: list[int] = []
        first = threading.Event()

        def iterate() -> None:
            for e in subscription:
                seen.append(e.position)
                first.set()

        waiter = threading.Thread(target=iterate)
        waiter.start()
        recorder.append([DCBEvent(type="t", data=b"")])
        assert first.wait(timeout=30)  # the thread has the first event and goes on to wait for the next
        subscription.stop()
        waiter.join(timeout=30)
        assert not waiter.is_alive() and seen == [1]
    finally:
        factory.close()


def test_the_factory_needs_the_coordinators_address() -> None:
    with pytest.raises(ProgrammingError, match="DMQ_BOOTSTRAP_SERVERS"):
        DMQDCBFactory({"PERSISTENCE_MODULE": MODULE})


def test_without_the_extra_the_import_error_names_it() -> None:
    """dmq-queue installed without [eventsourcing]: importing the recorder says what to install."""
    code = "import sys; sys.modules['eventsourcing'] = None; import dmq.client.events.eventsourcing"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "pip install 'dmq-queue[eventsourcing]'" in result.stderr.splitlines()[-1]
