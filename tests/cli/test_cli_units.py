"""The CLI's pure parts: input parsers, the reset-offsets planner, percentiles, formatting."""

from __future__ import annotations

import datetime as dt

import click
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dmq.client.admin import plan_reset
from dmq.client.cli import _check_bootstrap
from dmq.client.cli._output import human_bytes, human_duration_ms
from dmq.client.cli._parse import (
    parse_datetime_ms,
    parse_duration_ms,
    parse_partitions,
    parse_size_bytes,
    parse_topic_config,
)
from dmq.client.cli.bench import percentiles
from dmq.client.errors import is_connect_failure


@pytest.mark.parametrize(("text", "ms"), [("604800000", 604_800_000), ("7d", 604_800_000), ("12h", 43_200_000),
                                          ("30m", 1_800_000), ("45s", 45_000), ("500ms", 500), ("-1", -1),
                                          ("1.5h", 5_400_000), ("2w", 1_209_600_000)])
def test_durations(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize(("text", "n"), [("1073741824", 2**30), ("1GiB", 2**30), ("64MiB", 64 * 2**20),
                                         ("500MB", 500_000_000), ("4kib", 4096), ("-1", -1), ("10 KB", 10_000)])
def test_sizes(text: str, n: int) -> None:
    assert parse_size_bytes(text) == n


@pytest.mark.parametrize("bad", ["", "7 fortnights", "abc", "1.2.3d"])
def test_bad_durations_and_sizes(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_duration_ms(bad)
    with pytest.raises(ValueError):
        parse_size_bytes(bad)


def test_topic_config_accepts_kafka_spelling_and_units() -> None:
    assert parse_topic_config(("retention.ms=7d", "segment-bytes=64MiB", "MAX_MESSAGE_BYTES=1000")) == {
        "retention_ms": 604_800_000, "segment_bytes": 64 * 2**20, "max_message_bytes": 1000}
    for bad in (("retention_ms",), ("colour=blue",), ("retention_ms=soon",)):
        with pytest.raises(click.BadParameter):
            parse_topic_config(bad)


def test_partition_lists() -> None:
    assert parse_partitions(()) is None
    assert parse_partitions(("0,2", "5-7", "2")) == [0, 2, 5, 6, 7]
    for bad in (("x",), ("3-1",), ("-1",), ("1-x",)):
        with pytest.raises(click.BadParameter):
            parse_partitions(bad)


def test_datetimes() -> None:
    utc = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC)
    assert parse_datetime_ms("2024-05-01T12:00:00Z") == int(utc.timestamp() * 1000)
    assert parse_datetime_ms("2024-05-01T14:00:00+02:00") == int(utc.timestamp() * 1000)
    assert parse_datetime_ms("1714564800000") == 1714564800000
    local = dt.datetime(2024, 5, 1, 12, 0).astimezone()
    assert parse_datetime_ms("2024-05-01 12:00") == int(local.timestamp() * 1000)
    with pytest.raises(click.BadParameter):
        parse_datetime_ms("yesterday")


def _bounds(n: int, start: int, end: int) -> dict[int, tuple[int, int]]:
    return {p: (start, end) for p in range(n)}


def test_plan_reset_strategies_and_clamping() -> None:
    committed = {0: 5, 1: None, 2: 90}
    bounds = {0: (2, 10), 1: (0, 4), 2: (50, 100)}
    parts = [0, 1, 2]
    earliest = plan_reset("t", "earliest", None, parts, committed, bounds)
    assert [r.new_offset for r in earliest] == [2, 0, 50]
    assert [r.current_offset for r in earliest] == [5, None, 90]
    assert [r.lag_after for r in earliest] == [8, 4, 50]
    assert [r.new_offset for r in plan_reset("t", "latest", None, parts, committed, bounds)] == [10, 4, 100]
    by_offset = plan_reset("t", "offset", 7, parts, committed, bounds)
    assert [(r.new_offset, r.clamped) for r in by_offset] == [(7, False), (4, True), (50, True)]
    shifted = plan_reset("t", "shift", -3, parts, committed, bounds)
    # nothing committed on 1: shifts from its log start, clamped there
    assert [(r.new_offset, r.clamped) for r in shifted] == [(2, False), (0, True), (87, False)]
    assert [r.new_offset for r in plan_reset("t", "shift", 20, parts, committed, bounds)] == [10, 4, 100]
    by_time = plan_reset("t", "timestamp", 1, [0, 2], committed, bounds, by_time={0: 6, 2: 100})
    assert [r.new_offset for r in by_time] == [6, 100]


@settings(deadline=None, max_examples=200)
@given(st.integers(0, 1000), st.integers(0, 1000), st.one_of(st.none(), st.integers(0, 2000)),
       st.sampled_from(["earliest", "latest", "offset", "shift"]), st.integers(-3000, 3000))
def test_plan_reset_always_lands_inside_the_log(a: int, b: int, committed: int | None, strategy: str, value: int) -> None:
    start, end = min(a, b), max(a, b)
    [row] = plan_reset("t", strategy, abs(value) if strategy == "offset" else value, [0], {0: committed},
                       {0: (start, end)})
    assert start <= row.new_offset <= end
    assert row.lag_after == end - row.new_offset >= 0


def test_percentiles() -> None:
    assert percentiles([])["samples"] == 0 and percentiles([])["p99"] is None
    p = percentiles([float(i) for i in range(1, 1001)])
    assert (p["samples"], p["p50"], p["p95"], p["p99"], p["p999"], p["max"]) == (1000, 500, 950, 990, 999, 1000)
    assert p["avg"] == 500.5
    assert percentiles([3.0])["p999"] == 3.0


def test_formatting() -> None:
    assert human_bytes(0) == "0 B" and human_bytes(1536) == "1.5 KiB" and human_bytes(None) == "-"
    assert human_bytes(3 * 2**30) == "3.0 GiB"
    assert human_duration_ms(604_800_000) == "7d" and human_duration_ms(-1) == "forever"
    assert human_duration_ms(1500) == "1500ms" and human_duration_ms(90_000) == "90s"


def test_connect_failure_detection() -> None:
    assert is_connect_failure("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: "
                              "Failed to connect to remote host: Connection refused")
    assert not is_connect_failure("no live brokers: start one with `dmq broker`")
    assert not is_connect_failure("coordinator is starting: retry")


def test_a_client_error_becomes_one_line_chosen_by_its_class() -> None:
    from dmq.client import errors
    from dmq.client.cli._errors import explain

    coord = "127.0.0.1:9091"
    refused = "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:9: Connection refused"
    assert explain(errors.CoordinatorUnavailableError(f"list brokers (coordinator at {coord}): {refused}",
                                                      code="UNAVAILABLE", details=refused), coord) == (
        f"cannot reach the coordinator at {coord} — is `dmq server` running? "
        "(point elsewhere with --bootstrap HOST:PORT or DMQ_BOOTSTRAP)")
    assert explain(errors.BrokerUnavailableError(f"ListOffsets (broker at {coord}): {refused}",
                                                 code="UNAVAILABLE", details=refused), coord) == (
        f"cannot reach the broker at {coord} — is it running? (see `dmq brokers list`)")

    def server(cls: type[errors.DMQError], code: str, details: str, where: str = f"(coordinator at {coord})") -> str:
        return explain(cls(f"doing it {where}: {details}", code=code, details=details), coord, 15.0)

    assert server(errors.TopicNotFoundError, "NOT_FOUND", "topic 'x' not found") == \
        "topic 'x' not found (see `dmq topics list`)"
    assert server(errors.GroupNotFoundError, "NOT_FOUND", "group 'G_x_y' not found") == \
        "group 'G_x_y' not found (see `dmq groups list`)"
    assert server(errors.TopicAlreadyExistsError, "ALREADY_EXISTS", "topic 'x' already exists") == \
        "topic 'x' already exists (add --if-not-exists to accept an existing one)"
    assert server(errors.DMQTimeoutError, "DEADLINE_EXCEEDED", "Deadline Exceeded", "(broker at 10.0.0.5:9092)") == (
        "no answer from the broker at 10.0.0.5:9092 within 15s — is it running and reachable? "
        "(raise --timeout for slow clusters)")
    assert server(errors.UnknownServerError, "INTERNAL", "boom") == f"the coordinator at {coord} failed: boom (see its log)"
    assert server(errors.GroupNotEmptyError, "FAILED_PRECONDITION", "group 'g' has 1 active member(s)") == \
        "group 'g' has 1 active member(s)"
    # Raised by the library itself (no server code): its own message, which says what to do.
    assert explain(errors.InvalidArgumentError("invalid topic name: too long"), coord) == "invalid topic name: too long"


def test_bootstrap_takes_several_addresses_and_names_a_bad_one() -> None:
    assert _check_bootstrap(None, None, " dmq://h1:9091/, h2:9091 ") == "h1:9091,h2:9091"  # type: ignore[arg-type]
    with pytest.raises(click.BadParameter, match="got 'h2'"):
        _check_bootstrap(None, None, "h1:9091,h2")  # type: ignore[arg-type]
