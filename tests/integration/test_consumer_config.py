"""ConsumerConfig validation and the small consumer value types (no server needed)."""

from __future__ import annotations

import datetime as dt

import pytest

from dmq.client.consumer import ConsumerConfig, ConsumerRecords, InvalidConfigError, TopicPartition
from dmq.client.errors import DMQError
from dmq.client.records import ConsumerRecord


def config(**kw: object) -> ConsumerConfig:
    return ConsumerConfig(metadata_service_url=kw.pop("url", "127.0.0.1:9091"), group_id=kw.pop("group_id", "app"), **kw)  # type: ignore[arg-type]


def test_defaults_match_the_design() -> None:
    c = config()
    assert (c.heartbeat_interval_ms, c.session_timeout_ms, c.max_poll_records) == (3000, 10000, 500)
    assert c.enable_auto_commit is True and c.max_poll_interval_ms == 300_000
    assert c.subscription_mode is None and c.subscription_from_ms is None


def test_url_forms_are_normalised() -> None:
    assert config(url="dmq://localhost:9091/").metadata_service_url == "localhost:9091"
    assert config(url=" 10.0.0.1:1 ").metadata_service_url == "10.0.0.1:1"


@pytest.mark.parametrize(
    ("settings", "names"),
    [
        ({"heartbeat_interval_ms": 4000}, ["heartbeat_interval_ms", "a third of session_timeout_ms"]),
        ({"session_timeout_ms": 3000, "heartbeat_interval_ms": 1001}, ["raise session_timeout_ms"]),
        ({"max_poll_records": 0}, ["max_poll_records must be > 0"]),
        ({"fetch_max_wait_ms": 60_001}, ["fetch_max_wait_ms must be within 0..60000"]),
        ({"max_partition_fetch_bytes": 2 << 20, "fetch_max_bytes": 1 << 20}, ["max_partition_fetch_bytes"]),
        ({"subscription_mode": "latest"}, ["subscription_mode must be one of all, new, timestamp"]),
        ({"subscription_mode": "timestamp"}, ["needs subscription_from"]),
        ({"subscription_from": 5}, ["only used with subscription_mode='timestamp'"]),
        ({"subscription_mode": "timestamp", "subscription_from": dt.datetime(2024, 1, 1)}, ["timezone-aware"]),
        ({"max_poll_interval_ms": "10"}, ["max_poll_interval_ms must be an int"]),
        ({"url": "localhost"}, ["metadata_service_url"]),
        ({"group_id": ""}, ["group_id must be a non-empty string"]),
    ],
)
def test_bad_settings_name_the_setting(settings: dict[str, object], names: list[str]) -> None:
    with pytest.raises(InvalidConfigError) as info:
        config(**settings)
    for name in names:
        assert name in str(info.value)
    assert isinstance(info.value, DMQError) and isinstance(info.value, ValueError)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(InvalidConfigError) as info:
        config(max_poll_records=0, fetch_min_bytes=-1)
    assert "max_poll_records" in str(info.value) and "fetch_min_bytes" in str(info.value)


def test_subscription_from_accepts_ms_and_aware_datetimes() -> None:
    assert config(subscription_mode="timestamp", subscription_from=1_700_000_000_000).subscription_from_ms == 1_700_000_000_000
    when = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    assert config(subscription_mode="timestamp", subscription_from=when).subscription_from_ms == 1_704_067_200_000


def test_consumer_records_iterates_counts_and_groups_by_partition() -> None:
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    recs = {
        a: [ConsumerRecord("t", 0, i, None, b"v%d" % i, 0, ()) for i in range(3)],
        b: [ConsumerRecord("t", 1, 7, b"k", b"w", 0, ())],
    }
    records = ConsumerRecords(recs)
    assert records.count() == len(records) == 4 and bool(records)
    assert [r.offset for r in records] == [0, 1, 2, 7]
    assert records.partitions() == [a, b]
    assert [r.value for r in records.records(b)] == [b"w"] and records[a][2].offset == 2
    assert records.records(TopicPartition("t", 9)) == []
    assert repr(records) == "<ConsumerRecords count=4 {t[0]: 3, t[1]: 1}>"
    empty = ConsumerRecords()
    assert empty.count() == 0 and not empty and list(empty) == [] and empty.is_empty()
