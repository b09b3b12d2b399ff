"""The message browser: the latest N records of a topic, or N from an offset or from a time.

Reads with SimpleConsumer over the console's own cluster connection (no group, nothing
committed): ListOffsets finds where to start in each partition, then Fetch reads forward to at
most `limit` records or the log end, never waiting for new records (max_wait_ms 0). Used by the
topic page and by the queue page's dead letters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import click

from dmq.client.admin import AdminClient
from dmq.client.cli._parse import parse_datetime_ms
from dmq.client.cli.console._app import BadRequest
from dmq.client.cli.console._html import Html, join, link, show_bytes, table, tag, url, when_ms
from dmq.client.records import ConsumerRecord
from dmq.client.simple_consumer import SimpleConsumer
from dmq.proto.records import TRACE_HEADER
from dmq.proto.tracecontext import TRACEPARENT_HEADER, traceparent_trace_id

__all__ = ["Browse", "parse_browse", "read_records", "records_table", "trace_id_of", "LIMIT_MAX", "OFFSET_MAX",
           "TIME_MS_MAX"]

LIMIT_MAX = 500
# Offsets and times are int64 on the wire; a time past the year 9999 is a typo, not a time.
OFFSET_MAX = 2**63 - 1
TIME_MS_MAX = 253_402_300_799_999
LIMIT_DEFAULT = 50
# Fetches per partition for one page: each answers up to SimpleConsumer's max_bytes.
FETCHES_MAX = 20


@dataclass(frozen=True)
class Browse:
    how: str  # "latest" | "offset" | "time"
    partition: int | None  # None: every partition (latest, time)
    offset: int = 0
    time_ms: int = 0
    limit: int = LIMIT_DEFAULT


def time_ms_field(text: str, name: str) -> int:
    """Form field `name` (ISO 8601 or epoch milliseconds) in epoch milliseconds, 0..TIME_MS_MAX."""
    try:
        time_ms = parse_datetime_ms(text, name)
    except click.BadParameter as e:
        raise BadRequest(f"{name}: {e.message}") from None
    if not 0 <= time_ms <= TIME_MS_MAX:
        raise BadRequest(f"{name} must be within 0..{TIME_MS_MAX} ms since the epoch (the year 9999), got {time_ms}")
    return time_ms


def _int_field(query: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = query.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"{name} must be a whole number within {low}..{high}, got {raw!r}") from None
    if not low <= value <= high:
        raise BadRequest(f"{name} must be within {low}..{high}, got {value}")
    return value


def parse_browse(query: Mapping[str, str], partition_count: int) -> Browse:
    how = query.get("from", "latest") or "latest"
    if how not in ("latest", "offset", "time"):
        raise BadRequest(f"from must be latest, offset or time, got {how!r}")
    limit = _int_field(query, "limit", LIMIT_DEFAULT, 1, LIMIT_MAX)
    partition: int | None = None
    if query.get("partition", "").strip() not in ("", "all"):
        partition = _int_field(query, "partition", 0, 0, max(partition_count - 1, 0))
    if how == "offset":
        if partition is None:
            raise BadRequest("from=offset reads one partition: choose a partition")
        return Browse(how, partition, offset=_int_field(query, "offset", 0, 0, OFFSET_MAX), limit=limit)
    if how == "time":
        text = query.get("time", "").strip()
        if not text:
            raise BadRequest("from=time needs time: ISO 8601 (2024-05-01T12:00:00Z) or epoch milliseconds")
        return Browse(how, partition, time_ms=time_ms_field(text, "time"), limit=limit)
    return Browse(how, partition, limit=limit)


def read_records(admin: AdminClient, topic: str, partition_count: int, b: Browse) -> list[ConsumerRecord]:
    """Newest first for "latest"; otherwise in time order from the starting point."""
    parts = [b.partition] if b.partition is not None else list(range(partition_count))
    if b.how == "time":
        query: int | str = b.time_ms
    else:
        query = "latest"
    answers = admin.list_partition_offsets({(topic, p): query for p in parts})
    consumer = SimpleConsumer(cluster=admin.cluster, max_wait_ms=0)
    out: list[ConsumerRecord] = []
    try:
        for p in parts:
            info = answers[(topic, p)]
            if b.how == "latest":
                start = max(info.log_start_offset, info.log_end_offset - b.limit)
            elif b.how == "offset":
                start = min(max(b.offset, info.log_start_offset), info.log_end_offset)
            else:
                start = info.offset
            out.extend(_read_partition(consumer, topic, p, start, info.log_end_offset, b.limit))
    finally:
        consumer.close()
    if b.how == "latest":
        out.sort(key=lambda r: (r.timestamp, r.partition, r.offset), reverse=True)
    else:
        out.sort(key=lambda r: (r.timestamp, r.partition, r.offset))
    return out[: b.limit]


def _read_partition(consumer: SimpleConsumer, topic: str, partition: int, start: int, end: int,
                    limit: int) -> list[ConsumerRecord]:
    out: list[ConsumerRecord] = []
    offset = start
    for _ in range(FETCHES_MAX):
        if offset >= end or len(out) >= limit:
            break
        got = consumer.consume(topic, partition, offset, max_records=limit - len(out), max_wait_ms=0)
        if not got:
            break
        out.extend(got)
        offset = got[-1].offset + 1
    return out


def trace_id_of(record: ConsumerRecord) -> str | None:
    """The W3C trace id of its traceparent header, else its older dmq.trace header."""
    for name, value in reversed(record.headers):
        if name == TRACEPARENT_HEADER and value is not None:
            found = traceparent_trace_id(value)
            if found is not None:
                return found
    for name, value in reversed(record.headers):
        if name == TRACE_HEADER and value:
            return value.decode("utf-8", "replace")
    return None


def _headers(record: ConsumerRecord, skip: str | None = None) -> Html:
    items = [tag("div", tag("b", name), "=", show_bytes(value))
             for name, value in record.headers if skip is None or not name.startswith(skip)]
    return join(items)


def records_table(records: list[ConsumerRecord], *, why_prefix: str | None = None) -> Html:
    """Key, value, headers and a trace link per record; `why_prefix` pulls those headers (a dead
    letter's reason, error and attempts) into their own column."""
    if not records:
        return tag("p", "No records here.", class_="muted")
    rows = []
    for r in records:
        trace = trace_id_of(r)
        row: list[object] = [r.partition, r.offset, when_ms(r.timestamp), show_bytes(r.key), show_bytes(r.value)]
        if why_prefix is not None:
            row.append(join(tag("div", tag("b", name.removeprefix(why_prefix)), ": ", show_bytes(value))
                            for name, value in r.headers if name.startswith(why_prefix)))
        row.append(_headers(r, skip=why_prefix))
        row.append(link(url("/trace", id=trace), trace, class_="trace") if trace else "-")
        rows.append(row)
    headers = ["PARTITION", "OFFSET", "TIMESTAMP", "KEY", "VALUE"]
    headers += ["WHY"] if why_prefix is not None else []
    headers += ["HEADERS", "TRACE"]
    return table(headers, rows, class_="records")
