"""Matching events, pure: DCB query items and the attribute partitions of consumer groups.

Both are what the index answers with SQL (index.py); these functions say it in Python, for the
candidates the index cannot decide alone (the conditional AND) and as the specification tests
compare against.

Query (DCB): a list of items, OR'd; an empty list matches every event. An event matches an item
when its type is one of the item's types (or the item names none) and it carries every one of the
item's tags.

Attribute partition (consumer groups): `partition_by` names attributes; a partition is one value
per name. An event belongs to a partition (the conditional AND) when it carries at least one of
the partition's attributes and, for every one it carries, its value is the partition's. So for
(course_name=Algebra, user_id=joe): CourseCreated(course_name=Algebra) and
UserRegistered(user_id=joe) belong, UserJoined(Algebra, joe) belongs, UserJoined(Algebra, jake)
and UserJoined(History, joe) do not, and an event with neither attribute does not either (else
every such event would belong to every partition).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from dmq.proto.event_headers import attributes_of

__all__ = ["QueryItem", "Query", "item_matches", "query_matches", "belongs", "partition_values"]


@dataclass(frozen=True, slots=True)
class QueryItem:
    types: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()


# An empty query matches every event.
Query = tuple[QueryItem, ...]


def item_matches(item: QueryItem, event_type: str, tags: Collection[str]) -> bool:
    if item.types and event_type not in item.types:
        return False
    return all(tag in tags for tag in item.tags)


def query_matches(query: Sequence[QueryItem], event_type: str, tags: Collection[str]) -> bool:
    if not query:
        return True
    tag_set = set(tags)
    return any(item_matches(item, event_type, tag_set) for item in query)


def belongs(partition: Mapping[str, str], tags: Iterable[str]) -> bool:
    """The conditional AND (see the module docstring)."""
    attrs = attributes_of(tags)
    carried = False
    for name, value in partition.items():
        have = attrs.get(name)
        if have is None:
            continue
        if have != value:
            return False
        carried = True
    return carried


def partition_values(partition_by: Sequence[str], tags: Iterable[str]) -> dict[str, str] | None:
    """The partition an event defines: its values of every `partition_by` attribute, or None when
    it lacks one (only events carrying all of them create partitions)."""
    attrs = attributes_of(tags)
    out = {}
    for name in partition_by:
        value = attrs.get(name)
        if value is None:
            return None
        out[name] = value
    return out
