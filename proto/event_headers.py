"""Event-store topics: how an event travels in a record, and the rules of events and queries.

Shared by the broker (which stores events as records and indexes them) and the client (which
checks a request before sending it), so an event the client accepts is one the broker stores.

An event-store topic (TopicConfig.kind = "event-store") has one partition, so one global order.
An event is one record:

  value     the payload (bytes)
  key       none
  headers   TYPE_HEADER   = the event type (UTF-8), exactly once, first
            TAG_HEADER    = one tag (UTF-8), once per tag, in the event's order
            METADATA_HEADER = the metadata bytes, at most once, only when not empty

The header names start with "dmq." so they cannot collide with the headers of ordinary topics'
records. Position = offset + 1: positions start at 1 and have no gaps.

A tag "name:value" (split at the first ':') is also the attribute `name = value`; consumer
groups partition events by attributes (DESIGN.md "Event-store mode").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from dmq.proto.names import FieldError, check_id, shorten

__all__ = [
    "KIND_LOG",
    "KIND_EVENT_STORE",
    "TOPIC_KINDS",
    "TYPE_HEADER",
    "TAG_HEADER",
    "METADATA_HEADER",
    "EVENT_TYPE_MAX_BYTES",
    "TAG_MAX_BYTES",
    "TAGS_PER_EVENT_MAX",
    "EVENTS_PER_APPEND_MAX",
    "QUERY_ITEMS_MAX",
    "ITEM_TYPES_MAX",
    "ITEM_TAGS_MAX",
    "READ_LIMIT_MAX",
    "check_topic_kind",
    "check_event_type",
    "check_tag",
    "check_tags",
    "check_query_items",
    "event_headers",
    "parse_event_headers",
    "attribute_of",
    "attributes_of",
    "partition_key",
    "check_partition_key",
    "check_attribute_names",
    "PARTITION_KEY_SEPARATOR",
]

KIND_LOG = "log"
KIND_EVENT_STORE = "event-store"
TOPIC_KINDS = (KIND_LOG, KIND_EVENT_STORE)

TYPE_HEADER = "dmq.event.type"
TAG_HEADER = "dmq.event.tag"
METADATA_HEADER = "dmq.event.metadata"

EVENT_TYPE_MAX_BYTES = 256
TAG_MAX_BYTES = 512
TAGS_PER_EVENT_MAX = 64
EVENTS_PER_APPEND_MAX = 10_000
QUERY_ITEMS_MAX = 64
ITEM_TYPES_MAX = 64
ITEM_TAGS_MAX = 16
# One read (and one claim) answers at most this many events; page on with `after`.
READ_LIMIT_MAX = 100_000

ATTRIBUTE_SEPARATOR = ":"
# Between the attributes of a partition key: the one control character a key holds, because no
# tag holds one (check_tag), so splitting a key at it gives back exactly its attributes.
PARTITION_KEY_SEPARATOR = "\n"


def check_topic_kind(kind: object, *, field: str = "config.kind") -> None:
    if kind not in TOPIC_KINDS:
        raise FieldError(field, f"unknown topic kind {shorten(kind)}; known are {list(TOPIC_KINDS)}")


def check_event_type(event_type: object, *, field: str = "type") -> None:
    check_id(event_type, field, "event type", EVENT_TYPE_MAX_BYTES)


def check_tag(tag: object, *, field: str = "tag") -> None:
    check_id(tag, field, "tag", TAG_MAX_BYTES)


def check_tags(tags: Sequence[object], *, field: str = "tags", limit: int = TAGS_PER_EVENT_MAX) -> None:
    if len(tags) > limit:
        raise FieldError(field, f"has {len(tags)} tags; the limit is {limit}")
    for i, tag in enumerate(tags):
        check_tag(tag, field=f"{field}[{i}]")


def check_query_items(items: Sequence[tuple[Sequence[object], Sequence[object]]], *, field: str = "query") -> None:
    """Items as (types, tags) pairs."""
    if len(items) > QUERY_ITEMS_MAX:
        raise FieldError(f"{field}.items", f"has {len(items)} items; the limit is {QUERY_ITEMS_MAX}")
    for i, (types, tags) in enumerate(items):
        where = f"{field}.items[{i}]"
        if len(types) > ITEM_TYPES_MAX:
            raise FieldError(f"{where}.types", f"has {len(types)} types; the limit is {ITEM_TYPES_MAX}")
        for j, t in enumerate(types):
            check_event_type(t, field=f"{where}.types[{j}]")
        check_tags(tags, field=f"{where}.tags", limit=ITEM_TAGS_MAX)


def event_headers(event_type: str, tags: Iterable[str], metadata: bytes = b"") -> list[tuple[str, bytes | None]]:
    """The record headers carrying an event's type, tags and metadata (see the module docstring)."""
    headers: list[tuple[str, bytes | None]] = [(TYPE_HEADER, event_type.encode())]
    headers.extend((TAG_HEADER, tag.encode()) for tag in tags)
    if metadata:
        headers.append((METADATA_HEADER, bytes(metadata)))
    return headers


def parse_event_headers(headers: Iterable[tuple[str, bytes | None]]) -> tuple[str, list[str], bytes]:
    """(type, tags, metadata) of a record's headers; ValueError when it carries no event type
    (a record that is not an event)."""
    event_type: str | None = None
    tags: list[str] = []
    metadata = b""
    for key, value in headers:
        if key == TAG_HEADER:
            tags.append((value or b"").decode("utf-8", "replace"))
        elif key == TYPE_HEADER:
            event_type = (value or b"").decode("utf-8", "replace")
        elif key == METADATA_HEADER:
            metadata = value or b""
    if event_type is None:
        raise ValueError(f"the record has no {TYPE_HEADER!r} header: it is not an event")
    return event_type, tags, metadata


def attribute_of(tag: str) -> tuple[str, str] | None:
    """The attribute (name, value) a tag "name:value" stands for; None for a plain tag."""
    name, sep, value = tag.partition(ATTRIBUTE_SEPARATOR)
    if not sep or not name:
        return None
    return name, value


def attributes_of(tags: Iterable[str]) -> dict[str, str]:
    """An event's attributes. A name given twice keeps its first value (tags are a set per DCB;
    an event carrying two values of one attribute is the writer's mistake, and the first one wins
    everywhere: index, grouping and the client)."""
    out: dict[str, str] = {}
    for tag in tags:
        attr = attribute_of(tag)
        if attr is not None and attr[0] not in out:
            out[attr[0]] = attr[1]
    return out


def partition_key(values: dict[str, str]) -> str:
    """The canonical key of an attribute partition: its attributes as tags, sorted by name,
    joined by newlines (which a tag never contains: control characters are refused). Keys are
    durable (group progress records), so this encoding stays; check_partition_key checks one."""
    return PARTITION_KEY_SEPARATOR.join(f"{name}{ATTRIBUTE_SEPARATOR}{values[name]}" for name in sorted(values))


def check_partition_key(key: object, *, field: str = "partition_key") -> None:
    """A key as partition_key() makes it: 1..ITEM_TAGS_MAX attributes "name:value", each one a
    valid tag (the id rules: no control characters, at most TAG_MAX_BYTES), in ascending name
    order and each name once, joined by PARTITION_KEY_SEPARATOR. Each attribute is checked on its
    own, so the separator is accepted between attributes and nowhere else."""
    if not isinstance(key, str):
        raise FieldError(field, f"partition key must be a string, got {type(key).__name__}")
    if not key:
        raise FieldError(field, "partition key must not be empty")
    count = key.count(PARTITION_KEY_SEPARATOR) + 1
    if count > ITEM_TAGS_MAX:  # counted before splitting: a huge key is refused without copying it
        raise FieldError(field, f"partition key has {count} attributes; the limit is {ITEM_TAGS_MAX}")
    previous = ""
    for i, tag in enumerate(key.split(PARTITION_KEY_SEPARATOR)):
        what = f"attribute {i} of the partition key"
        check_id(tag, field, what, TAG_MAX_BYTES)
        attr = attribute_of(tag)
        if attr is None:
            raise FieldError(field, f"{what} is {shorten(tag)}, not an attribute name{ATTRIBUTE_SEPARATOR}value")
        if i and attr[0] <= previous:
            raise FieldError(field, f"{what} is {shorten(attr[0])}, after {shorten(previous)}: a partition key "
                                    "names its attributes in ascending order, each once (use the key claim_next returned)")
        previous = attr[0]


def check_attribute_names(names: Sequence[object], *, field: str) -> None:
    if not names:
        raise FieldError(field, "must name at least one attribute")
    if len(names) > ITEM_TAGS_MAX:
        raise FieldError(field, f"has {len(names)} attributes; the limit is {ITEM_TAGS_MAX}")
    seen: set[object] = set()
    for i, name in enumerate(names):
        check_id(name, f"{field}[{i}]", "attribute name", TAG_MAX_BYTES)
        assert isinstance(name, str)
        if ATTRIBUTE_SEPARATOR in name:
            raise FieldError(f"{field}[{i}]", f"attribute name {shorten(name)} contains {ATTRIBUTE_SEPARATOR!r}")
        if name in seen:
            raise FieldError(f"{field}[{i}]", f"attribute {shorten(name)} is named twice")
        seen.add(name)
