"""The CLI's connection to a cluster: one `AdminClient` per invocation, and the one-line error.

Every conversation with the servers goes through the client library (`dmq.client.admin`), which
turns gRPC failures into `dmq.client.errors` classes; `dmq.client.cli._errors` turns those into
the one line an operator reads. `Session` only owns that AdminClient for the command's lifetime
(closed by the click context on exit) and hands out its broker stubs to the few callers that
need futures of their own (the `dmq consume` reader's parallel long-polls).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from dmq.client.cli._output import one_line
from dmq.client.errors import is_connect_failure

if TYPE_CHECKING:
    from dmq.client.admin import AdminClient

__all__ = ["CLIError", "Session", "coordinator_unreachable", "broker_unreachable", "is_connect_failure"]


class CLIError(click.ClickException):
    """A failure to report as one line on stderr, exit code 1."""

    exit_code = 1

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(one_line(message))
        self.code = code  # the server's status code name, when a server refused (never read the message)


def coordinator_unreachable(address: str) -> CLIError:
    return CLIError(
        f"cannot reach the coordinator at {address} — is `dmq server` running? "
        "(point elsewhere with --bootstrap HOST:PORT or DMQ_BOOTSTRAP)"
    )


def broker_unreachable(address: str, broker_id: int | None = None) -> CLIError:
    who = f"broker {broker_id}" if broker_id is not None and broker_id >= 0 else "the broker"
    return CLIError(f"cannot reach {who} at {address} — is it running? (see `dmq brokers list`)")


class Session:
    """The AdminClient of one CLI invocation (made on first use); closed by the click context."""

    def __init__(self, bootstrap: str, timeout_s: float) -> None:
        self.bootstrap = bootstrap
        self.timeout_s = timeout_s
        self._admin: AdminClient | None = None

    def __repr__(self) -> str:
        return f"<Session bootstrap={self.bootstrap!r} timeout_s={self.timeout_s}>"

    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            from dmq.client.admin import AdminClient

            self._admin = AdminClient(self.bootstrap, request_timeout_ms=max(1, int(self.timeout_s * 1000)))
        return self._admin

    def close(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None
