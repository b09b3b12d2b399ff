"""`dmq console`: serve the web console until SIGINT / SIGTERM.

A process owner (like `dmq server`): it configures logging, runs the aiohttp server on its own
event loop, and prints one ready line with the bound URL on stdout ("DMQ console at
http://HOST:PORT/"), so `--port 0` (the OS picks) can be scripted and tested. The cluster
connection is the CLI's: --bootstrap, --timeout (each request to the cluster), --token and the
TLS options, read by the client library from the environment the `dmq` group sets.
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
from dmq.client.cli.logging_setup import configure_logging
from dmq.client.cli.servers import LOG_LEVELS

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
@click.option("--log-level", type=LOG_LEVELS, default="info", show_default=True, help="Console log level.")
@click.pass_context
def console(ctx: click.Context, host: str, port: int, allow_writes: bool, log_level: str) -> None:
    """Serve a web console over the cluster: brokers, topics and messages, consumer groups with
    their subscription modes and lag, queues and dead letters, event stores.

    \b
    It sees what its principal (--token / TLS options) may describe, and is read-only unless
    --allow-writes. Anyone who reaches its port sees what it sees: keep it on loopback or
    behind your own authentication.
    \b
    Example:
      dmq --bootstrap 127.0.0.1:9091 console --port 9480     # then open http://127.0.0.1:9480/
    """
    configure_logging(log_level)
    if not _is_loopback(host):
        log.warning("the console has no login of its own: whoever reaches this address sees what its principal may",
                    host=host)
    settings = ConsoleSettings(bootstrap(ctx), request_timeout_ms=max(1, int(timeout_s(ctx) * 1000)),
                               allow_writes=allow_writes)
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
                   f"{'writes enabled' if settings.allow_writes else 'read-only'})", nl=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()
