"""The console's aiohttp application: settings, the one AdminClient, routes and error pages.

Every page is a synchronous function of (Console, Request) -> Html that reads the cluster through
the client library (DESIGN.md "Observability": no second path to the data). The client library
is synchronous, so pages run on the console's own small thread pool (PAGE_THREADS), never on the
event loop; each call inside is bounded by the client's request_timeout_ms, so no page waits
without limit. The pool and the AdminClient belong to the application and are closed on its
cleanup.

Failures become pages with a status, never a traceback:
  - AuthorizationError: 403, the server's reason (the principal may not describe it);
  - NotFoundError: 404;  BadRequest / InvalidArgumentError: 400 naming the field;
  - FailedPreconditionError (a reset of a group that has members): 409;
  - any other DMQError (a broker down, a timeout): 502 with the client's one-line message.
Writes (offset resets) are POSTs, refused with 403 unless the console was started with
--allow-writes, and carry a per-process form token so that another site cannot post them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hmac
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog
from aiohttp import web

from dmq.client.admin import AdminClient
from dmq.client.cli.console._html import Html, page, tag
from dmq.client.errors import (
    AuthorizationError,
    DMQError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
)

log = structlog.get_logger(__name__)

__all__ = ["ConsoleSettings", "Console", "Request", "BadRequest", "Forbidden", "CONSOLE_KEY"]

# Pages served at once (each holds a thread for up to a request timeout), and pages that may wait
# for a thread; past that a request is answered 503 at once instead of queueing without limit.
PAGE_THREADS = 8
PAGES_PENDING_MAX = 64
# Defence in depth behind the escaping: no script runs, nothing loads from elsewhere, forms post
# only here, no other site frames the console.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; "
                               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@dataclass(frozen=True)
class ConsoleSettings:
    bootstrap: str
    request_timeout_ms: int = 15_000
    allow_writes: bool = False
    # The client library's security keywords (token, ssl_cafile, ...): the console's principal.
    # Empty: taken from the environment (DMQ_TOKEN, DMQ_SSL_CAFILE, ...), as every client does.
    client_settings: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Request:
    """What a page reads of its HTTP request."""

    path: Mapping[str, str]
    query: Mapping[str, str]
    form: Mapping[str, str]


class BadRequest(Exception):
    """A query or form field out of its limits: 400, the message names the field."""


class Forbidden(Exception):
    """Refused by the console itself (read-only, a bad form token): 403."""


class Console:
    """What the pages share: settings, the AdminClient, the page thread pool, the form token."""

    def __init__(self, settings: ConsoleSettings) -> None:
        self.settings = settings
        self.admin = AdminClient(settings.bootstrap, request_timeout_ms=settings.request_timeout_ms,
                                 **dict(settings.client_settings))
        self.pool = concurrent.futures.ThreadPoolExecutor(PAGE_THREADS, thread_name_prefix="dmq-console")
        self.form_token = secrets.token_urlsafe(24)
        self.pending = 0  # pages taken and not yet answered (read and written on the event loop only)

    def __repr__(self) -> str:
        return f"<Console bootstrap={self.settings.bootstrap!r} writes={self.settings.allow_writes}>"

    @property
    def timeout_s(self) -> float:
        return self.settings.request_timeout_ms / 1000

    def check_write(self, form: Mapping[str, str]) -> None:
        if not self.settings.allow_writes:
            raise Forbidden("the console is read-only: start it with `dmq console --allow-writes` to reset offsets")
        if not hmac.compare_digest(form.get("form_token", ""), self.form_token):
            raise Forbidden("the form is stale or did not come from this console (form_token): reload the page")

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.admin.close()


CONSOLE_KEY = web.AppKey("console", Console)
Page = Callable[[Console, Request], Html]


def _html(body: str, status: int = 200) -> web.Response:
    return web.Response(status=status, text=body, content_type="text/html", charset="utf-8",
                        headers=SECURITY_HEADERS)


def _error_page(status: int, title: str, message: str, writes: bool) -> web.Response:
    return _html(page(title, tag("p", message, class_="error"), writes=writes), status)


def handler(fn: Page) -> Callable[[web.Request], Any]:
    async def handle(request: web.Request) -> web.StreamResponse:
        console = request.app[CONSOLE_KEY]
        if console.pending >= PAGES_PENDING_MAX:
            return _error_page(503, "Busy", f"{PAGES_PENDING_MAX} pages are being served: try again shortly",
                               console.settings.allow_writes)
        console.pending += 1
        try:
            return await _serve(fn, console, request)
        finally:
            console.pending -= 1

    return handle


async def _serve(fn: Page, console: Console, request: web.Request) -> web.StreamResponse:
    form: Mapping[str, str] = {}
    if request.method == "POST":
        posted = await request.post()
        form = {k: v for k, v in posted.items() if isinstance(v, str)}
    req = Request(dict(request.match_info), dict(request.query), form)
    writes = console.settings.allow_writes
    try:
        body = await asyncio.get_running_loop().run_in_executor(console.pool, fn, console, req)
    except (BadRequest, InvalidArgumentError) as e:
        return _error_page(400, "Bad request", str(e), writes)
    except Forbidden as e:
        return _error_page(403, "Refused", str(e), writes)
    except AuthorizationError as e:
        return _error_page(403, "Not permitted", f"the console's principal may not do this: {e}", writes)
    except NotFoundError as e:
        return _error_page(404, "Not found", str(e), writes)
    except FailedPreconditionError as e:  # e.g. a reset while the group has members
        return _error_page(409, "Not possible now", str(e), writes)
    except DMQError as e:
        log.warning("console page failed", path=request.path, error=str(e))
        return _error_page(502, "The cluster did not answer", str(e), writes)
    return _html(body)
