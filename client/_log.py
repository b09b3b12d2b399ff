"""The client library's logger: the standard `logging` module, under the ``dmq`` logger.

An application that configures no logging sees nothing from the library: the ``dmq`` logger has
a NullHandler, so Python's last-resort handler (warnings to stderr) never fires for it. One that
does configure logging (``logging.basicConfig(level=logging.DEBUG)``, or a handler on ``dmq``)
gets the library's lines like any other library's. structlog stays for the servers and the CLI,
which are process owners and choose their own output.

Call sites keep the key=value style the code base uses (``log.warning("commit failed",
topic=t, error=str(e))``): `KeyValueLogger` renders the fields after the message and also hands
them over as ``record.dmq_event`` and ``record.dmq_fields`` for handlers that want them structured. Nothing is formatted
unless the level is enabled.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["KeyValueLogger", "get_logger", "ROOT_LOGGER"]

ROOT_LOGGER = "dmq"

logging.getLogger(ROOT_LOGGER).addHandler(logging.NullHandler())


class KeyValueLogger:
    """A `logging.Logger` that takes key=value fields, and `bind()`s fields for every line."""

    __slots__ = ("_logger", "_fields")

    def __init__(self, logger: logging.Logger, fields: dict[str, Any] | None = None) -> None:
        self._logger = logger
        self._fields = fields or {}

    def __repr__(self) -> str:
        return f"<KeyValueLogger {self._logger.name} fields={self._fields!r}>"

    @property
    def logger(self) -> logging.Logger:
        return self._logger

    def bind(self, **fields: Any) -> KeyValueLogger:
        return KeyValueLogger(self._logger, {**self._fields, **fields})

    def _log(self, level: int, event: str, fields: dict[str, Any], exc_info: Any = None) -> None:
        logger = self._logger
        if not logger.isEnabledFor(level):
            return
        if "exc_info" in fields:
            exc_info = fields.pop("exc_info")
        merged = {**self._fields, **fields} if self._fields else fields
        text = event + "".join(f" {k}={v!r}" if isinstance(v, str) else f" {k}={v}" for k, v in merged.items())
        # stacklevel 3: the record points at the library line that logged, not at this module.
        logger.log(level, "%s", text, exc_info=exc_info, extra={"dmq_event": event, "dmq_fields": merged}, stacklevel=3)

    def debug(self, event: str, **fields: Any) -> None:
        self._log(logging.DEBUG, event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._log(logging.INFO, event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log(logging.WARNING, event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._log(logging.ERROR, event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        self._log(logging.ERROR, event, fields, exc_info=True)


def get_logger(name: str) -> KeyValueLogger:
    """The logger of a library module (``__name__``, which is under ``dmq``)."""
    return KeyValueLogger(logging.getLogger(name))
