"""The console's aiohttp application: settings, the clients, routes and error pages.

Every page is a synchronous function of (Console, Request) -> Html that reads the cluster through
the client library (DESIGN.md "Observability": no second path to the data). The client library
is synchronous, so pages run on the console's own small thread pool (PAGE_THREADS), never on the
event loop; each call inside is bounded by the client's request_timeout_ms, so no page waits
without limit. The pool and the clients belong to the application and are closed on its cleanup.

Whose principal a page reads with (`Console.admin`):
  - without sign-in (a cluster without security, or --no-sign-in): the console's one AdminClient,
    made with the principal given at start (--token / TLS options);
  - with sign-in (security on): the signed-in viewer's own AdminClient (_viewers.Sessions); a
    request without a live session is redirected to the sign-in form (_signin), and one whose token
    the servers stop accepting (it expired) ends its session and is asked to sign in again.

Failures become pages with a status, never a traceback:
  - AuthorizationError: 403, the server's reason (the principal may not describe it);
  - NotFoundError: 404;  BadRequest / InvalidArgumentError: 400 naming the field;
  - FailedPreconditionError (a reset of a group that has members): 409;
  - any other DMQError (a broker down, a timeout): 502 with the client's one-line message.
Writes (offset resets) are POSTs, refused with 403 unless the console was started with
--allow-writes, and carry a form token (per session with sign-in, else per process) so that
another site cannot post them.
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
from dmq.client.cli.console._html import Html, page, signed_in, tag, url
from dmq.client.cli.console._viewers import SESSION_IDLE_S, SESSIONS_MAX, Session, Sessions
from dmq.client.errors import (
    AuthorizationError,
    DMQError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
)

log = structlog.get_logger(__name__)

__all__ = ["ConsoleSettings", "Console", "ConsoleServer", "Request", "BadRequest", "Forbidden", "CONSOLE_KEY",
           "SESSION_COOKIE", "html_response", "see_other", "sign_in_redirect"]

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
# The cookie that holds a signed-in viewer's session id (never the token: that stays on the server).
SESSION_COOKIE = "dmq_console_session"


@dataclass(frozen=True)
class ConsoleSettings:
    bootstrap: str
    request_timeout_ms: int = 15_000
    allow_writes: bool = False
    # The client library's security keywords (token, ssl_cafile, ...): the console's principal.
    # Empty: taken from the environment (DMQ_TOKEN, DMQ_SSL_CAFILE, ...), as every client does.
    client_settings: Mapping[str, Any] = field(default_factory=dict)
    # Each viewer signs in with their own token and pages read with it (security on); the
    # sessions are bounded in number and idle time (_viewers).
    sign_in: bool = False
    sessions_max: int = SESSIONS_MAX
    session_idle_s: float = SESSION_IDLE_S


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


@dataclass(frozen=True)
class Console:
    """What a page reads with: the settings, the client of its viewer's principal (the console's
    own without sign-in), and the form token its forms carry."""

    settings: ConsoleSettings
    admin: AdminClient
    form_token: str = field(repr=False)
    principal: str | None = None  # the signed-in viewer; None without sign-in

    @property
    def timeout_s(self) -> float:
        return self.settings.request_timeout_ms / 1000

    def raise_if_signed_out(self, e: Exception) -> None:
        """Pages take a refusal as "not this principal's to see". With sign-in, UNAUTHENTICATED
        means instead that the servers no longer take the viewer's token (it expired): raised
        again, so that the session ends and the viewer is asked to sign in (_serve)."""
        if self.principal is not None and isinstance(e, AuthorizationError) and e.code == "UNAUTHENTICATED":
            raise e

    def check_write(self, form: Mapping[str, str]) -> None:
        if not self.settings.allow_writes:
            raise Forbidden("the console is read-only: start it with `dmq console --allow-writes` to reset offsets")
        if not hmac.compare_digest(form.get("form_token", ""), self.form_token):
            raise Forbidden("the form is stale or did not come from this console (form_token): reload the page")


class ConsoleServer:
    """What the application owns: settings, the page thread pool, and either the console's one
    AdminClient (no sign-in) or the signed-in viewers' sessions (sign-in)."""

    def __init__(self, settings: ConsoleSettings) -> None:
        self.settings = settings
        self.admin: AdminClient | None = None
        self.sessions: Sessions | None = None
        if settings.sign_in:
            self.sessions = Sessions(settings.sessions_max, settings.session_idle_s)
        else:
            self.admin = self.client()
        self.pool = concurrent.futures.ThreadPoolExecutor(PAGE_THREADS, thread_name_prefix="dmq-console")
        # Guards the forms of the console without sign-in, and the sign-in form.
        self.form_token = secrets.token_urlsafe(24)
        self.pending = 0  # pages taken and not yet answered (read and written on the event loop only)

    def __repr__(self) -> str:
        return (f"<ConsoleServer bootstrap={self.settings.bootstrap!r} writes={self.settings.allow_writes} "
                f"sign_in={self.settings.sign_in}>")

    def client(self, token: str | None = None) -> AdminClient:
        """An AdminClient with the console's settings; `token` (a viewer's) over its own."""
        extra = dict(self.settings.client_settings)
        if token is not None:
            extra["token"] = token
        return AdminClient(self.settings.bootstrap, request_timeout_ms=self.settings.request_timeout_ms, **extra)

    def view(self, session: Session | None) -> Console:
        if session is not None:
            return Console(self.settings, session.admin, session.form_token, session.principal)
        assert self.admin is not None, "pages without a session only without sign-in"
        return Console(self.settings, self.admin, self.form_token)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        if self.sessions is not None:
            self.sessions.close()
        if self.admin is not None:
            self.admin.close()


class SignInNeeded(Exception):
    """With sign-in on, a request without a live session."""


CONSOLE_KEY = web.AppKey("console", ConsoleServer)
Page = Callable[[Console, Request], Html]


def html_response(body: str, status: int = 200) -> web.Response:
    return web.Response(status=status, text=body, content_type="text/html", charset="utf-8",
                        headers=SECURITY_HEADERS)


def _error_page(status: int, title: str, message: str, view: Console | None, writes: bool) -> web.Response:
    body = page(title, tag("p", message, class_="error"), writes=writes)
    if view is not None and view.principal is not None:
        body = signed_in(body, view.principal, view.form_token)
    return html_response(body, status)


def see_other(location: str) -> web.Response:
    """303 to `location` (a path of this console), as a response: aiohttp deprecates returning
    its HTTPException classes."""
    return web.Response(status=303, headers={"Location": location, "Cache-Control": "no-store"})


def sign_in_redirect(request: web.Request, message: str | None = None) -> web.Response:
    """To the sign-in form, back here afterwards (a GET; after a POST, the overview). The session
    cookie, if any, is dropped: it names no live session."""
    back = request.path_qs if request.method == "GET" else "/"
    answer = see_other(url("/signin", next=back, ended="yes" if message else None))
    if SESSION_COOKIE in request.cookies:
        answer.del_cookie(SESSION_COOKIE, path="/")
    return answer


def handler(fn: Page) -> Callable[[web.Request], Any]:
    async def handle(request: web.Request) -> web.StreamResponse:
        server = request.app[CONSOLE_KEY]
        if server.pending >= PAGES_PENDING_MAX:
            return _error_page(503, "Busy", f"{PAGES_PENDING_MAX} pages are being served: try again shortly",
                               None, server.settings.allow_writes)
        server.pending += 1
        try:
            return await _serve(fn, server, request)
        finally:
            server.pending -= 1

    return handle


def _run(fn: Page, server: ConsoleServer, session_id: str | None, req: Request, used: list[Console]) -> Html:
    """On a pool thread: the page with its viewer's session, taken for the page's time and given
    back after it (an ended session's client is closed by the last page out)."""
    session = server.sessions.take(session_id) if server.sessions is not None else None
    if server.sessions is not None and session is None:
        raise SignInNeeded()
    try:
        view = server.view(session)
        used.append(view)
        return fn(view, req)
    finally:
        if server.sessions is not None and session is not None:
            server.sessions.give_back(session)


async def _serve(fn: Page, server: ConsoleServer, request: web.Request) -> web.StreamResponse:
    form: Mapping[str, str] = {}
    if request.method == "POST":
        posted = await request.post()
        form = {k: v for k, v in posted.items() if isinstance(v, str)}
    req = Request(dict(request.match_info), dict(request.query), form)
    writes = server.settings.allow_writes
    session_id = request.cookies.get(SESSION_COOKIE)
    used: list[Console] = []
    try:
        body = await asyncio.get_running_loop().run_in_executor(server.pool, _run, fn, server, session_id, req, used)
    except SignInNeeded:
        return sign_in_redirect(request)
    except (BadRequest, InvalidArgumentError) as e:
        return _error_page(400, "Bad request", str(e), _last(used), writes)
    except Forbidden as e:
        return _error_page(403, "Refused", str(e), _last(used), writes)
    except AuthorizationError as e:
        if server.sessions is not None and e.code == "UNAUTHENTICATED":
            # The servers no longer take this viewer's token (it expired, its key changed).
            await asyncio.get_running_loop().run_in_executor(server.pool, server.sessions.end, session_id)
            log.info("console session ended: the servers refused its token", path=request.path)
            return sign_in_redirect(request, str(e))
        who = "your principal" if server.sessions is not None else "the console's principal"
        return _error_page(403, "Not permitted", f"{who} may not do this: {e}", _last(used), writes)
    except NotFoundError as e:
        return _error_page(404, "Not found", str(e), _last(used), writes)
    except FailedPreconditionError as e:  # e.g. a reset while the group has members
        return _error_page(409, "Not possible now", str(e), _last(used), writes)
    except DMQError as e:
        log.warning("console page failed", path=request.path, error=str(e))
        return _error_page(502, "The cluster did not answer", str(e), _last(used), writes)
    view = _last(used)
    if view is not None and view.principal is not None:
        body = signed_in(body, view.principal, view.form_token)
    return html_response(body)


def _last(used: list[Console]) -> Console | None:
    return used[-1] if used else None
