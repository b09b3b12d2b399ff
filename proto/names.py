"""Names and ids: the one place that says how long they may be and what they may contain.

Every RPC that takes a topic name, group id, app id or member id checks it here, on the
coordinator, on the broker and in the client, so a bad name gets the same INVALID_ARGUMENT message
wherever it is caught, and nothing unchecked reaches a file name or an error message.

Lengths are in UTF-8 bytes: file names are limited in bytes (255 on ext4, xfs, btrfs, tmpfs), and
gRPC metadata (where status messages travel) in bytes too.

Rules:
  topic name   1..249 bytes of [a-zA-Z0-9._-], not "." or ".." (Kafka's legal topic names; topic
               names become directory names `<topic>-<partition>`, and 249 + "-" + 5 digits of a
               partition number stays within 255 bytes)
  app_id       the topic name's rule (it becomes part of the group id G_<topic>_<app_id>, which so
               fits 512 bytes)
  group id     1..512 bytes, no control characters
  member id    0..512 bytes, no control characters (empty is an operator's commit)

`shorten()` is what an error message may echo of a value: never more than ECHO_MAX_CHARS, so a
megabyte name cannot push a status past gRPC's metadata limit.
"""

from __future__ import annotations

import re

TOPIC_NAME_MAX_BYTES = 249
APP_ID_MAX_BYTES = 249
GROUP_ID_MAX_BYTES = 512
MEMBER_ID_MAX_BYTES = 512
ECHO_MAX_CHARS = 60

_TOPIC_NAME_RE = re.compile(r"[a-zA-Z0-9._-]+")
TOPIC_NAME_CHARACTERS = "ASCII letters, digits, '.', '_' and '-'"
# What an id may not hold: Unicode's Cc (control characters: newlines, NUL, escapes; exactly
# U+0000-U+001F and U+007F-U+009F, fixed by Unicode's stability policy) and Cs (lone surrogates,
# not encodable). One regex search instead of a unicodedata.category() call per character.
CONTROL_CHARACTER_RE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


class FieldError(ValueError):
    """A request field breaks a rule. `field` is the field's name as spelled in dmq.proto."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def shorten(value: object, limit: int = ECHO_MAX_CHARS) -> str:
    """`value` as it may appear in an error message: repr()'d, cut to about `limit` characters."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) > limit:
        return repr(text[:limit]) + f"... ({len(text.encode('utf-8', 'surrogatepass'))} bytes)"
    return repr(text)


def utf8_length(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _check_string(value: object, field: str, what: str, limit: int, *, allow_empty: bool = False) -> str:
    """value, once it is a string of at most `limit` UTF-8 bytes (and not empty unless allowed)."""
    if not isinstance(value, str):
        raise FieldError(field, f"{what} must be a string, got {type(value).__name__}")
    if not value and not allow_empty:
        raise FieldError(field, f"{what} must not be empty")
    if len(value) * 4 > limit:  # a character is at most 4 UTF-8 bytes: shorter ones need no count
        size = utf8_length(value)
        if size > limit:
            raise FieldError(field, f"{what} is {size} bytes long, the limit is {limit}")
    return value


def _check_legal_name(value: object, field: str, what: str, limit: int) -> str:
    """value, once it is 1..limit bytes of TOPIC_NAME_CHARACTERS (the rule of topic names and app ids)."""
    name = _check_string(value, field, what, limit)
    if not _TOPIC_NAME_RE.fullmatch(name):
        bad = next(c for c in name if not _TOPIC_NAME_RE.fullmatch(c))
        raise FieldError(field, f"{what} {shorten(name)} contains {bad!r}; allowed are {TOPIC_NAME_CHARACTERS}")
    return name


def check_topic_name(name: object, *, field: str = "name") -> None:
    if _check_legal_name(name, field, "topic name", TOPIC_NAME_MAX_BYTES) in (".", ".."):
        raise FieldError(field, f"topic name cannot be {name!r}")


def check_id(value: object, field: str, what: str, limit: int, *, allow_empty: bool = False) -> None:
    """An id of at most `limit` UTF-8 bytes without control characters."""
    text = _check_string(value, field, what, limit, allow_empty=allow_empty)
    bad = CONTROL_CHARACTER_RE.search(text)
    if bad is not None:
        raise FieldError(field, f"{what} {shorten(text)} contains the control character {bad.group()!r}")


def check_app_id(app_id: object, *, field: str = "app_id") -> None:
    _check_legal_name(app_id, field, "app_id", APP_ID_MAX_BYTES)


def check_group_id(group_id: object, *, field: str = "group_id") -> None:
    check_id(group_id, field, "group id", GROUP_ID_MAX_BYTES)


GROUP_ID_PREFIX = "G_"


def group_id_for(topic: str, app_id: str | None) -> str:
    """The coordinator's group id for an application's group on one topic: G_<topic>_<app_id>."""
    if not app_id:  # never "G_<topic>_None": a consumer without a group_id has no group
        raise FieldError("group_id", "must be a non-empty string to join a group")
    return f"{GROUP_ID_PREFIX}{topic}_{app_id}"


def app_id_in(group_id: str, topic: str) -> str | None:
    """The app_id of `group_id` when it is the group id of an application on `topic`, else None."""
    prefix = f"{GROUP_ID_PREFIX}{topic}_"
    if group_id.startswith(prefix) and len(group_id) > len(prefix):
        return group_id[len(prefix):]
    return None


def check_member_id(member_id: object, *, field: str = "member_id", allow_empty: bool = True) -> None:
    check_id(member_id, field, "member id", MEMBER_ID_MAX_BYTES, allow_empty=allow_empty)


# A status message travels in gRPC metadata (8 KiB for all headers by default): no message may
# come near that, whatever a handler put in it.
STATUS_MESSAGE_MAX_CHARS = 2_000


def cap_message(message: str, limit: int = STATUS_MESSAGE_MAX_CHARS) -> str:
    """A status message cut to `limit` characters (a last safety net after shorten())."""
    return message if len(message) <= limit else message[: limit - 20] + "... (message cut)"
