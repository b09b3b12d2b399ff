"""The `dmq` command: servers, topics, groups, produce/consume, brokers, bench.

Command modules are imported lazily (only the one being run), and each keeps its heavy imports
(grpc, the client library) inside its functions, so `dmq --help` and one-shot admin commands start
in a fraction of a second.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import click

from dmq.client.cli.servers import broker_cmd, coordinator_cmd, server_cmd

# name -> (module, attribute, one-line help shown by `dmq --help` without importing the module)
_LAZY_COMMANDS: dict[str, tuple[str, str, str]] = {
    "topics": ("dmq.client.cli.topics", "topics", "Create, list, describe, alter and delete topics."),
    "groups": ("dmq.client.cli.groups", "groups", "List and describe consumer groups, see lag, reset offsets."),
    "brokers": ("dmq.client.cli.brokers", "brokers", "List brokers: address, liveness, partitions led."),
    "coordinators": ("dmq.client.cli.coordinators", "coordinators",
                     "List the coordinators of --bootstrap: active or standby, controller epoch."),
    "queues": ("dmq.client.cli.queues", "queues", "Queue mode: depth, limits, leases and dead letters of queues."),
    "health": ("dmq.client.cli.health", "health", "Check the coordinator and every broker; exit 1 if any is down."),
    "produce": ("dmq.client.cli.messages", "produce", "Send lines from stdin or a file as messages."),
    "consume": ("dmq.client.cli.messages", "consume", "Print messages from a topic (with a group or from offsets)."),
    "bench": ("dmq.client.cli.bench", "bench", "Measure produce and consume throughput and latency."),
    "trace": ("dmq.client.cli.trace", "trace", "List every record with a trace id, across all topics, in time order."),
    "events": ("dmq.client.cli.events", "events", "Event-store topics: append / read events (JSON lines), event groups."),
    "console": ("dmq.client.cli.console.command", "console",
                "A web console: brokers, topics, messages, groups with lag, queues, event stores."),
    "certs": ("dmq.client.cli.security", "certs", "Make a development CA and TLS certificates."),
    "tokens": ("dmq.client.cli.security", "tokens", "Issue a signed token naming a principal."),
    "acls": ("dmq.client.cli.security", "acls", "Add, list and remove access-control entries."),
}


class DMQGroup(click.Group):
    """Loads subcommands lazily and turns every failure into one line and an exit code.

    Exit codes: 0 ok, 1 error, 2 usage (click), 130 interrupted.
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(_LAZY_COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None or cmd_name not in _LAZY_COMMANDS:
            return cmd
        module, attr, _help = _LAZY_COMMANDS[cmd_name]
        lazy: click.Command = getattr(importlib.import_module(module), attr)  # what _LAZY_COMMANDS names
        self.add_command(lazy, cmd_name)
        return lazy

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Help for lazy commands comes from the table above, so `dmq --help` imports nothing more.
        rows = []
        for name in self.list_commands(ctx):
            if name in _LAZY_COMMANDS and name not in self.commands:
                rows.append((name, _LAZY_COMMANDS[name][2]))
            else:
                cmd = self.commands[name]
                rows.append((name, cmd.get_short_help_str(limit=formatter.width - 6 - len(name))))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        from dmq.client.cli._errors import run_translating_errors

        return run_translating_errors(ctx, lambda: super(DMQGroup, self).invoke(ctx))


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """The distribution is dmq-queue ("dmq" on PyPI is another project, whose version must never be
    shown as ours); looked up only when asked, so every other command starts without it."""
    if not value or ctx.resilient_parsing:
        return
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("dmq-queue")
    except PackageNotFoundError:
        found = "unknown (the dmq-queue distribution is not installed: pip install -e .)"
    click.echo(f"dmq, version {found}")
    ctx.exit()


def _check_bootstrap(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """HOST:PORT, or several comma-separated (coordinators on one etcd: the client finds the active one)."""
    entries = []
    for entry in value.split(","):
        entry = entry.strip()
        if "://" in entry:
            entry = entry.split("://", 1)[1].rstrip("/")
        host, sep, port = entry.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise click.BadParameter(f"expected HOST:PORT such as 127.0.0.1:9091 (or several, comma-separated), got {entry!r}")
        entries.append(entry)
    return ",".join(entries)


@click.group(cls=DMQGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--bootstrap", envvar="DMQ_BOOTSTRAP", metavar="HOST:PORT", default="127.0.0.1:9091", show_default=True,
              callback=_check_bootstrap,
              help="Coordinator address HOST:PORT, or several comma-separated (env DMQ_BOOTSTRAP).")
@click.option("--timeout", "timeout_s", envvar="DMQ_TIMEOUT", metavar="SECONDS", type=click.FloatRange(0.1), default=15.0,
              show_default=True, help="Seconds to wait for the cluster to answer a request (env DMQ_TIMEOUT).")
@click.option("--token", envvar="DMQ_TOKEN", metavar="JWT", default=None, show_default="none",
              help="Token naming your principal (env DMQ_TOKEN; prefer the variable: a flag shows in ps).")
@click.option("--ca-file", envvar="DMQ_SSL_CAFILE", type=click.Path(dir_okay=False), default=None, show_default="none",
              help="CA of the servers' certificates: connect with TLS (env DMQ_SSL_CAFILE).")
@click.option("--cert-file", envvar="DMQ_SSL_CERTFILE", type=click.Path(dir_okay=False), default=None, show_default="none",
              help="Client certificate, for mutual TLS (env DMQ_SSL_CERTFILE).")
@click.option("--key-file", envvar="DMQ_SSL_KEYFILE", type=click.Path(dir_okay=False), default=None, show_default="none",
              help="The client certificate's key (env DMQ_SSL_KEYFILE).")
@click.option("-v", "--verbose", count=True,
              help="Show the client library's log on stderr: -v warnings, -vv everything (produce, consume, bench).")
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Show the version and exit.")
@click.pass_context
def cli(ctx: click.Context, bootstrap: str, timeout_s: float, token: str | None, ca_file: str | None,
        cert_file: str | None, key_file: str | None, verbose: int) -> None:
    """DMQ: a Kafka-style message queue. Start with `dmq server`, then `dmq topics create`.

    \b
    Exit codes: 0 ok, 1 error (`dmq health`, `dmq brokers list`: a server is down), 2 usage error.
    Listings take -o json for scripts.
    """
    ctx.ensure_object(dict)
    if verbose:
        os.environ["DMQ_CLIENT_LOG_LEVEL"] = "warning" if verbose == 1 else "debug"
    ctx.obj["bootstrap"] = bootstrap
    # Every client and channel of this process reads its credentials from these variables
    # (dmq.client._security), so one place covers every command.
    for var, value in (("DMQ_TOKEN", token), ("DMQ_SSL_CAFILE", ca_file), ("DMQ_SSL_CERTFILE", cert_file),
                       ("DMQ_SSL_KEYFILE", key_file)):
        if value:
            os.environ[var] = value
    ctx.obj["timeout_s"] = timeout_s


cli.add_command(server_cmd)
cli.add_command(coordinator_cmd)
cli.add_command(broker_cmd)


def main() -> None:
    # gRPC's C core writes its own lines to stderr ("I1127 ... chttp2_transport.cc ... Got goaway",
    # TLS handshake failures), outside structlog in a server's log and around the CLI's one-line
    # errors; whatever matters reaches us as a call's status. It reads the level once, when grpc
    # loads, so it is set here before any command imports grpc; an operator's own value wins.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    # `dmq server --brokers N` starts and restarts its members with subprocess while its own
    # channels are live: grpcio >= 1.80's fork handlers can abort such a child before exec
    # (grpc/grpc#43055, epoll EBADF). DMQ never forks without exec, so fork support is off.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    cli(obj={})
