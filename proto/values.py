"""The grammar of setting values with units, one for every way a user gives one.

`dmq topics create --config lease_ms=1s` and `AdminClient.create_topic(config={"lease_ms": "1s"})`
must mean the same thing, so both read a value here (the wire carries plain integers):

  durations  a number of milliseconds, or a number and a unit: ms, s, m (or min), h, d, w
             ("604800000", "7d", "12h", "1.5s"); "-1" for "forever" where the setting allows it
  sizes      a number of bytes, or a number and a unit: B, KB/MB/GB/TB (powers of 1000, also
             K/M/G/T), KiB/MiB/GiB/TiB (powers of 1024) ("1073741824", "64MiB", "500MB"); "-1"
             for "no limit" where allowed
  counts     the other settings (max_delivery_attempts, replication_factor, ...): a size without a
             unit reads as the plain number ("10000", also "10k")

Units are case-insensitive. Whether the number is in range is the limits' business
(dmq.proto.limits), not the grammar's.
"""

from __future__ import annotations

import re

from dmq.proto.limits import TOPIC_CONFIG_RANGES

__all__ = ["parse_duration_ms", "parse_size_bytes", "parse_setting"]

_DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_SIZE_UNITS = {
    "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_NUM_UNIT = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def _number_with_unit(text: str, units: dict[str, int], default_unit: str, not_a: str, known_units: str) -> int:
    """text as a number and an optional unit of `units` (default_unit when none), in the base unit.
    not_a and known_units word the errors: "... is not a <not_a>", "use <known_units>"."""
    m = _NUM_UNIT.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a {not_a}")
    number, unit = m.group(1), m.group(2).lower() or default_unit
    if unit not in units:
        raise ValueError(f"unknown unit {m.group(2)!r} in {text!r}; use {known_units}")
    return int(float(number) * units[unit])


def parse_duration_ms(text: str) -> int:
    """'604800000', '7d', '12h', '30m', '45s', '500ms', '-1' (forever) -> milliseconds."""
    return _number_with_unit(text, _DURATION_UNITS_MS, "ms", "duration (e.g. 604800000, 7d, 12h, 30m, 45s, -1)",
                             "ms, s, m, h, d or w")


def parse_size_bytes(text: str) -> int:
    """'1073741824', '1GiB', '64MiB', '500MB', '-1' (no limit) -> bytes."""
    return _number_with_unit(text, _SIZE_UNITS, "b", "size (e.g. 1073741824, 1GiB, 64MiB, 500MB, -1)",
                             "B, KiB, MiB, GiB, KB, MB or GB")


def parse_setting(name: str, value: object) -> object:
    """A setting's value as the wire takes it: text read by the grammar of `name` (a duration for
    names ending in _ms, else a size or count); anything else is returned as given, for the
    limits to judge (an int, a bool, or a wrong type they name). Only the numeric settings have a
    grammar: a text setting (`kind`: "event-store") or an unknown name is returned as given."""
    if not isinstance(value, str) or name not in TOPIC_CONFIG_RANGES:
        return value
    return parse_duration_ms(value) if name.endswith("_ms") else parse_size_bytes(value)
