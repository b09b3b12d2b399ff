"""Signing in and out (with sign-in on, i.e. security on).

A viewer posts their token in a form (a password field: never in a URL). The console makes an
AdminClient with it and asks the cluster one question (the topic list); the servers verify the
token, and only UNAUTHENTICATED refuses the sign-in, with the servers' reason (another key,
expired, malformed: they never repeat the token). A principal that may not list topics is still
signed in: what it may see is for each page's calls to find out. The session is then kept on the
server (_viewers.Sessions) and the browser gets only its random id, in an HttpOnly,
SameSite=Strict cookie, so no script reads it and no other site's request carries it. Sign-out
ends the session (and closes its client) and drops the cookie.

The forms carry a form token as the console's other forms do: the sign-in form the console's,
the sign-out form the session's. The token is logged nowhere (aiohttp's access log is off).
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Mapping

import jwt
import structlog
from aiohttp import web

from dmq.client.cli.console._app import (
    CONSOLE_KEY,
    PAGES_PENDING_MAX,
    SESSION_COOKIE,
    BadRequest,
    ConsoleServer,
    html_response,
    see_other,
    sign_in_redirect,
)
from dmq.client.cli.console._html import Html, join, page, tag
from dmq.client.cli.console._viewers import Session
from dmq.client.errors import AuthorizationError, DMQError
from dmq.proto.security.tokens import MAX_TOKEN_CHARS

log = structlog.get_logger(__name__)

__all__ = ["sign_in_page", "sign_in", "sign_out"]

NEXT_CHARS_MAX = 2048


class SignInRefused(Exception):
    """The servers did not accept the token: the message says why."""


def _next_path(raw: str) -> str:
    """Where to go after signing in: a path of this console only (no other site, no scheme)."""
    if (not raw.startswith("/") or raw.startswith("//") or "\\" in raw or len(raw) > NEXT_CHARS_MAX
            or any(ord(ch) < 0x20 for ch in raw)):
        return "/"
    return raw


def _form(server: ConsoleServer, next_path: str, message: Html | str | None = None) -> Html:
    form = tag(
        "form",
        tag("input", type="hidden", name="form_token", value=server.form_token),
        tag("input", type="hidden", name="next", value=next_path),
        tag("label", "Token (a JWT from `dmq tokens create` or your identity provider)",
            tag("input", type="password", name="token", autocomplete="off", required=True, size="60",
                autofocus=True)),
        tag("button", "Sign in", type="submit"),
        action="/signin", method="post", class_="inline", id="signin",
    )
    note = tag("p", "Pages show what your principal may describe; the servers decide.", class_="muted")
    shown = tag("p", message, class_="error") if message else Html("")
    return page("Sign in", join([shown, form, note]), writes=server.settings.allow_writes)


async def sign_in_page(request: web.Request) -> web.StreamResponse:
    server = request.app[CONSOLE_KEY]
    if server.sessions is None:
        raise web.HTTPNotFound(text="this console has no sign-in: the cluster's security is off (or --no-sign-in)")
    ended = ("Your session ended: the servers no longer accept its token (it may have expired). Sign in again."
             if request.query.get("ended") == "yes" else None)
    return html_response(_form(server, _next_path(request.query.get("next", "/")), ended))


def _check_form(server: ConsoleServer, form: Mapping[str, str]) -> str:
    if not hmac.compare_digest(form.get("form_token", ""), server.form_token):
        raise BadRequest("the form is stale or did not come from this console (form_token): reload the page")
    token = form.get("token", "").strip()
    if not token:
        raise BadRequest("token is needed: paste your token (a JWT) to sign in")
    if len(token) > MAX_TOKEN_CHARS:
        raise BadRequest(f"token must be at most {MAX_TOKEN_CHARS} characters, got {len(token)}")
    return token


def _principal(token: str) -> str:
    """The token's subject, for showing who is signed in; read after the servers verified it."""
    try:
        sub = jwt.decode(token, options={"verify_signature": False}).get("sub")
    except jwt.PyJWTError:
        sub = None
    return sub if isinstance(sub, str) and sub else "(a principal of a client certificate)"


def _open_session(server: ConsoleServer, token: str) -> Session:
    """On a pool thread: a client with the token, checked by the servers, kept as a session."""
    assert server.sessions is not None
    admin = server.client(token)
    try:
        admin.list_topics()
    except AuthorizationError as e:
        if e.code == "UNAUTHENTICATED":
            admin.close()
            raise SignInRefused(str(e)) from None
        # PERMISSION_DENIED: the token is good; this principal may not list topics.
    except BaseException:
        admin.close()
        raise
    return server.sessions.add(_principal(token), admin)


async def sign_in(request: web.Request) -> web.StreamResponse:
    server = request.app[CONSOLE_KEY]
    if server.sessions is None:
        raise web.HTTPNotFound(text="this console has no sign-in: the cluster's security is off (or --no-sign-in)")
    posted = await request.post()
    form = {k: v for k, v in posted.items() if isinstance(v, str)}
    next_path = _next_path(form.get("next", "/"))
    try:
        token = _check_form(server, form)
    except BadRequest as e:
        return html_response(_form(server, next_path, str(e)), 400)
    if server.pending >= PAGES_PENDING_MAX:
        return html_response(_form(server, next_path, f"{PAGES_PENDING_MAX} pages are being served: try again "
                                                      "shortly"), 503)
    server.pending += 1
    try:
        session = await asyncio.get_running_loop().run_in_executor(server.pool, _open_session, server, token)
    except SignInRefused as e:
        log.info("console sign-in refused")  # the reason may name the principal; the token never
        return html_response(_form(server, next_path, f"Sign-in refused by the cluster: {e}"), 401)
    except DMQError as e:
        log.warning("console sign-in failed", error=str(e))
        return html_response(_form(server, next_path, f"The cluster did not answer: {e}"), 502)
    finally:
        server.pending -= 1
    log.info("console sign-in", principal=session.principal, sessions=len(server.sessions))
    answer = see_other(next_path)
    answer.set_cookie(SESSION_COOKIE, session.session_id, path="/", httponly=True, samesite="Strict")
    return answer


async def sign_out(request: web.Request) -> web.StreamResponse:
    server = request.app[CONSOLE_KEY]
    if server.sessions is None:
        raise web.HTTPNotFound(text="this console has no sign-in: the cluster's security is off (or --no-sign-in)")
    posted = await request.post()
    session_id = request.cookies.get(SESSION_COOKIE)
    session = server.sessions.peek(session_id)
    if session is None:
        return sign_in_redirect(request)
    if not hmac.compare_digest(str(posted.get("form_token", "")), session.form_token):
        return html_response(page("Refused", tag("p", "the form is stale or did not come from this console "
                                                      "(form_token): reload the page", class_="error")), 403)
    await asyncio.get_running_loop().run_in_executor(server.pool, server.sessions.end, session_id)
    log.info("console sign-out", principal=session.principal)
    answer = see_other("/signin")
    answer.del_cookie(SESSION_COOKIE, path="/")
    return answer
