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
from itertools import chain

from dmq.proto.names import CONTROL_CHARACTER_RE, FieldError, check_id, shorten

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
    "check_events",
    "check_query_items",
    "event_headers",
    "encode_events_headers",
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


def check_events(types: Sequence[object], tag_lists: Sequence[Sequence[object]], *, field: str = "events") -> None:
    """check_event_type and check_tags for every event i of a batch (its fields named
    `{field}[i].type` and `{field}[i].tags`). While every rule holds, which is the common case,
    a few passes in C over the whole batch decide it (an append of many events paid ~10 us an event
    checking them one by one); otherwise the events are checked one by one, and the first broken
    rule is raised with its field."""
    if _events_hold(types, tag_lists):
        return
    for i, (event_type, tags) in enumerate(zip(types, tag_lists, strict=True)):
        check_event_type(event_type, field=f"{field}[{i}].type")
        check_tags(tags, field=f"{field}[{i}].tags")


def _events_hold(types: Sequence[object], tag_lists: Sequence[Sequence[object]]) -> bool:
    """True when every type and tag is a non-empty string without control characters, short
    enough (by characters: at most 4 UTF-8 bytes each), and no event has too many tags. False
    does not mean a rule is broken (a long name may still fit in bytes): check_events then
    decides one by one."""
    if len(types) != len(tag_lists):
        return False
    if not types:
        return True
    try:
        if max(map(len, tag_lists)) > TAGS_PER_EVENT_MAX:
            return False
        tags = list(chain.from_iterable(tag_lists))
        for names, limit in ((types, EVENT_TYPE_MAX_BYTES), (tags, TAG_MAX_BYTES)):
            if not names:
                continue
            # a name that is not a string: TypeError, caught below
            joined = "".join(names)  # type: ignore[arg-type]
            lengths = list(map(len, names))  # type: ignore[arg-type]
            if min(lengths) == 0 or max(lengths) * 4 > limit or CONTROL_CHARACTER_RE.search(joined):
                return False
    except TypeError:
        return False
    return True


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


def uvarint(n: int) -> bytes:
    """A non-negative int as a protobuf / record-header varint (one byte below 128: a table look-up)."""
    if n < 0x80:
        return ONE_BYTE[n]
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


ONE_BYTE = [bytes((n,)) for n in range(0x80)]
# a header key as a record's headers hold it: uvarint(length) + UTF-8 (dmq.proto.records)
_TYPE_KEY, _TAG_KEY, _METADATA_KEY = (uvarint(len(k)) + k.encode() for k in (TYPE_HEADER, TAG_HEADER, METADATA_HEADER))


def encode_events_headers(types: Sequence[str], tag_lists: Sequence[Sequence[str]],
                          metadata: Sequence[bytes]) -> list[bytes]:
    """Each event's event_headers() encoded as a record batch holds headers (records.encode's
    `encoded_headers`): uvarint(count), then per header uvarint(len(key)) key uvarint(len(value) + 1)
    value. The same bytes as records.encode(headers=[event_headers(...)]) writes, without a
    (name, value) tuple per header; a batch's types are encoded once each."""
    type_parts: dict[str, bytes] = {}
    out = []
    varint, one_byte = uvarint, ONE_BYTE
    for event_type, tags, meta in zip(types, tag_lists, metadata, strict=True):
        type_part = type_parts.get(event_type)
        if type_part is None:
            raw = event_type.encode()
            type_part = type_parts[event_type] = _TYPE_KEY + varint(len(raw) + 1) + raw
        count = len(tags) + (2 if meta else 1)
        parts = [one_byte[count] if count < 0x80 else varint(count), type_part]
        for tag in tags:
            raw = tag.encode()
            n = len(raw) + 1
            parts += (_TAG_KEY, one_byte[n] if n < 0x80 else varint(n), raw)
        if meta:
            parts += (_METADATA_KEY, varint(len(meta) + 1), meta)
        out.append(b"".join(parts))
    return out


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
