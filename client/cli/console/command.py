"""`dmq console`: serve the web console until SIGINT / SIGTERM.

A process owner (like `dmq server`): it configures logging, runs the aiohttp server on its own
event loop, and prints one ready line with the bound URL on stdout ("DMQ console at
http://HOST:PORT/"), so `--port 0` (the OS picks) can be scripted and tested. The cluster
connection is the CLI's: --bootstrap, --timeout (each request to the cluster), --token and the
TLS options, read by the client library from the environment the `dmq` group sets.

Sign-in: with the cluster's security on, each viewer signs in with their own token and pages read
with it; the console's own token is then not used. "Security on" is judged from the connection,
since the console cannot ask the servers before anyone signs in: TLS to the cluster (DESIGN.md
"Security": TLS and authentication go together). --sign-in / --no-sign-in decide it instead
(--no-sign-in: every viewer sees what the console's own principal may, as on a cluster without
security; e.g. mutual TLS without tokens, where a viewer has no token to sign in with).
"""

from __future__ import annotations

import asyncio
import ipaddress
import signal

import click
import structlog
from aiohttp import web

from dmq.client.cli._errors import bootstrap, timeout_s
from dmq.client.cli.console import ConsoleSettings, create_app
from dmq.client.cli.console._viewers import SESSION_IDLE_S, SESSIONS_MAX
from dmq.client.cli.logging_setup import configure_logging
from dmq.client.cli.servers import LOG_LEVELS
from dmq.proto.security.settings import ClientSecurity, SecurityConfigError

log = structlog.get_logger(__name__)

DEFAULT_PORT = 9480
# Seconds that open page requests get to finish on shutdown.
SHUTDOWN_GRACE_S = 2.0


@click.command("console")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True,
              help="Port to listen on (0: the OS picks one; the ready line names it).")
@click.option("--allow-writes", is_flag=True,
              help="Allow offset resets (with a dry-run preview) from the console. Off: read-only.")
@click.option("--sign-in/--no-sign-in", "sign_in", default=None,
              help="Each viewer signs in with their own token and sees what that principal may describe. "
                   "Default: on when the cluster is reached over TLS (security on), else off.")
@click.option("--sessions-max", type=click.IntRange(1, 10_000), default=SESSIONS_MAX, show_default=True,
              help="With sign-in: viewers signed in at once (each holds a client); past it the least "
                   "recently used is signed out.")
@click.option("--session-idle-s", type=click.IntRange(1, 7 * 86400), default=int(SESSION_IDLE_S),
              show_default=True, help="With sign-in: a session unused this many seconds is signed out.")
@click.option("--log-level", type=LOG_LEVELS, default="info", show_default=True, help="Console log level.")
@click.pass_context
def console(ctx: click.Context, host: str, port: int, allow_writes: bool, sign_in: bool | None, sessions_max: int,
            session_idle_s: int, log_level: str) -> None:
    """Serve a web console over the cluster: brokers, topics and messages, consumer groups with
    their subscription modes and lag, queues and dead letters, event stores.

    \b
    With security on (TLS to the cluster), each viewer signs in with their own token and sees
    what that principal may describe. Otherwise (or --no-sign-in) it shows every viewer what its
    own principal (--token / TLS options) may describe: keep it on loopback or behind your own
    authentication. Read-only unless --allow-writes.
    \b
    Example:
      dmq --bootstrap 127.0.0.1:9091 console --port 9480     # then open http://127.0.0.1:9480/
    """
    configure_logging(log_level)
    try:
        security = ClientSecurity.from_settings()
    except SecurityConfigError as e:
        raise click.ClickException(str(e)) from None
    if sign_in is None:
        sign_in = security is not None and security.tls
    if sign_in and security is not None and security.has_token:
        log.warning("the console's own token (--token / DMQ_TOKEN) is not used: each viewer signs in with theirs "
                    "(--no-sign-in shows every viewer what that token's principal may see)")
    if not _is_loopback(host):
        if sign_in:
            log.warning("the console serves plain HTTP: viewers' tokens cross the network in clear to this address; "
                        "put a TLS proxy in front of it", host=host)
        else:
            log.warning("the console has no login of its own: whoever reaches this address sees what its principal "
                        "may", host=host)
    settings = ConsoleSettings(bootstrap(ctx), request_timeout_ms=max(1, int(timeout_s(ctx) * 1000)),
                               allow_writes=allow_writes, sign_in=sign_in, sessions_max=sessions_max,
                               session_idle_s=float(session_idle_s))
    try:
        asyncio.run(_serve(settings, host, port))
    except OSError as e:  # the port is taken, the address is not this host's
        raise click.ClickException(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


async def _serve(settings: ConsoleSettings, host: str, port: int) -> None:
    runner = web.AppRunner(create_app(settings), shutdown_timeout=SHUTDOWN_GRACE_S, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1]
        shown = f"[{host}]" if ":" in host else host
        click.echo(f"DMQ console at http://{shown}:{bound}/ (cluster {settings.bootstrap}; "
                   f"{'writes enabled' if settings.allow_writes else 'read-only'}"
                   f"{'; viewers sign in' if settings.sign_in else ''})", nl=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()
