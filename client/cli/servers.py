"""`dmq server`, `dmq coordinator`, `dmq broker`: the server processes."""

from __future__ import annotations

import asyncio
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from dmq.broker.replication.settings import REPLICA_ACK_TIMEOUT_MS_DEFAULT, REPLICA_LAG_TIME_MAX_MS_DEFAULT
from dmq.client.cli.logging_setup import configure_logging

if TYPE_CHECKING:
    from dmq.broker.log import LogConfig
    from dmq.client.cli.runner import LocalCluster
    from dmq.coordinator.principal_limits import PrincipalLimits
    from dmq.proto.security.settings import ServerSecurity
    from dmq.proto.server.security.quotas import QuotaSettings

    # click types a parameter type by the value it converts to; the runtime class is subscripted
    # only by the click releases that made it generic, so the parameter is given to mypy alone.
    _PortParamType = click.ParamType[int | None]
else:
    _PortParamType = click.ParamType

# A command callback being decorated with options (the option helpers below return it as given).
F = TypeVar("F", bound=Callable[..., Any])

LOG_LEVELS = click.Choice(["debug", "info", "warning", "error"])
SUBSCRIPTION_MODES = click.Choice(["all", "new", "timestamp"])
MAX_COORDINATORS = 9  # `dmq server --coordinators M`: a development cluster, on one machine
DEFAULT_METRICS_PORT = 9464  # dmq.proto.server.metrics.DEFAULT_METRICS_PORT (not imported: `dmq --help` stays light)


class MetricsPort(_PortParamType):
    """--metrics-port: a port, 0 for no endpoint, or `auto` for a free port (printed at start).
    Converted to what the runners take: None (off), 0 (a free port) or the port."""

    name = "PORT|0|auto"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int | None:
        if value is None or (isinstance(value, int) and not isinstance(value, bool)):
            port = value
        elif str(value).strip().lower() == "auto":
            return 0
        else:
            try:
                port = int(str(value))
            except ValueError:
                self.fail(f"{value!r} is not a port (1-65535), 0 (off) or auto", param, ctx)
        if port is None or port == 0:
            return None
        if not 1 <= port <= 65535:
            self.fail(f"{port} is not a port (1-65535), 0 (off) or auto", param, ctx)
        return port


# dmq.broker.metrics.DEFAULT_MAX_PARTITION_SERIES (the coordinator's is the same); the most a
# server is allowed: past some 100,000 series a scrape is megabytes and Prometheus struggles.
DEFAULT_MAX_PARTITION_SERIES = 1000
MAX_PARTITION_SERIES_LIMIT = 100_000


def _metrics_option(default: str, help_text: str, envvar: str | None = None) -> Callable[[F], F]:
    """--metrics-port and --metrics-max-partition-series (the bound on its label sets)."""
    port = click.option("--metrics-port", "metrics_port", type=MetricsPort(), default=default, show_default=True,
                        envvar=envvar, show_envvar=envvar is not None,
                        help=help_text + " Prometheus text at http://HOST:PORT/metrics; 0: off; auto: a free port.")
    series = click.option(
        "--metrics-max-partition-series", type=click.IntRange(0, MAX_PARTITION_SERIES_LIMIT),
        default=DEFAULT_MAX_PARTITION_SERIES, show_default=True,
        help="Per-partition metric series (label partition) for up to this many partitions per server; past "
             "that, one series per topic (partition=\"*\") and, for consumer lag, only the per-group sums.")
    return lambda f: port(series(f))


def _check_metrics_series(metrics_port: int | None) -> None:
    """Refuse --metrics-max-partition-series without an endpoint, as it would be ignored."""
    source = click.get_current_context().get_parameter_source("metrics_max_partition_series")
    if metrics_port is None and source not in (None, click.core.ParameterSource.DEFAULT):
        raise click.UsageError("--metrics-max-partition-series is only used with a metrics endpoint "
                               "(--metrics-port is 0: off)")


def _metrics_argv(port: int | None, offset: int) -> list[str]:
    """The metrics options for child `offset` of a process cluster: coordinator PORT, broker i
    PORT + 1 + i, and the series bound `dmq server` was given (read from its click context, as
    _check_metrics_series reads its source; only with an endpoint: a child refuses it without)."""
    if port is None:
        return ["--metrics-port", "0"]
    series = click.get_current_context().params.get("metrics_max_partition_series", DEFAULT_MAX_PARTITION_SERIES)
    return ["--metrics-port", "auto" if port == 0 else str(port + offset), "--metrics-max-partition-series", str(series)]


def _log_config(flush: str, flush_interval_ms: int, segment_bytes: int, retention_ms: int,
                retention_bytes: int) -> LogConfig:
    from dmq.broker.log import LogConfig

    return LogConfig(
        flush_policy=flush,
        flush_interval_ms=flush_interval_ms,
        segment_bytes=segment_bytes,
        retention_ms=retention_ms,
        retention_bytes=retention_bytes,
    )


def _storage_options(f: F) -> F:
    f = click.option(
        "--flush",
        type=click.Choice(["fsync", "interval"]),
        default="fsync",
        show_default=True,
        help="fsync: acks=all produces are fsynced before the answer (group commit). "
        "interval: fsync every --flush-interval-ms (faster, may lose the last interval on a crash).",
    )(f)
    f = click.option("--flush-interval-ms", type=click.IntRange(1), default=1000, show_default=True,
                     help="Flush period for --flush interval (refused with --flush fsync).")(f)
    f = click.option("--segment-bytes", type=click.IntRange(1024), default=1024**3, show_default=True,
                     help="Roll a new log segment at this size (topic default).")(f)
    f = click.option("--retention-ms", type=click.IntRange(-1), default=7 * 24 * 3600 * 1000, show_default=True,
                     help="Delete segments older than this (topic default); -1 keeps forever.")(f)
    f = click.option("--retention-bytes", type=click.IntRange(-1), default=-1, show_default=True,
                     help="Delete old segments past this size per partition (topic default); -1 = no limit.")(f)
    return f


def _security_options(f: F) -> F:
    """TLS, authentication and quotas of a server port (dmq.proto.security.settings)."""
    opts = [
        click.option("--tls-cert", type=click.Path(dir_okay=False, exists=True), default=None, show_default="none",
                     help="Server certificate (PEM; `dmq certs create` makes one): TLS on the port."),
        click.option("--tls-key", type=click.Path(dir_okay=False, exists=True), default=None, show_default="none",
                     help="The server certificate's private key (PEM)."),
        click.option("--tls-ca", type=click.Path(dir_okay=False, exists=True), default=None, show_default="none",
                     help="The cluster's CA: verifies client certificates and the other nodes' certificates."),
        click.option("--require-client-cert", is_flag=True, default=False, show_default=True,
                     help="Mutual TLS: every client presents a certificate signed by --tls-ca; its common name "
                          "is the principal."),
        click.option("--token-secret-file", type=click.Path(dir_okay=False, exists=True), default=None, show_default="none",
                     help="File holding the HS256 secret tokens are signed with (or env DMQ_TOKEN_SECRET)."),
        click.option("--token-public-key", type=click.Path(dir_okay=False, exists=True), default=None, show_default="none",
                     help="PEM public key (RS256/ES256) tokens are verified with; tokens are issued elsewhere."),
        click.option("--token-leeway-s", type=click.IntRange(0, 600), default=30, show_default=True,
                     help="Accept a token until its exp plus this many seconds (issuer's and server's clocks differ)."),
        click.option("--super-users", default="", show_default="none", metavar="NAMES",
                     help="Comma-separated principals allowed everything a client may do (bootstrap the ACLs)."),
        click.option("--cluster-principal", default="dmq-cluster", show_default=True,
                     help="The nodes' own principal: the only one allowed the cluster-internal RPCs."),
        click.option("--cluster-token-file", type=click.Path(dir_okay=False, exists=True), default=None, show_default="none",
                     help="With --token-public-key: a token for the cluster principal (or env DMQ_CLUSTER_TOKEN)."),
        click.option("--insecure", is_flag=True, default=False, show_default=True,
                     help="Allow listening on a non-loopback address without TLS and authentication."),
        click.option("--quota-produce-bytes-per-s", type=click.IntRange(0), default=0, show_default=True,
                     help="Per-principal produce rate; faster producers are delayed (0 = no limit)."),
        click.option("--quota-fetch-bytes-per-s", type=click.IntRange(0), default=0, show_default=True,
                     help="Per-principal fetch rate; faster consumers are delayed (0 = no limit)."),
        click.option("--quota-requests-per-s", type=click.IntRange(0), default=0, show_default=True,
                     help="Per-principal request rate; faster clients are delayed (0 = no limit)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


SECURITY_PARAMS = ("tls_cert", "tls_key", "tls_ca", "require_client_cert", "token_secret_file", "token_public_key",
                   "token_leeway_s", "super_users", "cluster_principal", "cluster_token_file", "insecure", "quota_produce_bytes_per_s",
                   "quota_fetch_bytes_per_s", "quota_requests_per_s")


def _pop_security(kwargs: dict[str, Any]) -> tuple[ServerSecurity | None, QuotaSettings | None, list[str]]:
    """(ServerSecurity or None, QuotaSettings or None, the argv that repeats them for child
    processes) from the _security_options values, which are removed from kwargs."""
    import os

    from dmq.proto.security.settings import SecurityConfigError, ServerSecurity
    from dmq.proto.server.security.quotas import QuotaSettings, Rates

    v = {k: kwargs.pop(k) for k in SECURITY_PARAMS}
    argv: list[str] = []
    for name in SECURITY_PARAMS:
        value, flag = v[name], "--" + name.replace("_", "-")
        if isinstance(value, bool):
            argv += [flag] if value else []
        elif name == "token_leeway_s":
            argv += [flag, str(value)] if value != 30 else []  # 0 is a setting here, not "unset"
        elif value not in (None, "", 0) and not (name == "cluster_principal" and value == "dmq-cluster"):
            argv += [flag, str(value)]

    def read(path: str | None, env: str) -> str | None:
        if path is not None:
            return pathlib.Path(path).read_text(encoding="utf-8").strip()
        return os.environ.get(env) or None

    try:
        security = ServerSecurity(
            tls_certfile=v["tls_cert"], tls_keyfile=v["tls_key"], tls_cafile=v["tls_ca"],
            require_client_cert=v["require_client_cert"],
            token_secret=read(v["token_secret_file"], "DMQ_TOKEN_SECRET"),
            token_public_key=v["token_public_key"],
            super_users=frozenset(u.strip() for u in v["super_users"].split(",") if u.strip()),
            cluster_principal=v["cluster_principal"],
            cluster_token=read(v["cluster_token_file"], "DMQ_CLUSTER_TOKEN"),
            insecure=v["insecure"],
            token_leeway_s=v["token_leeway_s"],
        )
        security.cluster_client()  # the nodes' own credentials: refused now rather than at the first call
    except (SecurityConfigError, OSError) as e:
        raise click.UsageError(str(e)) from None
    rates = Rates(v["quota_produce_bytes_per_s"], v["quota_fetch_bytes_per_s"], v["quota_requests_per_s"])
    quotas = QuotaSettings(default=rates) if not rates.unlimited else None
    plain = not security.tls and not security.authenticates and not security.insecure
    return (None if plain else security), quotas, argv


def _check_flush_interval(flush: str) -> None:
    """--flush-interval-ms is only read by --flush interval: given with fsync it would be silently
    ignored, and the operator would believe the log is flushed on that period."""
    source = click.get_current_context().get_parameter_source("flush_interval_ms")
    if flush != "interval" and source not in (None, click.core.ParameterSource.DEFAULT):
        raise click.UsageError(f"--flush-interval-ms is only used with --flush interval (the flush policy is {flush})")


# The default is coordinator.controller.sessions.DEFAULT_BROKER_SESSION_TIMEOUT_MS (a test checks), kept
# literal so that the CLI does not import the coordinator to show its help.
def _broker_session_option(f: F) -> F:
    return click.option(
        "--broker-session-timeout-ms", type=click.IntRange(100), default=6_000, show_default=True,
        help="A broker that has not heartbeated for this long is declared dead (clients stop waiting on it).",
    )(f)


def _principal_limit_options(f: F) -> F:
    """Topics and partitions one principal may create (the coordinator's; 0 = no limit)."""
    f = click.option("--max-topics-per-principal", type=click.IntRange(0), default=0, show_default=True,
                     help="Topics one principal may have created; super-users and the cluster principal are "
                          "exempt, and with security off no limit applies (0 = no limit).")(f)
    f = click.option("--max-partitions-per-principal", type=click.IntRange(0), default=0, show_default=True,
                     help="Partitions of the topics one principal created, however added (0 = no limit).")(f)
    return f


def _principal_limits(max_topics: int, max_partitions: int) -> tuple[PrincipalLimits | None, list[str]]:
    """(PrincipalLimits or None, the argv that repeats them for the coordinator child process)."""
    from dmq.coordinator.principal_limits import PrincipalLimits

    if not (max_topics or max_partitions):
        return None, []
    return (PrincipalLimits(max_topics=max_topics, max_partitions=max_partitions),
            ["--max-topics-per-principal", str(max_topics), "--max-partitions-per-principal", str(max_partitions)])


def _subscription_from_option(f: F) -> F:
    return click.option(
        "--default-subscription-from", "default_subscription_from", default=None, metavar="TIME", show_default="none",
        help="With --default-subscription-mode timestamp (and only then): the time a new group starts from, "
             "ISO 8601 (2024-05-01T12:00:00Z; no zone = local time) or epoch milliseconds.",
    )(f)


def _default_subscription_from_ms(mode: str, text: str | None) -> int | None:
    """The server default's start time, checked at start: a default the server cannot honour
    would otherwise fail every consumer that names no mode, long after the server started."""
    from dmq.client.cli._parse import parse_datetime_ms

    if mode != "timestamp":
        if text is not None:
            raise click.UsageError(
                f"--default-subscription-from is only used with --default-subscription-mode timestamp (the mode is {mode})"
            )
        return None
    if text is None:
        raise click.UsageError(
            "--default-subscription-mode timestamp needs --default-subscription-from TIME "
            "(ISO 8601 or epoch ms): the time new groups start from"
        )
    from_ms = parse_datetime_ms(text, param_hint="--default-subscription-from")
    if from_ms <= 0:
        raise click.BadParameter(f"{text!r} must be after 1970-01-01", param_hint="--default-subscription-from")
    return from_ms


@click.command("server")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on and advertise.")
@click.option("--port", type=click.IntRange(0, 65535), default=9091, show_default=True,
              help="Port of the coordinator (and of the broker, with one broker); 0 picks a free port (printed).")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=pathlib.Path), default=pathlib.Path("dmq-data"),
              show_default=True, help="Where logs, offsets and metadata are kept.")
@click.option("--brokers", type=click.IntRange(1, 64), default=1, show_default=True,
              help="1: coordinator and broker in this process on one port. N>1: a coordinator and N broker processes.")
@click.option("--coordinators", type=click.IntRange(2, MAX_COORDINATORS), default=None, show_default="one, on SQLite",
              help="M>=2: a local high-availability cluster: an etcd started in --data-dir/etcd, M coordinator "
                   "processes on it (one active, the others standing by) on ports PORT..PORT+M-1, and the "
                   "brokers given all of them.")
@click.option("--lease-ttl-s", type=click.IntRange(2, 300), default=None, show_default="5",
              help="With --coordinators: the leadership lease; a standby takes over within about this long of "
                   "the active coordinator's death.")
@click.option("--default-subscription-mode", type=SUBSCRIPTION_MODES, default="all", show_default=True,
              help="Where a new group starts when its consumers name no mode: all (log start), new (log end) "
                   "or timestamp (--default-subscription-from).")
@_subscription_from_option
@click.option("--log-level", type=LOG_LEVELS, default="info", show_default=True,
              help="Least severe log lines to print (structlog: console lines in a terminal, JSON otherwise).")
@_storage_options
@_broker_session_option
@_security_options
@_principal_limit_options
@_metrics_option(str(DEFAULT_METRICS_PORT), "The metrics endpoint (with --brokers N: the coordinator's; broker i "
                 "gets PORT+1+i; with --coordinators M: coordinator i PORT+i, broker i PORT+M+i).",
                 envvar="DMQ_METRICS_PORT")
def server_cmd(host: str, port: int, data_dir: pathlib.Path, brokers: int, coordinators: int | None,
               lease_ttl_s: int | None, default_subscription_mode: str,
               default_subscription_from: str | None, log_level: str, flush: str, flush_interval_ms: int,
               segment_bytes: int, retention_ms: int, retention_bytes: int, broker_session_timeout_ms: int,
               max_topics_per_principal: int, max_partitions_per_principal: int, metrics_port: int | None,
               metrics_max_partition_series: int, **security_options: Any) -> None:
    """Run DMQ for development: a coordinator and broker(s), data under --data-dir.

    Security is off by default, on 127.0.0.1; see README "Securing a cluster"."""
    security, quotas, security_argv = _pop_security(security_options)
    limits, limits_argv = _principal_limits(max_topics_per_principal, max_partitions_per_principal)
    from_ms = _default_subscription_from_ms(default_subscription_mode, default_subscription_from)
    _check_metrics_series(metrics_port)
    _check_flush_interval(flush)
    if lease_ttl_s is not None and coordinators is None:
        raise click.BadParameter("only with --coordinators M (several coordinators elect one through it)",
                                 param_hint="--lease-ttl-s")
    configure_logging(log_level)
    if brokers > 1 or coordinators is not None:
        storage = _storage_argv(flush, flush_interval_ms, segment_bytes, retention_ms, retention_bytes)
        _run_process_cluster(host, port, data_dir, brokers, default_subscription_mode, log_level, storage, from_ms,
                             broker_session_timeout_ms=broker_session_timeout_ms, security_argv=security_argv,
                             coordinator_argv=limits_argv, metrics_port=metrics_port,
                             coordinators=coordinators or 1, lease_ttl_s=lease_ttl_s)
        return
    from dmq.client.cli.runner import ClusterOptions, run_embedded

    options = ClusterOptions(
        data_dir=data_dir,
        host=host,
        port=port,
        log_config=_log_config(flush, flush_interval_ms, segment_bytes, retention_ms, retention_bytes),
        default_subscription_mode=default_subscription_mode,
        broker_session_timeout_ms=broker_session_timeout_ms,
        coordinator_kwargs={"default_subscription_from_ms": from_ms},
        security=security,
        quotas=quotas,
        principal_limits=limits,
        metrics_port=metrics_port,
        max_partition_series=metrics_max_partition_series,
    )

    def ready(cluster: LocalCluster) -> None:
        metrics = "".join(f"  metrics at {e.url}\n" for e in cluster.metrics_endpoints)
        click.echo(
            f"DMQ is running: coordinator and broker on {cluster.bootstrap}, data in {data_dir.resolve()}\n{metrics}"
            f"  connect with bootstrap=\"{cluster.bootstrap}\", e.g.  dmq --bootstrap {cluster.bootstrap} topics list\n"
            f"  stop with Ctrl-C",
            err=True,
        )

    try:
        asyncio.run(run_embedded(options, ready))
    except (OSError, ValueError) as e:  # a busy port; security settings refused (SecurityConfigError)
        raise click.ClickException(str(e)) from None


def _storage_argv(flush: str, flush_interval_ms: int, segment_bytes: int, retention_ms: int,
                  retention_bytes: int) -> list[str]:
    """The storage options again, for `dmq broker` children: every one of them, as given
    (--flush-interval-ms only with --flush interval, the one policy that reads it)."""
    interval = ["--flush-interval-ms", str(flush_interval_ms)] if flush == "interval" else []
    return ["--flush", flush, *interval, "--segment-bytes", str(segment_bytes),
            "--retention-ms", str(retention_ms), "--retention-bytes", str(retention_bytes)]


CHILD_STOP_TIMEOUT_S = 10.0  # each child stops cleanly well within this (see serve_until_signalled)
_POLL_S = 0.2
# A member that dies is restarted after RESTART_BACKOFF_S, doubled for each death in a row that
# came within STABLE_S of its start, up to RESTART_BACKOFF_MAX_S. After QUICK_DEATHS_MAX such
# deaths in a row it cannot run here (its port or directory taken, a broken disk): the cluster
# is stopped and the command exits 1 naming it, as a supervisor above would want to know.
RESTART_BACKOFF_S = 0.5
RESTART_BACKOFF_MAX_S = 10.0
STABLE_S = 30.0
QUICK_DEATHS_MAX = 5
# `dmq server --brokers N --port 0` waits this long for the coordinator to say its port (a child
# importing grpc on a loaded machine takes seconds).
COORDINATOR_START_TIMEOUT_S = 60.0


class _Member:
    """One child of `dmq server --brokers N`: its command line, its process (None while it
    waits to be restarted) and its deaths in a row. `log_path`: its output goes there instead of
    this process's stderr; `own_session`: not in this process's group, so a Ctrl-C in the terminal
    does not reach it and it is stopped when the parent says (etcd: after the coordinators)."""

    def __init__(self, name: str, argv: list[str], log_path: pathlib.Path | None = None,
                 own_session: bool = False) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.own_session = own_session
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.restart_at = 0.0
        self.quick_deaths = 0

    def __repr__(self) -> str:
        pid = None if self.proc is None else self.proc.pid
        return f"<_Member {self.name} pid={pid} quick_deaths={self.quick_deaths}>"

    def start(self) -> None:
        if self.log_path is None:
            self.proc = subprocess.Popen(self.argv, start_new_session=self.own_session)
        else:
            with open(self.log_path, "ab") as log_file:
                self.proc = subprocess.Popen(self.argv, stdout=log_file, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=self.own_session)
        self.started_at = time.monotonic()

    def reap(self, now: float) -> str | None:
        """If the process has exited: how (and it is forgotten, to be restarted), else None."""
        if self.proc is None or self.proc.poll() is None:
            return None
        status = f"{self.name} (pid {self.proc.pid}) exited with {_exit_status(self.proc.returncode)}"
        self.quick_deaths = self.quick_deaths + 1 if now - self.started_at < STABLE_S else 1
        self.proc = None
        self.restart_at = now + min(RESTART_BACKOFF_MAX_S, RESTART_BACKOFF_S * 2 ** (self.quick_deaths - 1))
        return status


def _start_etcd_member(data_dir: pathlib.Path) -> tuple[_Member, str]:
    """The HA cluster's etcd, started and healthy, in data_dir/etcd (its data kept from one run to
    the next), as a member (restarted on the same ports should it die), and its client endpoint."""
    from dmq.client.cli._etcd import start_etcd

    try:
        (etcd,) = start_etcd(data_dir / "etcd", own_session=True)
    except RuntimeError as e:  # no binary; it would not start or stay up
        raise click.ClickException(f"etcd: {e}") from None
    member = _Member("etcd", etcd.argv, etcd.log_path, own_session=True)
    member.proc = etcd.process
    member.started_at = time.monotonic()
    return member, etcd.endpoint


def _run_process_cluster(host: str, port: int, data_dir: pathlib.Path, brokers: int, mode: str, log_level: str,
                         storage: list[str], from_ms: int | None = None, *,
                         broker_session_timeout_ms: int | None = None, security_argv: list[str] | None = None,
                         coordinator_argv: list[str] | None = None, metrics_port: int | None = None,
                         coordinators: int = 1, lease_ttl_s: int | None = None) -> None:
    """Coordinator processes and N broker processes; SIGINT/SIGTERM stop them all cleanly.

    One coordinator: on SQLite in data_dir/coordinator. Several (`coordinators` > 1): an etcd
    process in data_dir/etcd first, then coordinator i in data_dir/coordinator-i on port PORT+i,
    all on that etcd and electing one active; the brokers are given every coordinator address,
    and etcd is stopped last. A member that dies (killed, crashed) is restarted with backoff and
    the others keep running, so a broker (or an active coordinator) killed in a failover demo
    comes back (see RESTART_BACKOFF_S for when it gives up: then the others are stopped and the
    command exits 1 naming it).
    """
    import structlog

    from dmq.client.cli.runner import PortUnavailable, bind_probe
    from dmq.coordinator.controller.leadership import DEFAULT_LEASE_TTL_S
    from dmq.proto.server.dirlock import DataDirLock, DataDirLocked

    log = structlog.get_logger("dmq.client.cli.servers")
    names = ["coordinator"] if coordinators == 1 else [f"coordinator-{i}" for i in range(coordinators)]
    ports = [0 if port == 0 else port + i for i in range(coordinators)]
    if ports[-1] > 65535:
        raise click.BadParameter(f"{coordinators} coordinators take ports {port}..{ports[-1]}: past 65535",
                                 param_hint="--port")
    # One line now rather than a child failing a moment later (each child still takes its own
    # lock and binds its own port: these are only probes).
    try:
        for p in ports:
            bind_probe(host, p)
        for name in names + [f"broker-{i}" for i in range(brokers)]:
            probe = DataDirLock(data_dir / name)
            probe.acquire()
            probe.release()
    except (PortUnavailable, DataDirLocked) as e:
        raise click.ClickException(str(e)) from None
    exe = [sys.executable, "-m", "dmq.client.cli"]
    # --port 0: each coordinator binds a free port and writes it to its file; the brokers are
    # started with the addresses once they are there, and a restarted coordinator binds it again.
    address_files = [data_dir / f"{name}.address" if port == 0 else None for name in names]
    stop = {"signal": 0}

    def handle(signum: int, frame: object) -> None:
        stop["signal"] = signum

    for address_file in address_files:
        if address_file is not None:
            address_file.unlink(missing_ok=True)
    from_args = [] if from_ms is None else ["--default-subscription-from", str(from_ms)]
    session_args = ([] if broker_session_timeout_ms is None
                    else ["--broker-session-timeout-ms", str(broker_session_timeout_ms)])
    signal.signal(signal.SIGINT, handle)
    signal.signal(signal.SIGTERM, handle)
    etcd, etcd_endpoint = _start_etcd_member(data_dir) if coordinators > 1 else (None, "")
    store_args = [] if etcd is None else ["--metadata-store", f"etcd://{etcd_endpoint}",
                                          "--lease-ttl-s", str(lease_ttl_s or DEFAULT_LEASE_TTL_S)]
    members = [_Member(name, exe + ["coordinator", "--host", host, "--port", str(ports[i]),
                                    "--data-dir", str(data_dir / name),
                                    "--default-subscription-mode", mode, *from_args, *session_args,
                                    "--log-level", log_level, *(security_argv or []),
                                    # replicated by default, also for a topic created
                                    # before every broker registered (retried meanwhile)
                                    "--default-replication-factor", str(min(3, brokers)),
                                    *_metrics_argv(metrics_port, i), *(coordinator_argv or []), *store_args,
                                    *([] if etcd is None or not ports[i] else ["--advertise", f"{host}:{ports[i]}"]),
                                    *([] if address_files[i] is None else ["--address-file", str(address_files[i])])])
               for i, name in enumerate(names)]
    if port == 0:
        try:
            for member in members:  # all at once: each takes seconds to import and bind
                member.start()
            for i, (member, address_file) in enumerate(zip(members, address_files)):
                assert address_file is not None
                ports[i] = _await_coordinator_port(member, address_file, stop)
        except BaseException:
            _stop_children({m.name: m.proc for m in members if m.proc is not None})
            if etcd is not None and etcd.proc is not None:
                _stop_children({"etcd": etcd.proc})
            raise
        for member, bound in zip(members, ports):
            member.argv[member.argv.index("--port") + 1] = str(bound)
            if etcd is not None:  # as it advertised itself, so that a restart names the same address
                member.argv += ["--advertise", f"{host}:{bound}"]
    bootstrap = ",".join(f"{host}:{p}" for p in ports)
    # A restarted broker gets a new port (0): it registers its new address under its id.
    members += [_Member(f"broker {i}", exe + ["broker", "--host", host, "--port", "0", "--broker-id", str(i),
                                              "--coordinator", bootstrap,
                                              "--data-dir", str(data_dir / f"broker-{i}"),
                                              "--log-level", log_level, *storage,
                                              *_metrics_argv(metrics_port, coordinators + i), *(security_argv or [])])
                for i in range(brokers)]
    supervised = ([] if etcd is None else [etcd]) + members
    failed: str | None = None
    try:
        for member in members:
            if member.proc is None:  # the coordinators may be running already (--port 0)
                member.start()
        if etcd is None:
            click.echo(f"DMQ cluster: coordinator on {bootstrap}, {brokers} broker processes; "
                       f"bootstrap=\"{bootstrap}\"; a member that dies is restarted; Ctrl-C stops", err=True)
        else:
            click.echo(f"DMQ HA cluster: {coordinators} coordinators on {bootstrap} (one active, the others "
                       f"standing by), their metadata on etcd at {etcd_endpoint} (data in {data_dir.resolve() / 'etcd'}, "
                       f"log {etcd.log_path}), {brokers} broker processes; bootstrap=\"{bootstrap}\"; "
                       f"a member that dies is restarted; Ctrl-C stops", err=True)
        while not stop["signal"] and failed is None:
            now = time.monotonic()
            for member in supervised:
                if stop["signal"]:
                    break  # Ctrl-C reaches the children too: their exits are the stop, not deaths
                if member.proc is None:
                    if now >= member.restart_at:
                        member.start()
                        assert member.proc is not None
                        log.info("cluster member restarted", member=member.name, pid=member.proc.pid)
                    continue
                status = member.reap(now)
                if status is None:
                    continue
                if member.quick_deaths > QUICK_DEATHS_MAX:
                    failed = (f"{status}, its {member.quick_deaths}th exit in a row within {STABLE_S:g}s of "
                              f"starting")
                    break
                log.warning(f"{status}; restarting it", member=member.name,
                            restart_in_s=round(member.restart_at - now, 3), deaths_in_a_row=member.quick_deaths)
            else:
                time.sleep(_POLL_S)
    finally:
        unclean = _stop_children({m.name: m.proc for m in members if m.proc is not None})
        # etcd last: the coordinators revoke their leases and close their watches on it as they stop.
        if etcd is not None and etcd.proc is not None:
            unclean += _stop_children({"etcd": etcd.proc})
    if failed is not None:
        raise click.ClickException(f"{failed}; stopped the rest of the cluster")
    if unclean:
        raise click.ClickException("the cluster did not stop cleanly: " + "; ".join(unclean))


def _await_coordinator_port(coordinator: _Member, address_file: pathlib.Path, stop: dict[str, int]) -> int:
    """Start the coordinator on port 0 and return the port it bound (from its address file)."""
    if coordinator.proc is None:
        coordinator.start()
    assert coordinator.proc is not None
    deadline = time.monotonic() + COORDINATOR_START_TIMEOUT_S
    while not address_file.exists():
        if stop["signal"]:
            raise click.ClickException(f"stopped before the {coordinator.name} listened")
        if coordinator.proc.poll() is not None:
            raise click.ClickException(f"the {coordinator.name} exited with {_exit_status(coordinator.proc.returncode)} "
                                       "before it listened")
        if time.monotonic() > deadline:
            raise click.ClickException(f"the {coordinator.name} did not listen within {COORDINATOR_START_TIMEOUT_S:g}s")
        time.sleep(0.05)
    return int(address_file.read_text().rsplit(":", 1)[1])


def _exit_status(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"code {returncode}"


def _stop_children(children: dict[str, subprocess.Popen[bytes]]) -> list[str]:
    """SIGTERM every live child, wait for all within one shared bound, SIGKILL what remains.

    Returns what did not stop cleanly (killed, or a non-zero exit after SIGTERM)."""
    signalled = {name for name, child in children.items() if child.poll() is None}
    for name in signalled:
        children[name].send_signal(signal.SIGTERM)
    deadline = time.monotonic() + CHILD_STOP_TIMEOUT_S
    unclean = []
    for name, child in children.items():
        try:
            child.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(5)
            unclean.append(f"{name} (pid {child.pid}) did not stop within {CHILD_STOP_TIMEOUT_S:g}s of SIGTERM: killed")
            continue
        # SIGINT from the terminal reaches the children too: both are a requested stop.
        if name in signalled and child.returncode not in (0, -signal.SIGTERM, -signal.SIGINT):
            unclean.append(f"{name} (pid {child.pid}) exited with {_exit_status(child.returncode)} while stopping")
    return unclean


@click.command("coordinator")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on and advertise.")
@click.option("--port", type=click.IntRange(0, 65535), default=9091, show_default=True,
              help="Port clients (--bootstrap) and brokers (--coordinator) connect to; 0 picks a free port.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=pathlib.Path),
              default=pathlib.Path("dmq-data/coordinator"), show_default=True, help="Where the SQLite metadata lives.")
@click.option("--default-subscription-mode", type=SUBSCRIPTION_MODES, default="all", show_default=True,
              help="Where a new group starts when its consumers name no mode: all, new or timestamp "
                   "(--default-subscription-from).")
@_subscription_from_option
@click.option("--log-level", type=LOG_LEVELS, default="info", show_default=True,
              help="Least severe log lines to print (structlog: console lines in a terminal, JSON otherwise).")
@_broker_session_option
@click.option("--default-replication-factor", type=click.IntRange(1, 16), default=None,
              show_default="min(3, live brokers)",
              help="Replicas of each partition of a topic created without a replication_factor; while fewer "
                   "brokers are live, such creations are refused as retriable.")
@_security_options
@_principal_limit_options
@_metrics_option("0", "The coordinator's metrics endpoint.")
@click.option("--metadata-store", default="sqlite", show_default=True,
              metavar="sqlite|etcd://HOST:PORT[,HOST:PORT...][/PREFIX]",
              help="Where the cluster metadata lives: SQLite in --data-dir, or etcd under the key prefix "
                   "/dmq/PREFIX/ (default prefix: default), so several clusters can share one etcd.")
@click.option("--etcd-user", default=None, show_default="none", help="etcd user (etcd's own authentication); with --etcd-password.")
@click.option("--etcd-password", default=None, envvar="DMQ_ETCD_PASSWORD", show_envvar=True, show_default="none",
              help="etcd password; prefer the environment variable (arguments are visible to other users).")
@click.option("--etcd-ca-file", type=click.Path(dir_okay=False, exists=True, path_type=pathlib.Path), default=None,
              show_default="none",
              help="TLS to etcd: the CA certificate (PEM) that signed etcd's certificate.")
@click.option("--etcd-cert-file", type=click.Path(dir_okay=False, exists=True, path_type=pathlib.Path), default=None,
              show_default="none",
              help="Mutual TLS to etcd: this coordinator's certificate (PEM); with --etcd-key-file.")
@click.option("--etcd-key-file", type=click.Path(dir_okay=False, exists=True, path_type=pathlib.Path), default=None,
              show_default="none",
              help="Mutual TLS to etcd: this coordinator's private key (PEM).")
# For `dmq server --brokers N --port 0`: the parent learns the port the coordinator bound here.
@click.option("--address-file", type=click.Path(dir_okay=False, path_type=pathlib.Path), default=None, hidden=True,
              show_default="(none)", help="Write the address this coordinator listens on to this file once it listens.")
@click.option("--advertise", default=None, metavar="HOST:PORT", show_default="--host and the bound port",
              help="The address brokers and clients reach this coordinator at; with etcd, standbys name it "
                   "in their NOT_COORDINATOR answers.")
@click.option("--lease-ttl-s", type=click.IntRange(2, 300), default=None, show_default="5 with --advertise",
              help="With etcd and this or --advertise, several coordinators elect one active through a lease "
                   "of this many seconds: a standby takes over within about this long of the active one's death.")
def coordinator_cmd(host: str, port: int, data_dir: pathlib.Path, default_subscription_mode: str,
                    default_subscription_from: str | None, log_level: str, broker_session_timeout_ms: int,
                    default_replication_factor: int | None,
                    max_topics_per_principal: int, max_partitions_per_principal: int, metrics_port: int | None,
                    metrics_max_partition_series: int, metadata_store: str, etcd_user: str | None, etcd_password: str | None,
                    etcd_ca_file: pathlib.Path | None, etcd_cert_file: pathlib.Path | None,
                    etcd_key_file: pathlib.Path | None, address_file: pathlib.Path | None,
                    advertise: str | None, lease_ttl_s: int | None, **security_options: Any) -> None:
    """Run the coordinator alone: metadata (brokers, topics) and consumer groups. Several on one
    etcd: one is active, the others stand by (--lease-ttl-s)."""
    from dmq.client._cluster import parse_address
    from dmq.coordinator.controller.leadership import DEFAULT_LEASE_TTL_S
    from dmq.coordinator.metastore.base import StoreError
    from dmq.coordinator.metastore.config import make_metadata_store

    try:
        store = make_metadata_store(metadata_store, data_dir, etcd_username=etcd_user, etcd_password=etcd_password,
                                    etcd_ca_file=etcd_ca_file, etcd_cert_file=etcd_cert_file, etcd_key_file=etcd_key_file)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--metadata-store") from None
    if metadata_store.startswith("etcd://"):
        # --advertise or --lease-ttl-s: one of several coordinators, elected; neither: the only
        # coordinator of this etcd prefix, taking control at start as before.
        if advertise is not None or lease_ttl_s is not None:
            lease_ttl_s = lease_ttl_s or DEFAULT_LEASE_TTL_S
    elif lease_ttl_s is not None:
        raise click.BadParameter("only with --metadata-store etcd://… (several coordinators share it)",
                                 param_hint="--lease-ttl-s")
    if advertise is not None:
        try:
            parse_address(advertise)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--advertise") from None
    security, quotas, _argv = _pop_security(security_options)
    limits, _limits_argv = _principal_limits(max_topics_per_principal, max_partitions_per_principal)
    from_ms = _default_subscription_from_ms(default_subscription_mode, default_subscription_from)
    _check_metrics_series(metrics_port)
    configure_logging(log_level)
    from dmq.client.cli.runner import run_coordinator_only

    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        asyncio.run(run_coordinator_only(
            data_dir, host, port, lambda addr: _listening("coordinator", addr, address_file),
            default_subscription_mode=default_subscription_mode,
            default_subscription_from_ms=from_ms,
            broker_session_timeout_ms=broker_session_timeout_ms,
            default_replication_factor=default_replication_factor,
            security=security, quotas=quotas, principal_limits=limits,
            metrics_port=metrics_port, on_metrics=lambda url: click.echo(f"coordinator metrics at {url}", err=True),
            max_partition_series=metrics_max_partition_series,
            metadata_store=store, advertise=advertise, lease_ttl_s=lease_ttl_s,
            on_active=lambda epoch: click.echo(f"coordinator active (controller epoch {epoch})", err=True),
        ))
    except (OSError, ValueError) as e:  # a busy port; security settings refused (SecurityConfigError)
        raise click.ClickException(str(e)) from None
    except StoreError as e:  # etcd unreachable or refusing; a SQLite file of a newer schema
        raise click.ClickException(f"metadata store: {e}") from None


def _listening(name: str, address: str, address_file: pathlib.Path | None) -> None:
    click.echo(f"{name} listening on {address}", err=True)
    if address_file is not None:  # whole or absent for its reader: written aside, then renamed
        part = address_file.with_name(address_file.name + ".part")
        part.write_text(address)
        part.replace(address_file)


@click.command("broker")
@click.option("--coordinator", "coordinator", required=True, metavar="HOST:PORT[,HOST:PORT...]",
              help="The coordinator to register with; several (one active, the others standing by): the "
                   "broker finds the active one and follows it when it changes.")
@click.option("--broker-id", type=click.IntRange(0), required=True, help="This broker's stable id.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on and advertise.")
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True, help="0 picks a free port.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=pathlib.Path), required=True,
              help="Where this broker's logs and committed offsets live.")
@click.option("--log-level", type=LOG_LEVELS, default="info", show_default=True,
              help="Least severe log lines to print (structlog: console lines in a terminal, JSON otherwise).")
@click.option("--rack", default="", show_default="(none)",
              help="Rack / zone label: a partition's replicas are spread over racks.")
@click.option("--replica-lag-time-max-ms", type=click.IntRange(1), default=REPLICA_LAG_TIME_MAX_MS_DEFAULT,
              show_default=True,
              help="A follower not caught up with its leader for this long leaves the in-sync set.")
@click.option("--replica-ack-timeout-ms", type=click.IntRange(1), default=REPLICA_ACK_TIMEOUT_MS_DEFAULT,
              show_default=True,
              help="An acks=all produce waits at most this long for the in-sync replicas (then fails, retriable).")
@_storage_options
@_security_options
@_metrics_option("0", "This broker's metrics endpoint.")
def broker_cmd(coordinator: str, broker_id: int, host: str, port: int, data_dir: pathlib.Path, log_level: str,
               rack: str, replica_lag_time_max_ms: int, replica_ack_timeout_ms: int,
               flush: str, flush_interval_ms: int, segment_bytes: int, retention_ms: int, retention_bytes: int,
               metrics_port: int | None, metrics_max_partition_series: int, **security_options: Any) -> None:
    """Run one storage broker that registers with --coordinator."""
    security, quotas, _argv = _pop_security(security_options)
    _check_metrics_series(metrics_port)
    _check_flush_interval(flush)
    configure_logging(log_level)
    import grpc

    from dmq.client.cli.runner import run_broker_only

    try:
        asyncio.run(run_broker_only(
            data_dir, host, port, broker_id, coordinator,
            lambda addr: click.echo(f"broker {broker_id} listening on {addr}", err=True),
            log_config=_log_config(flush, flush_interval_ms, segment_bytes, retention_ms, retention_bytes),
            security=security, quotas=quotas, rack=rack,
            replica_lag_time_max_ms=replica_lag_time_max_ms, replica_ack_timeout_ms=replica_ack_timeout_ms,
            metrics_port=metrics_port,
            on_metrics=lambda url: click.echo(f"broker {broker_id} metrics at {url}", err=True),
            max_partition_series=metrics_max_partition_series,
        ))
    except (OSError, ValueError) as e:  # a busy port; security settings refused (SecurityConfigError)
        raise click.ClickException(str(e)) from None
    except grpc.RpcError as e:  # the coordinator answered the registration with a refusal
        details = e.details() if hasattr(e, "details") else str(e)
        raise click.ClickException(f"the coordinator at {coordinator} refused broker {broker_id}: {details}") from None
