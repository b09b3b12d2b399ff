"""DMQ's event store as an `eventsourcing` (9.5+) DCB recorder: an eventsourcing application
switches to DMQ by configuration, as it does to its PostgreSQL or in-memory recorders.

    pip install 'dmq-queue[eventsourcing]'
    PERSISTENCE_MODULE=dmq.client.events.eventsourcing
    DMQ_BOOTSTRAP_SERVERS=127.0.0.1:9091         # the coordinator (a list: "h:p,h:p")
    DMQ_EVENT_STORE_TOPIC=courses                # default: "<application name>-events" ("dcb-events")
    DMQ_CREATE_TOPIC=y                           # default y: create the event-store topic if missing
    DMQ_REQUEST_TIMEOUT_MS=30000                 # optional

Like every eventsourcing setting, each may be prefixed with the application's name in upper case
(`COURSES_DMQ_EVENT_STORE_TOPIC`); TLS and the token come from DMQ's own environment variables,
as for every client. `DMQDCBFactory.dcb_recorder()` is what `DCBApplication` asks for (the
factory makes DCB recorders only, the one kind of recorder a DCBInfrastructureFactory must make).

The recorder maps the DCB objects one to one: `DCBEvent(type, data, tags)` is DMQ's
`Event(type, data, tags)`, positions are DMQ's, a failed append condition raises eventsourcing's
`IntegrityError`. A read's `head` is as the library's own recorders give it: without a limit
the store's last position when the read began (None when the store is empty), with one the last
returned event's position (None when none is returned). A subscription is DMQ's
EventSubscribe stream; `stop()` (or leaving its `with`) ends it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

try:
    import eventsourcing.dcb.api  # noqa: F401  (only to say what to install when it is missing)
except ImportError as e:  # the recorder is an optional extra: name it rather than a bare module
    raise ImportError(f"{__name__} needs the eventsourcing library (>= 9.5): "
                      "pip install 'dmq-queue[eventsourcing]'") from e

from eventsourcing.dcb.api import (
    DCBAppendCondition,
    DCBEvent,
    DCBQuery,
    DCBReadResponse,
    DCBRecorder,
    DCBSequencedEvent,
    DCBSubscription,
)
from eventsourcing.dcb.persistence import DCBInfrastructureFactory
from eventsourcing.persistence import DataError, IntegrityError, OperationalError, ProgrammingError, TrackingRecorder
from eventsourcing.utils import Environment, EnvType, strtobool

from dmq.client.admin import AdminClient
from dmq.client.errors import (
    AppendConditionError,
    DMQError,
    InvalidArgumentError,
    TopicAlreadyExistsError,
    TopicNotFoundError,
)
from dmq.client.events import EventStore, EventSubscription, ReadResult, SequencedEvent
from dmq.client.events._model import AppendCondition, Event, Query, QueryItem

__all__ = ["DMQDCBFactory", "DMQDCBRecorder", "DMQDCBSubscription", "DMQDCBReadResponse"]


def _query(query: DCBQuery | None) -> Query:
    return Query(tuple(QueryItem(tuple(i.types), tuple(i.tags)) for i in query.items)) if query else Query()


def _dcb_event(e: SequencedEvent) -> DCBSequencedEvent:
    return DCBSequencedEvent(event=DCBEvent(type=e.type, data=e.data, tags=list(e.tags)), position=e.position)


def _translated(e: DMQError) -> Exception:
    """eventsourcing's class for a DMQ error, so an application handles DMQ as its other stores."""
    if isinstance(e, AppendConditionError):
        return IntegrityError(str(e))
    if isinstance(e, InvalidArgumentError):
        return DataError(str(e))
    if e.retriable:
        return OperationalError(str(e))
    return e


class DMQDCBReadResponse(DCBReadResponse):
    """The events of one read, made DCB objects as they are iterated."""

    def __init__(self, events: Iterator[SequencedEvent], head: int | None) -> None:
        self._events = events
        self._head = head

    @property
    def head(self) -> int | None:
        return self._head

    def __next__(self) -> DCBSequencedEvent:
        return _dcb_event(next(self._events))


class DMQDCBRecorder(DCBRecorder):
    """A DCBRecorder on a DMQ event-store topic (one EventStore; closed with the factory)."""

    def __init__(self, store: EventStore) -> None:
        self.store = store

    def __repr__(self) -> str:
        return f"<DMQDCBRecorder {self.store!r}>"

    def read(self, query: DCBQuery | None = None, *, after: int | None = None,
             limit: int | None = None) -> DMQDCBReadResponse:
        if limit == 0:  # nothing asked for: nothing read, no head (as the library's recorders)
            return DMQDCBReadResponse(iter(()), None)
        try:
            result: ReadResult = self.store.read(_query(query), after=after, limit=limit)
        except DMQError as e:
            raise _translated(e) from e
        if limit is None:
            head = result.head or None
        else:
            events = result.events
            head = events[-1].position if events else None
        return DMQDCBReadResponse(iter(result), head)

    def append(self, events: Sequence[DCBEvent], condition: DCBAppendCondition | None = None) -> int:
        if not events:
            raise ProgrammingError("append needs at least one event")
        batch = [Event(e.type, e.data, tuple(e.tags)) for e in events]
        dmq_condition = None if condition is None else AppendCondition(
            _query(condition.fail_if_events_match), condition.after)
        try:
            return self.store.append(batch, dmq_condition)
        except DMQError as e:
            raise _translated(e) from e

    def subscribe(self, query: DCBQuery | None = None, *, after: int | None = None) -> DMQDCBSubscription:
        return DMQDCBSubscription(self, query=query, after=after)


class DMQDCBSubscription(DCBSubscription[DMQDCBRecorder]):
    """Matching events after `after`, then each one as it is appended, until stop()."""

    def __init__(self, recorder: DMQDCBRecorder, query: DCBQuery | None = None, after: int | None = None) -> None:
        super().__init__(recorder, query=query, after=after)
        self._stream: EventSubscription = recorder.store.subscribe(_query(query), after=after)

    def stop(self) -> None:
        super().stop()
        self._stream.close()  # a next() blocked on the stream ends with StopIteration

    def __next__(self) -> DCBSequencedEvent:
        if self._has_been_stopped:
            raise StopIteration
        try:
            e = next(self._stream)
        except DMQError as err:
            raise _translated(err) from err
        self._last_position = e.position
        return _dcb_event(e)


class DMQDCBFactory(DCBInfrastructureFactory[TrackingRecorder]):
    """The persistence module's factory: `DCBApplication` finds it through PERSISTENCE_MODULE."""

    BOOTSTRAP_SERVERS = "DMQ_BOOTSTRAP_SERVERS"
    EVENT_STORE_TOPIC = "DMQ_EVENT_STORE_TOPIC"
    CREATE_TOPIC = "DMQ_CREATE_TOPIC"
    REQUEST_TIMEOUT_MS = "DMQ_REQUEST_TIMEOUT_MS"

    def __init__(self, env: Environment | EnvType | None) -> None:
        super().__init__(env)
        bootstrap = self.env.get(self.BOOTSTRAP_SERVERS)
        if not bootstrap:
            raise ProgrammingError(f"{self.BOOTSTRAP_SERVERS} is not set: name the DMQ coordinator's host:port")
        self.bootstrap_servers = bootstrap
        self.topic = self.env.get(self.EVENT_STORE_TOPIC) or f"{self.env.name.lower() or 'dcb'}-events"
        timeout = self.env.get(self.REQUEST_TIMEOUT_MS)
        try:
            self.request_timeout_ms = int(timeout) if timeout else 30_000
        except ValueError:
            raise ProgrammingError(f"{self.REQUEST_TIMEOUT_MS} must be a whole number of milliseconds, "
                                   f"got {timeout!r}") from None
        self.create_topic = strtobool(self.env.get(self.CREATE_TOPIC) or "yes")
        self._stores: list[EventStore] = []

    def dcb_recorder(self) -> DMQDCBRecorder:
        if self.create_topic:
            self._create_topic()
        store = EventStore(self.bootstrap_servers, self.topic, request_timeout_ms=self.request_timeout_ms)
        self._stores.append(store)
        return DMQDCBRecorder(store)

    def _create_topic(self) -> None:
        with AdminClient(self.bootstrap_servers, request_timeout_ms=self.request_timeout_ms) as admin:
            try:
                admin.describe_topic(self.topic)
            except TopicNotFoundError:
                try:
                    admin.create_topic(self.topic, kind="event-store")
                except TopicAlreadyExistsError:
                    pass  # another process created it meanwhile

    def close(self) -> None:
        stores, self._stores = self._stores, []
        for store in stores:
            store.close()
