"""`dmq console`: a web console over a running cluster, read-only unless --allow-writes.

The console is a client of the cluster, as the CLI is: it reads through the client library
(AdminClient, SimpleConsumer, EventStore) with the principal of the viewer who signed in (security
on) or the one it was given (--token / TLS options), so the servers decide what it may see, and
every wait is bounded by the client's request timeout. Pages are rendered on the server (aiohttp.web) with a little CSS; nothing to
build. The modules:
  _html           safe HTML by construction (every value escaped), the layout and the CSS;
  _app            settings, the ConsoleServer (clients, page thread pool), error pages, writes;
  _viewers        the signed-in viewers' sessions, each with a client of its principal (bounded);
  _signin         the sign-in form, signing in (the servers check the token) and out;
  _cluster_pages  overview, topics, a topic with its message browser, the trace view;
  _group_pages    consumer groups with subscription badges and lag, a group, offset resets;
  _work_pages     queues with leases and dead letters, event stores with their groups.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from dmq.client.cli.console import _cluster_pages, _group_pages, _signin, _work_pages
from dmq.client.cli.console._app import CONSOLE_KEY, ConsoleServer, ConsoleSettings, handler

__all__ = ["ConsoleSettings", "create_app"]

# How often idle sessions are looked for (each page looks too); at most their idle time.
SWEEP_INTERVAL_S = 30.0


def create_app(settings: ConsoleSettings) -> web.Application:
    app = web.Application(client_max_size=64 * 1024)  # forms are small: a reset is a few fields
    console = ConsoleServer(settings)
    app[CONSOLE_KEY] = console

    async def close(_app: web.Application) -> None:
        await asyncio.get_running_loop().run_in_executor(None, console.close)

    app.on_cleanup.append(close)
    if console.sessions is not None:
        app.cleanup_ctx.append(_sweeping)
    get = [
        ("/", _cluster_pages.overview),
        ("/topics", _cluster_pages.topics),
        ("/topics/{topic}", _cluster_pages.topic),
        ("/topics/{topic}/messages", _cluster_pages.messages),
        ("/trace", _cluster_pages.trace),
        ("/groups", _group_pages.groups),
        ("/groups/{group}", _group_pages.group),
        ("/queues", _work_pages.queues),
        ("/queues/{topic}", _work_pages.queue),
        ("/events", _work_pages.event_stores),
        ("/events/{topic}", _work_pages.event_store),
    ]
    app.router.add_routes([web.get(path, handler(fn)) for path, fn in get])
    app.router.add_post("/groups/{group}/reset", handler(_group_pages.reset))
    app.router.add_get("/signin", _signin.sign_in_page)
    app.router.add_post("/signin", _signin.sign_in)
    app.router.add_post("/signout", _signin.sign_out)
    return app


async def _sweeping(app: web.Application) -> AsyncIterator[None]:
    """The task that ends idle sessions (and closes their clients) while no page asks: owned by
    the application, stopped on its cleanup."""
    console = app[CONSOLE_KEY]
    assert console.sessions is not None
    sessions = console.sessions

    async def sweep() -> None:
        every_s = min(SWEEP_INTERVAL_S, sessions.idle_s)
        while True:
            await asyncio.sleep(every_s)
            await asyncio.get_running_loop().run_in_executor(console.pool, sessions.sweep)

    task = asyncio.create_task(sweep(), name="dmq-console-session-sweep")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
