"""Topic-name, partition-count and topic-setting rules (dmq.proto.topic_settings)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dmq.proto.topic_settings import (
    MAX_MESSAGE_BYTES_MAX,
    PARTITIONS_MAX,
    SEGMENT_BYTES_MIN,
    TOPIC_NAME_MAX_CHARS,
    TopicSettings,
    ValidationError,
    validate_partition_count,
    validate_partition_increase,
    validate_topic_name,
)


@pytest.mark.parametrize("name", ["a", "orders", "Orders.v2", "my_topic-1", "...", ".a", "_", "-", "x" * 249, "0"])
def test_legal_topic_names(name: str) -> None:
    validate_topic_name(name)


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("", "empty"),
        (".", "'.'"),
        ("..", "'..'"),
        ("x" * 250, "250 bytes long, the limit is 249"),
        ("a b", "contains ' '"),
        ("a/b", "contains '/'"),
        ("a\x00b", "contains '\\x00'"),
        ("café", "contains 'é'"),
        ("a:b", "contains ':'"),
        ("tab\t", "contains '\\t'"),
    ],
)
def test_illegal_topic_names_name_the_field_and_rule(name: str, fragment: str) -> None:
    with pytest.raises(ValidationError) as info:
        validate_topic_name(name)
    assert info.value.field == "name"
    assert str(info.value).startswith("name: ")
    assert fragment in str(info.value)


def test_field_name_can_be_chosen() -> None:
    with pytest.raises(ValidationError, match=r"^topics\[3\]: ") as info:
        validate_topic_name("", field="topics[3]")
    assert info.value.field == "topics[3]"


def test_long_illegal_name_is_shortened_in_the_message() -> None:
    with pytest.raises(ValidationError) as info:
        validate_topic_name("a" * 100 + " ")
    assert len(str(info.value)) < 200


@settings(deadline=None, max_examples=300)
@given(st.text(max_size=TOPIC_NAME_MAX_CHARS + 5) | st.text("ab._-Z9 /", max_size=10))
def test_topic_name_rule_matches_kafka(name: str) -> None:
    legal = (
        re.fullmatch(r"[a-zA-Z0-9._-]{1,249}", name, flags=re.ASCII) is not None and name not in (".", "..")
    )
    try:
        validate_topic_name(name)
        accepted = True
    except ValidationError:
        accepted = False
    assert accepted == legal, name


@pytest.mark.parametrize("count", [1, 2, PARTITIONS_MAX])
def test_legal_partition_counts(count: int) -> None:
    validate_partition_count(count)


@pytest.mark.parametrize("count", [0, -1, PARTITIONS_MAX + 1, 2**31 - 1])
def test_illegal_partition_counts(count: int) -> None:
    with pytest.raises(ValidationError, match=rf"^partitions: must be between 1 and 10000, got {count}$"):
        validate_partition_count(count)


@pytest.mark.parametrize("count", [True, 1.5, "3"])
def test_partition_count_must_be_an_int(count: object) -> None:
    with pytest.raises(ValidationError, match="^partitions: must be an integer"):
        validate_partition_count(count)  # type: ignore[arg-type]


def test_partition_increase_only() -> None:
    validate_partition_increase(3, 4)
    for requested in (3, 2):
        with pytest.raises(ValidationError, match="greater than the current 3 partitions") as info:
            validate_partition_increase(3, requested)
        assert info.value.field == "partitions"
    with pytest.raises(ValidationError, match="between 1 and 10000"):
        validate_partition_increase(3, PARTITIONS_MAX + 1)


@pytest.mark.parametrize(
    "settings_",
    [
        TopicSettings(),
        TopicSettings(retention_ms=-1, retention_bytes=-1),
        TopicSettings(retention_ms=0, retention_bytes=0),
        TopicSettings(segment_bytes=SEGMENT_BYTES_MIN, segment_ms=1, max_message_bytes=MAX_MESSAGE_BYTES_MAX),
        TopicSettings(segment_bytes=2**31 - 1, retention_bytes=2**63 - 1),
    ],
)
def test_legal_settings(settings_: TopicSettings) -> None:
    settings_.validate()


@pytest.mark.parametrize(
    ("settings_", "field", "fragment"),
    [
        (TopicSettings(retention_ms=-2), "config.retention_ms", "or -1 for no limit, got -2"),
        (TopicSettings(retention_ms=10**18), "config.retention_ms", "between 0 and"),
        (TopicSettings(retention_bytes=-7), "config.retention_bytes", "got -7"),
        (TopicSettings(segment_bytes=SEGMENT_BYTES_MIN - 1), "config.segment_bytes", f"between {SEGMENT_BYTES_MIN} and 2147483647"),
        (TopicSettings(segment_bytes=2**31), "config.segment_bytes", "2147483647"),
        (TopicSettings(segment_bytes=-1), "config.segment_bytes", "got -1"),
        (TopicSettings(segment_ms=0), "config.segment_ms", "between 1 and"),
        (TopicSettings(max_message_bytes=10), "config.max_message_bytes", "between 64 and"),
        (TopicSettings(max_message_bytes=MAX_MESSAGE_BYTES_MAX + 1), "config.max_message_bytes", str(MAX_MESSAGE_BYTES_MAX)),
    ],
)
def test_illegal_settings_name_the_field_and_limit(settings_: TopicSettings, field: str, fragment: str) -> None:
    with pytest.raises(ValidationError) as info:
        settings_.validate()
    assert info.value.field == field
    assert str(info.value).startswith(field + ": ")
    assert fragment in str(info.value)


def test_settings_defaults_and_json() -> None:
    defaults = TopicSettings(retention_ms=1, segment_ms=2)
    merged = TopicSettings(retention_ms=5).with_defaults(defaults)
    assert merged == TopicSettings(retention_ms=5, segment_ms=2)
    assert TopicSettings(retention_ms=5).with_defaults(None) == TopicSettings(retention_ms=5)
    assert merged.to_dict() == {"retention_ms": 5, "segment_ms": 2}
    assert TopicSettings.from_json(merged.to_json()) == merged
    assert TopicSettings.from_json("") == TopicSettings()
    with pytest.raises(ValidationError, match="unknown settings"):
        TopicSettings.from_dict({"retention_hours": 1})
