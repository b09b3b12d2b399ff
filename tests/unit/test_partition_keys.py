"""Partition keys of event-store groups (dmq.proto.event_headers): every key partition_key() makes
from valid attributes passes check_partition_key(), which checks each attribute by the tag rules."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dmq.proto.event_headers import (
    ITEM_TAGS_MAX,
    PARTITION_KEY_SEPARATOR,
    attribute_of,
    check_partition_key,
    check_tag,
    partition_key,
)

# no control characters (Cc) or lone surrogates (Cs), as the tag rules say; names without ':'
_text = st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=20)
_names = _text.filter(lambda n: n != "" and ":" not in n)


@given(st.dictionaries(_names, _text, min_size=1, max_size=ITEM_TAGS_MAX))
def test_every_key_made_is_accepted_and_splits_into_its_attributes(values: dict[str, str]) -> None:
    key = partition_key(values)
    check_partition_key(key)
    tags = key.split(PARTITION_KEY_SEPARATOR)
    for tag in tags:
        check_tag(tag)
    assert dict(a for a in map(attribute_of, tags) if a is not None) == values
