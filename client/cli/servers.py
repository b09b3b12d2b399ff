"""`dmq server`, `dmq coordinator`, `dmq broker`: the server processes."""

from __future__ import annotations

import asyncio
import pathlib
import signal
import subprocess
import sys
import time

import click

from dmq.client.cli.logging_setup import configure_logging

LOG_LEVELS = click.Choice(["debug", "info", "warning", "error"])
SUBSCRIPTION_MODES = click.Choice(["all", "new", "timestamp"])


def _log_config(flush: str, flush_interval_ms: int, segment_bytes: int, retention_ms: int, retention_bytes: int):  # type: ignore[no-untyped-def]
    from dmq.broker.log import LogConfig

    return LogConfig(
        flush_policy=flush,
        flush_interval_ms=flush_interval_ms,
        segment_bytes=segment_bytes,
        retention_ms=retention_ms,
        retention_bytes=retention_bytes,
    )


def _storage_options(f):  # type: ignore[no-untyped-def]
    f = click.option(
        "--flush",
        type=click.Choice(["fsync", "interval"]),
        default="fsync",
        show_default=True,
        help="fsync: acks=all produces are fsynced before the answer (group commit). "
        "interval: fsync every --flush-interval-ms (faster, may lose the last interval on a crash).",
    )(f)
    f = click.option("--flush-interval-ms", type=click.IntRange(1), default=1000, show_default=True,
                     help="Flush period for --flush interval.")(f)
    f = click.option("--segment-bytes", type=click.IntRange(1024), default=1024**3, show_default=True,
                     help="Roll a new log segment at this size (topic default).")(f)
    f = click.option("--retention-ms", type=click.IntRange(-1), default=7 * 24 * 3600 * 1000, show_default=True,
                     help="Delete segments older than this (topic default); -1 keeps forever.")(f)
    f = click.option("--retention-bytes", type=click.IntRange(-1), default=-1, show_default=True,
                     help="Delete old segments past this size per partition (topic default); -1 = no limit.")(f)
    return f


@click.command("server")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on and advertise.")
@click.option("--port", type=click.IntRange(0, 65535), default=9091, show_default=True,
              help="Port of the coordinator (and of the broker, with one broker).")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=pathlib.Path), default=pathlib.Path("dmq-data"),
              show_default=True, help="Where logs, offsets and metadata are kept.")
@click.option("--brokers", type=click.IntRange(1, 64), default=1, show_default=True,
              help="1: coordinator and broker in this process on one port. N>1: a coordinator and N broker processes.")
@click.option("--default-subscription-mode", type=SUBSCRIPTION_MODES, default="all", show_default=True,
              help="Where a new group starts when its consumers name no mode: all (log start) or new (log end).")
@click.option("--log-level", type=LOG_LEVELS, default="info", show_default=True,
              help="Least severe log lines to print (structlog: console lines in a terminal, JSON otherwise).")
@_storage_options
def server_cmd(host: str, port: int, data_dir: pathlib.Path, brokers: int, default_subscription_mode: str,
               log_level: str, flush: str, flush_interval_ms: int, segment_bytes: int, retention_ms: int,
               retention_bytes: int) -> None:
    """Run DMQ for development: a coordinator and broker(s), data under --data-dir."""
    configure_logging(log_level)
    if brokers > 1:
        _run_process_cluster(host, port, data_dir, brokers, default_subscription_mode, log_level)
        return
    from dmq.coordinator.embedded import ClusterOptions, run_embedded

    options = ClusterOptions(
        data_dir=data_dir,
        host=host,
        port=port,
        log_config=_log_config(flush, flush_interval_ms, segment_bytes, retention_ms, retention_bytes),
        default_subscription_mode=default_subscription_mode,
    )

    def ready(cluster) -> None:  # type: ignore[no-untyped-def]
        click.echo(
            f"DMQ is running: coordinator and broker on {cluster.bootstrap}, data in {data_dir.resolve()}\n"
            f"  connect with bootstrap=\"{cluster.bootstrap}\", e.g.  dmq --bootstrap {cluster.bootstrap} topics list\n"
            f"  stop with Ctrl-C",
            err=True,
        )

    try:
        asyncio.run(run_embedded(options, ready))
    except OSError as e:
        raise click.ClickException(str(e)) from None


def _run_process_cluster(host: str, port: int, data_dir: pathlib.Path, brokers: int, mode: str, log_level: str) -> None:
    """A coordinator process and N broker processes; SIGINT/SIGTERM stop them all cleanly."""
    exe = [sys.executable, "-m", "dmq.client.cli"]
    bootstrap = f"{host}:{port}"
    children = [subprocess.Popen(exe + ["coordinator", "--host", host, "--port", str(port),
                                        "--data-dir", str(data_dir / "coordinator"),
                                        "--default-subscription-mode", mode, "--log-level", log_level])]
    for i in range(brokers):
        children.append(subprocess.Popen(exe + ["broker", "--host", host, "--port", "0", "--broker-id", str(i),
                                                "--coordinator", bootstrap, "--data-dir", str(data_dir / f"broker-{i}"),
                                                "--log-level", log_level]))
    stop = {"now": False}

    def handle(signum: int, frame: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGINT, handle)
    signal.signal(signal.SIGTERM, handle)
    click.echo(f"DMQ cluster: coordinator on {bootstrap}, {brokers} broker processes; bootstrap=\"{bootstrap}\"; Ctrl-C stops", err=True)
    # A broker that exits is reported and the rest keep running (that is how a broker failure is
    # tried out locally); the cluster ends with the coordinator or on a signal.
    reported: set[int] = set()
    while not stop["now"] and children[0].poll() is None:
        for i, c in enumerate(children[1:]):
            if c.poll() is not None and i not in reported:
                reported.add(i)
                click.echo(f"broker {i} exited with code {c.returncode}; the others keep running", err=True)
        time.sleep(0.2)
    for c in children:
        if c.poll() is None:
            c.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    for c in children:
        try:
            c.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            c.kill()
            c.wait(5)


@click.command("coordinator")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on and advertise.")
@click.option("--port", type=click.IntRange(0, 65535), default=9091, show_default=True,
              help="Port clients (--bootstrap) and brokers (--coordinator) connect to; 0 picks a free port.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=pathlib.Path),
              default=pathlib.Path("dmq-data/coordinator"), show_default=True, help="Where the SQLite metadata lives.")
@click.option("--default-subscription-mode", type=SUBSCRIPTION_MODES, default="all", show_default=True,
              help="Where a new group starts when its consumers name no mode.")
@click.option("--log-level", type=LOG_LEVELS, default="info", show_default=True,
              help="Least severe log lines to print (structlog: console lines in a terminal, JSON otherwise).")
# The default is coordinator.metadata.DEFAULT_BROKER_SESSION_TIMEOUT_MS (a test checks), kept
# literal so that the CLI does not import the coordinator to show its help.
@click.option("--broker-session-timeout-ms", type=click.IntRange(100), default=6_000, show_default=True,
              help="A broker that has not heartbeated for this long is declared dead (clients stop waiting on it).")
def coordinator_cmd(host: str, port: int, data_dir: pathlib.Path, default_subscription_mode: str, log_level: str,
                    broker_session_timeout_ms: int) -> None:
    """Run the coordinator alone: metadata (brokers, topics) and consumer groups."""
    configure_logging(log_level)
    from dmq.coordinator.embedded import run_coordinator_only

    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        asyncio.run(run_coordinator_only(
            data_dir, host, port, lambda addr: click.echo(f"coordinator listening on {addr}", err=True),
            default_subscription_mode=default_subscription_mode,
            broker_session_timeout_ms=broker_session_timeout_ms,
        ))
    except OSError as e:
        raise click.ClickException(str(e)) from None


@click.command("broker")
@click.option("--coordinator", "coordinator", required=True, metavar="HOST:PORT", help="The coordinator to register with.")
@click.option("--broker-id", type=click.IntRange(0), required=True, help="This broker's stable id.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on and advertise.")
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True, help="0 picks a free port.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=pathlib.Path), required=True,
              help="Where this broker's logs and committed offsets live.")
@click.option("--log-level", type=LOG_LEVELS, default="info", show_default=True,
              help="Least severe log lines to print (structlog: console lines in a terminal, JSON otherwise).")
@_storage_options
def broker_cmd(coordinator: str, broker_id: int, host: str, port: int, data_dir: pathlib.Path, log_level: str,
               flush: str, flush_interval_ms: int, segment_bytes: int, retention_ms: int, retention_bytes: int) -> None:
    """Run one storage broker that registers with --coordinator."""
    configure_logging(log_level)
    from dmq.coordinator.embedded import run_broker_only

    try:
        asyncio.run(run_broker_only(
            data_dir, host, port, broker_id, coordinator,
            lambda addr: click.echo(f"broker {broker_id} listening on {addr}", err=True),
            log_config=_log_config(flush, flush_interval_ms, segment_bytes, retention_ms, retention_bytes),
        ))
    except OSError as e:
        raise click.ClickException(str(e)) from None
