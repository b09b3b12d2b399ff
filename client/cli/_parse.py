"""Parsing operator input: topic settings with units, partition lists, datetimes, key=value pairs.

Every parser raises click.BadParameter (exit 2, usage) with a message that shows an accepted form.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import click

from dmq.proto import limits

# The grammar is dmq.proto.values's, shared with the client library's config dicts.
from dmq.proto.values import parse_duration_ms, parse_size_bytes

CONFIG_KEYS = tuple(limits.TOPIC_CONFIG_RANGES)


def parse_topic_config(pairs: tuple[str, ...]) -> dict[str, int]:
    """`--config retention.ms=7d --config segment_bytes=64MiB` -> {'retention_ms': ..., ...}."""
    out: dict[str, int] = {}
    for pair in pairs:
        if "=" not in pair:
            raise click.BadParameter(f"{pair!r} is not key=value (e.g. retention_ms=7d)", param_hint="--config")
        key, value = pair.split("=", 1)
        key = key.strip().replace(".", "_").replace("-", "_").lower()
        if key not in CONFIG_KEYS:
            raise click.BadParameter(f"unknown setting {key!r}; known are {', '.join(CONFIG_KEYS)}", param_hint="--config")
        try:
            out[key] = parse_duration_ms(value) if key.endswith("_ms") else parse_size_bytes(value)
        except ValueError as e:
            raise click.BadParameter(f"{key}: {e}", param_hint="--config") from None
    return out


def parse_headers(pairs: tuple[str, ...]) -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    for pair in pairs:
        if "=" not in pair:
            raise click.BadParameter(f"{pair!r} is not key=value (e.g. source=cli)", param_hint="--header")
        k, v = pair.split("=", 1)
        if not k:
            raise click.BadParameter(f"{pair!r} has an empty header name", param_hint="--header")
        # imported here: most commands take no headers, and the codec is not theirs to load
        from dmq.proto.records import TRACE_HEADER, TXN_HEADER, check_record_id
        from dmq.proto.tracecontext import TRACEPARENT_HEADER, check_traceparent

        try:  # a value the producer would refuse fails here, as a usage error naming --header
            if k == TRACEPARENT_HEADER:
                check_traceparent(v, f"header {k!r}")
            elif k in (TXN_HEADER, TRACE_HEADER):
                check_record_id(v, f"header {k!r}")
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--header") from None
        out.append((k, v.encode()))
    return out


def parse_partitions(values: tuple[str, ...]) -> list[int] | None:
    """`--partitions 0,1 --partitions 3` or `--partitions 0-3` -> sorted unique list; None when absent."""
    if not values:
        return None
    result: set[int] = set()
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if not part:
                continue
            try:
                if "-" in part:
                    lo, hi = (int(x) for x in part.split("-", 1))
                    if lo > hi or lo < 0:
                        raise ValueError
                    result.update(range(lo, hi + 1))
                else:
                    p = int(part)
                    if p < 0:
                        raise ValueError
                    result.add(p)
            except ValueError:
                raise click.BadParameter(
                    f"{part!r} is not a partition number or range (e.g. 0,2,5-7)", param_hint="--partitions"
                ) from None
    return sorted(result)


def parse_datetime_ms(text: str, param_hint: str = "--to-datetime") -> int:
    """ISO 8601 ('2024-05-01T12:00:00', '2024-05-01 12:00', with optional Z or +02:00; no zone = local
    time), a date ('2024-05-01', local midnight), or epoch milliseconds ('1714564800000').
    `param_hint` names the option in the error."""
    s = text.strip()
    if re.fullmatch(r"\d{11,}", s):
        return int(s)
    try:
        when = dt.datetime.fromisoformat(s.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not a date-time; use ISO 8601 like 2024-05-01T12:00:00 (local), "
            "2024-05-01T12:00:00Z, or epoch milliseconds",
            param_hint=param_hint,
        ) from None
    if when.tzinfo is None:
        when = when.astimezone()  # local time, as Kafka's tools read it
    return int(when.timestamp() * 1000)


def jsonable_text(data: bytes | None) -> Any:
    if data is None:
        return None
    return data.decode("utf-8", errors="replace")
