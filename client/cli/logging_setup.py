"""structlog for the servers: readable console lines in a terminal, JSON lines otherwise.

A server's log is never allowed to stop it. `dmq server 2>&1 | tee log` and Ctrl-C: the terminal
sends SIGINT to both, tee exits first, and every line the server logs while shutting down meets a
closed pipe. Raised into the shutdown path, that BrokenPipeError skipped closing the logs (they
reopened unclean) and the offset store (whose non-daemon thread then kept the process alive).
So the server's stderr and stdout are wrapped: the first failed write (EPIPE, EIO, ENOSPC...)
points the descriptor at /dev/null and every later line is dropped silently, including the
interpreter's own final flush.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import threading
from typing import TextIO

import structlog


class DetachingStream(io.TextIOBase):
    """A text stream that turns into /dev/null at its first write error instead of raising."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._broken = False
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<DetachingStream of {self._stream!r} broken={self._broken}>"

    @property
    def broken(self) -> bool:
        return self._broken

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return not self._broken and self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._stream.encoding

    def write(self, text: str) -> int:
        if self._broken:
            return len(text)
        try:
            self._stream.write(text)
            if "\n" in text:
                self._stream.flush()
        except BlockingIOError:
            pass  # a non-blocking descriptor that is full for now: this line is lost, later ones are not
        except (OSError, ValueError):  # ValueError: the stream was closed
            self._detach()
        return len(text)

    def flush(self) -> None:
        if self._broken:
            return
        try:
            self._stream.flush()
        except BlockingIOError:
            pass
        except (OSError, ValueError):
            self._detach()

    def _detach(self) -> None:
        with self._lock:
            if self._broken:
                return
            self._broken = True
            # Whatever is still buffered in the wrapped stream, and anything else writing to the
            # same descriptor (the 2>&1 twin), now goes to /dev/null rather than failing.
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                try:
                    os.dup2(devnull, self._stream.fileno())
                finally:
                    os.close(devnull)
            except (OSError, ValueError, io.UnsupportedOperation):
                pass


def protect_std_streams() -> None:
    """Make writes to sys.stdout / sys.stderr unable to raise (process owners only: servers)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, DetachingStream):
            setattr(sys, name, DetachingStream(stream))


def configure_logging(level: str = "info", json_output: bool | None = None) -> None:
    protect_std_streams()
    if json_output is None:
        json_output = not sys.stderr.isatty()
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json_output else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    # The client library logs through the standard `logging` module (silent by default); a
    # process that chose structlog output shows its lines the same way, at the same level.
    library = logging.getLogger("dmq")
    library.setLevel(getattr(logging, level.upper()))
    if not any(isinstance(h, StructlogBridge) for h in library.handlers):
        library.addHandler(StructlogBridge())


class StructlogBridge(logging.Handler):
    """Hands the client library's `logging` records to structlog (the process's configured output)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields = dict(getattr(record, "dmq_fields", {}))
            if record.exc_info:
                fields["exc_info"] = record.exc_info
            logger = structlog.get_logger(record.name)
            getattr(logger, record.levelname.lower(), logger.error)(getattr(record, "dmq_event", record.getMessage()), **fields)
        except Exception:  # noqa: BLE001 - logging must never break the caller
            self.handleError(record)
