"""DMQ's eventsourcing recorder (dmq.client.events.eventsourcing) over a real broker: the
library's own DCBRecorderTestCase, and an eventsourcing application switched to DMQ by its
environment alone (PERSISTENCE_MODULE), as its other stores are chosen."""

from __future__ import annotations

from collections.abc import Iterator

import eventsourcing.dcb.tests as library_tests
import pytest
from eventsourcing.dcb.api import DCBAppendCondition, DCBEvent, DCBQuery, DCBQueryItem
from eventsourcing.dcb.application import DCBApplication
from eventsourcing.persistence import DataError, IntegrityError, ProgrammingError

from dmq.client import AdminClient
from dmq.client.cli.runner import ClusterThread
from dmq.client.events.eventsourcing import DMQDCBFactory, DMQDCBRecorder

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


def test_the_factory_needs_the_coordinators_address() -> None:
    with pytest.raises(ProgrammingError, match="DMQ_BOOTSTRAP_SERVERS"):
        DMQDCBFactory({"PERSISTENCE_MODULE": MODULE})
