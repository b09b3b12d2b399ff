"""W3C Trace Context (https://www.w3.org/TR/trace-context/): the ``traceparent`` record header.

A record's trace context travels as the header ``traceparent``, the name and value format that
OpenTelemetry's messaging conventions (and Kafka instrumentations) use, so tracing systems see it::

    00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
    ^^ version  ^^ trace-id (32 hex)     ^^ parent-id (16 hex)  ^^ trace-flags (bit 0: sampled)

Parsing is the spec's, strictly: lowercase hex only; version ``ff`` is invalid; version ``00`` is
exactly 55 characters; a higher version is read as version 00 from its first 55 characters and
may only continue with ``-`` (the spec's forward compatibility); an all-zero trace-id or
parent-id is invalid. A receiver that cannot parse the header must act as if it were absent
(spec, "traceparent Header Field Values"): parse_traceparent returns None, the broker does not
index it and ConsumerRecord.trace_context is None. The producer refuses a malformed one it is
asked to send (check_traceparent), so the mistake shows where it is made.

Client and broker share this module: the broker indexes records by the trace id of their
``traceparent`` (and, for data written before it, of the old ``dmq.trace`` header: see
dmq.proto.records.trace_ids).
"""

from __future__ import annotations

import random
import re
from typing import NamedTuple

__all__ = [
    "TRACEPARENT_HEADER",
    "TRACESTATE_HEADER",
    "TraceContext",
    "InvalidTraceContextError",
    "parse_traceparent",
    "traceparent_trace_id",
    "check_traceparent",
    "check_trace_id",
    "is_trace_id",
]

TRACEPARENT_HEADER = "traceparent"
TRACESTATE_HEADER = "tracestate"

_V00_LENGTH = 55
_FIELDS = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_TRACE_ID = re.compile(r"[0-9a-f]{32}")
_ZERO_TRACE_ID = "0" * 32
_ZERO_SPAN_ID = "0" * 16
_FLAG_SAMPLED = 0x01
_FLAGS_HEX = [f"{i:02x}" for i in range(256)]


class InvalidTraceContextError(ValueError):
    """A traceparent or trace id that the W3C Trace Context spec does not allow."""


class TraceContext(NamedTuple):
    """A parsed ``traceparent``: the trace it belongs to and the span that sent it."""

    trace_id: str  # 32 lowercase hex digits, not all zero
    span_id: str  # 16 lowercase hex digits, not all zero: the header's parent-id field
    flags: int = _FLAG_SAMPLED  # trace-flags, 0..255; bit 0 = sampled

    @property
    def sampled(self) -> bool:
        return bool(self.flags & _FLAG_SAMPLED)

    @property
    def traceparent(self) -> str:
        """The header value (version 00)."""
        trace_id, span_id, flags = self
        return f"00-{trace_id}-{span_id}-{_FLAGS_HEX[flags] if 0 <= flags <= 255 else format(flags, '02x')}"

    def child(self) -> TraceContext:
        """The context a next hop sends: the same trace and flags, a new span id."""
        return TraceContext(self.trace_id, _new_span_id(), self.flags)

    @classmethod
    def new(cls, trace_id: str | None = None, *, sampled: bool = True) -> TraceContext:
        """A context starting a trace: `trace_id` (checked) or a random one, a random span id."""
        tid = _random_hex(16, _ZERO_TRACE_ID) if trace_id is None else check_trace_id(trace_id, "trace_id")
        return cls(tid, _new_span_id(), _FLAG_SAMPLED if sampled else 0)


def _random_hex(nbytes: int, zero: str) -> str:
    # random, not secrets (as OpenTelemetry's SDK makes ids): ids need to be unique, not secret,
    # and getrandbits costs no system call per record
    while True:  # the spec forbids the all-zero id; one draw in 2**64 or more hits it
        value = f"{random.getrandbits(nbytes * 8):0{nbytes * 2}x}"
        if value != zero:
            return value


def _new_span_id() -> str:
    # `or 1`: never the all-zero id the spec forbids (one draw in 2**64), without a loop
    return f"{random.getrandbits(64) or 1:016x}"


def _text(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        try:
            return bytes(value).decode("ascii")
        except UnicodeDecodeError:
            return None
    return None


def _why_invalid(text: str) -> tuple[TraceContext | None, str]:
    """(the context, "") or (None, why the value is not a traceparent)."""
    m = _FIELDS.match(text)
    if m is None:
        return None, "it must be version-traceid-parentid-flags in lowercase hex (2-32-16-2 digits)"
    version, trace_id, span_id, flags = m.groups()
    if version == "ff":
        return None, "version ff is invalid"
    if version == "00" and len(text) != _V00_LENGTH:
        return None, f"a version 00 value is exactly {_V00_LENGTH} characters, got {len(text)}"
    if len(text) > _V00_LENGTH and text[_V00_LENGTH] != "-":
        return None, f"a later version may only continue with '-' after {_V00_LENGTH} characters"
    if trace_id == _ZERO_TRACE_ID:
        return None, "the trace-id is all zeros"
    if span_id == _ZERO_SPAN_ID:
        return None, "the parent-id is all zeros"
    return TraceContext(trace_id, span_id, int(flags, 16)), ""


def parse_traceparent(value: object) -> TraceContext | None:
    """The context of a ``traceparent`` value (str or ASCII bytes), or None when the spec says to
    ignore it (see the module docstring)."""
    text = _text(value)
    if text is None:
        return None
    return _why_invalid(text)[0]


_V00 = re.compile(rb"00-([0-9a-f]{32})-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")
_ZERO_TRACE_ID_BYTES = _ZERO_TRACE_ID.encode()


def traceparent_trace_id(value: bytes) -> str | None:
    """parse_traceparent(value).trace_id or None, for the broker's index: the common case (a
    version 00 value) in one bytes regex, about a tenth of a full parse."""
    m = _V00.fullmatch(value)
    if m is not None:
        tid = m.group(1)
        return None if tid == _ZERO_TRACE_ID_BYTES else tid.decode()
    ctx = parse_traceparent(value)
    return None if ctx is None else ctx.trace_id


def check_traceparent(value: object, field: str) -> TraceContext:
    """parse_traceparent, raising InvalidTraceContextError naming `field` and the rule broken."""
    text = _text(value)
    if text is None:
        raise InvalidTraceContextError(f"{field} must be an ASCII str or bytes, got {type(value).__name__}")
    ctx, why = _why_invalid(text)
    if ctx is None:
        raise InvalidTraceContextError(f"{field} is not a W3C traceparent ({text[:80]!r}): {why}")
    return ctx


def is_trace_id(value: str) -> bool:
    """A W3C trace id: 32 lowercase hex digits, not all zero."""
    return _TRACE_ID.fullmatch(value) is not None and value != _ZERO_TRACE_ID


def check_trace_id(value: object, field: str) -> str:
    """A W3C trace id given by a person (hex digits in either case) -> its lowercase form; raises
    InvalidTraceContextError naming `field` and the rule."""
    if type(value) is str and _TRACE_ID.fullmatch(value) and value != _ZERO_TRACE_ID:
        return value  # the common case, first: the producer checks every id it sends
    if not isinstance(value, str):
        raise InvalidTraceContextError(f"{field} must be a str, got {type(value).__name__}")
    lowered = value.lower()
    if not is_trace_id(lowered):
        raise InvalidTraceContextError(
            f"{field} must be a W3C trace id: 32 hex digits, not all zero; got {value[:80]!r}"
        )
    return lowered
