"""The event store's vocabulary, named as the DCB specification (dcb.events) and the
`eventsourcing` library name it: `Event(type, data, tags)`, `Query(items=[QueryItem(types, tags)])`,
`AppendCondition(fail_if_events_match, after)`, and `EventType(name, attributes)` declaring the
attributes an event carries as "name:value" tags.

DMQ's earlier names stay accepted, so code written against them keeps working:
- `Event(type, tags, payload, metadata)`: the old positional order, recognised by its second
  argument being a list or tuple of tags (data is bytes); `payload=` and `.payload` for `data`;
- a list of QueryItems wherever a Query is taken (a Query is itself a sequence of its items);
- `EventType(name, payload_attribute_names=...)` and `.payload_attribute_names` for `attributes`;
  `EventType.new(payload=...)` for `data`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import overload

from dmq.client.errors import InvalidArgumentError
from dmq.proto import dmq_pb2 as pb
from dmq.proto.event_headers import attribute_of

__all__ = ["Event", "QueryItem", "Query", "AppendCondition", "EventType"]

_BYTES_LIKE = (bytes, bytearray, memoryview)
_TAG_SEQUENCES = (list, tuple)


@dataclass(frozen=True, slots=True, init=False)
class Event:
    """An event: its `type`, its `data` (opaque bytes), its `tags` and DMQ's optional `metadata`.

    `Event(type, data, tags)` as the DCB specification orders them; `Event(type, tags, payload)`,
    DMQ's earlier order, is recognised by a list or tuple of tags in second place."""

    type: str
    data: bytes
    tags: Sequence[str]
    metadata: bytes

    def __init__(
        self,
        type: str,  # noqa: A002 - the DCB specification's name
        data: bytes | Sequence[str] = b"",
        tags: Sequence[str] | bytes = (),
        metadata: bytes = b"",
        *,
        payload: bytes | None = None,
    ) -> None:
        if data.__class__ is bytes and payload is None and tags.__class__ in _TAG_SEQUENCES:
            # the usual call, in the specification's order: nothing to tell apart or convert
            _init_event(self, type, data, tags, metadata)
            return
        if not isinstance(data, _BYTES_LIKE):
            if isinstance(data, str):
                raise InvalidArgumentError(
                    f"Event data must be bytes, got a string ({type!r}): encode it, e.g. data=text.encode()")
            # DMQ's earlier order Event(type, tags, payload, metadata): a sequence of tags second
            data, tags = (tags if isinstance(tags, _BYTES_LIKE) else b""), data
        if payload is not None:
            if data:
                raise InvalidArgumentError("Event takes data= or its earlier name payload=, not both")
            data = payload
        if isinstance(tags, (str, *_BYTES_LIKE)):
            raise InvalidArgumentError(f"Event tags must be a list of strings, got {tags!r}")
        _init_event(self, type, data if data.__class__ is bytes else bytes(data), tags, metadata)

    @classmethod
    def _of(cls, type: str, data: bytes, tags: Sequence[str], metadata: bytes) -> Event:  # noqa: A002
        """An event from values known to be right (a read's answer): no checks, no conversions."""
        event = object.__new__(cls)
        _init_event(event, type, data, tags, metadata)
        return event

    @property
    def payload(self) -> bytes:
        """`data`, by DMQ's earlier name."""
        return self.data

    @property
    def attributes(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for tag in self.tags:
            attr = attribute_of(tag)
            if attr is not None:
                out.setdefault(*attr)
        return out

    def to_proto(self) -> pb.Event:
        return pb.Event(type=self.type, tags=list(self.tags), payload=self.data, metadata=self.metadata)


# The slots' own setters: they bypass the frozen __setattr__, as the generated __init__ of a
# frozen dataclass does (cheaper than object.__setattr__ per field, as SequencedEvent's setters).
_set_type = vars(Event)["type"].__set__
_set_data = vars(Event)["data"].__set__
_set_tags = vars(Event)["tags"].__set__
_set_metadata = vars(Event)["metadata"].__set__


def _init_event(event: Event, type: str, data: bytes, tags: Sequence[str], metadata: bytes) -> None:  # noqa: A002
    _set_type(event, type)
    _set_data(event, data)
    _set_tags(event, tags)
    _set_metadata(event, metadata)


@dataclass(frozen=True, slots=True)
class QueryItem:
    """Matches an event whose type is one of `types` (any type when empty) and that carries every
    tag of `tags`."""

    types: Sequence[str] = ()
    tags: Sequence[str] = ()

    def to_proto(self) -> pb.EventQueryItem:
        return pb.EventQueryItem(types=list(self.types), tags=list(self.tags))


@dataclass(frozen=True, slots=True)
class Query(Sequence[QueryItem]):
    """Query items, OR'd: an event matches the query if it matches any item. No items (`Query()`,
    `Query.all()`) matches every event. A Query is also the sequence of its items, so code that
    took a list of QueryItems takes a Query, and the other way round."""

    items: Sequence[QueryItem] = ()

    def __post_init__(self) -> None:
        if isinstance(self.items, (str, QueryItem)):
            raise InvalidArgumentError("Query(items=...) takes a list of QueryItems")
        object.__setattr__(self, "items", tuple(self.items))

    @classmethod
    def all(cls) -> Query:
        """The query every event matches."""
        return cls()

    @classmethod
    def from_items(cls, items: Iterable[QueryItem]) -> Query:
        return cls(tuple(items))

    def __iter__(self) -> Iterator[QueryItem]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    @overload
    def __getitem__(self, index: int) -> QueryItem: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[QueryItem]: ...

    def __getitem__(self, index: int | slice) -> QueryItem | Sequence[QueryItem]:
        return self.items[index]

    def to_proto(self) -> pb.EventQuery:
        return _query_proto(self)


def _query_proto(query: Iterable[QueryItem] | None) -> pb.EventQuery:
    """A Query, or a list of QueryItems (DMQ's earlier form), as the wire's EventQuery."""
    items = list(query or ())
    for i, item in enumerate(items):
        if not isinstance(item, QueryItem):
            raise InvalidArgumentError(f"query[{i}] must be a QueryItem, got {type(item).__name__}")
        for name in ("types", "tags"):
            if isinstance(getattr(item, name), str):
                raise InvalidArgumentError(f"query[{i}].{name} must be a list of strings, not one string")
    return pb.EventQuery(items=[i.to_proto() for i in items])


@dataclass(frozen=True, slots=True)
class AppendCondition:
    """Fail the append if an event after position `after` (None: any event) matches
    `fail_if_events_match` (a Query, or a list of QueryItems; no items: any event)."""

    # typed as what it takes: a Query is itself a Sequence[QueryItem], and __post_init__ makes a
    # list of items one, so the field always holds a Query
    fail_if_events_match: Sequence[QueryItem] = Query()
    after: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.fail_if_events_match, Query):
            if isinstance(self.fail_if_events_match, (str, QueryItem)):
                raise InvalidArgumentError("fail_if_events_match takes a Query or a list of QueryItems")
            object.__setattr__(self, "fail_if_events_match", Query(tuple(self.fail_if_events_match)))

    def to_proto(self) -> pb.AppendCondition:
        return pb.AppendCondition(fail_if_events_match=_query_proto(self.fail_if_events_match), after=self.after or 0)


@dataclass(frozen=True, slots=True, init=False)
class EventType:
    """An event type and the attributes its events carry (e.g. "user.joined_course" with
    course_name and user_id): `EventType(name, attributes)`; `payload_attribute_names=` is the
    earlier name of `attributes`."""

    name: str
    attributes: tuple[str, ...]

    def __init__(self, name: str, attributes: Sequence[str] = (), *,
                 payload_attribute_names: Sequence[str] | None = None) -> None:
        if payload_attribute_names is not None:
            if attributes:
                raise InvalidArgumentError("EventType takes attributes= or its earlier name "
                                           "payload_attribute_names=, not both")
            attributes = payload_attribute_names
        if isinstance(attributes, str):
            raise InvalidArgumentError("attributes must be a list of names, not one string")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "attributes", tuple(attributes))

    @property
    def payload_attribute_names(self) -> tuple[str, ...]:
        """`attributes`, by DMQ's earlier name."""
        return self.attributes

    def new(self, data: bytes = b"", *, tags: Sequence[str] = (), metadata: bytes = b"",
            payload: bytes | None = None, **attributes: str) -> Event:
        """An event of this type, tagged "name:value" with every declared attribute (all required);
        `payload=` is the earlier name of `data`."""
        missing = [n for n in self.attributes if n not in attributes]
        extra = sorted(set(attributes) - set(self.attributes))
        if missing or extra:
            raise InvalidArgumentError(
                f"{self.name} declares attributes {list(self.attributes)}: "
                + (f"missing {missing}" if missing else f"not declared {extra}")
            )
        attr_tags = [f"{n}:{attributes[n]}" for n in self.attributes]
        return Event(self.name, data, (*attr_tags, *tags), metadata, payload=payload)

    def to_conditions(self, **attributes: str) -> list[QueryItem]:
        """One query item per attribute this type declares and `attributes` gives: events of this
        type carrying that one value (none when it declares none of them). The items are
        alternatives, so as an append condition an event of this type that shares any one of the
        values fails the append: CCC's guard, which treats an entity's facts as touched by any
        event naming one of its attributes (a stock.received for (Berlin, SKU-9) touches the
        decision about (Berlin, SKU-7): same warehouse)."""
        return [QueryItem(types=(self.name,), tags=(f"{n}:{attributes[n]}",))
                for n in self.attributes if n in attributes]

    def to_exact_conditions(self, **attributes: str) -> list[QueryItem]:
        """One query item for events of this type carrying all these values of the attributes it
        declares (none when it declares none of them): a stricter guard than to_conditions', which
        lets through an event that shares only some of the values."""
        tags = [f"{n}:{attributes[n]}" for n in self.attributes if n in attributes]
        return [QueryItem(types=(self.name,), tags=tuple(tags))] if tags else []
