"""ConsumerConfig: every DMQConsumer setting, validated when it is built.

Names are the snake_case of the seed's settings (DESIGN.md "Client"), units last. A bad value
raises ``InvalidConfigError`` whose message names the setting and says what to change, before any
connection is made.
"""

from __future__ import annotations

import datetime as _dt
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from dmq.client._security import SECURITY_SETTINGS, client_security
from dmq.client._settings import BOOTSTRAP_NAMES, bootstrap_address, reject_unknown
from dmq.client.errors import InvalidConfigError
from dmq.proto import limits
from dmq.proto.grpc_options import MAX_FETCH_RESPONSE_BYTES
from dmq.proto.security.settings import ClientSecurity

SUBSCRIPTION_MODES = ("all", "new", "timestamp")
# kafka-python's auto_offset_reset, mapped onto where a new group starts (DESIGN.md "Subscription
# modes"): "earliest" reads the whole log, "latest" only what is produced after the group appears.
AUTO_OFFSET_RESETS = {"earliest": "all", "latest": "new"}

# The broker refuses a fetch that waits longer (broker/service.py MAX_FETCH_WAIT_MS).
MAX_FETCH_WAIT_MS = 60_000
# gRPC message limit the servers and channels are built with (proto/grpc_options.py).
_DEFAULT_FETCH_MAX_BYTES = 50 * 1024 * 1024

Deserializer = Callable[[bytes], Any]


@dataclass
class ConsumerConfig:
    metadata_service_url: str | None = None
    """The coordinator (``dmq server``) address, ``host:port``; brokers are found through it.
    The original name of ``bootstrap_servers`` (give one of them)."""
    group_id: str | None = None
    """The application's group name; per topic the group is ``G_<topic>_<group_id>``."""
    heartbeat_interval_ms: int = 3_000
    session_timeout_ms: int = 10_000
    max_poll_records: int = 500
    enable_auto_commit: bool = True
    auto_commit_interval_ms: int = 5_000
    max_poll_interval_ms: int = 300_000
    subscription_mode: str | None = None
    """Where a new group starts: ``all`` (log start), ``new`` (only what is produced after the
    group first subscribed) or ``timestamp`` (``subscription_from``). None = the server's
    default. Recorded once, when the group first appears: later subscribers get the recorded one."""
    subscription_from: int | _dt.datetime | None = None
    """For ``timestamp``: epoch milliseconds, or an aware datetime."""
    fetch_max_wait_ms: int = 500
    fetch_min_bytes: int = 1
    fetch_max_bytes: int = _DEFAULT_FETCH_MAX_BYTES
    max_partition_fetch_bytes: int = 1024 * 1024
    client_id: str = "dmq-consumer"
    request_timeout_ms: int = 30_000
    """Deadline of one RPC (fetches get fetch_max_wait_ms on top)."""
    retry_backoff_ms: int = 100
    check_crcs: bool = True
    bootstrap_servers: str | list[str] | None = None
    """The coordinator's ``host:port``: a string, ``"h:p,h:p"`` or a list (alternatives tried in
    order at start-up). After validation it holds the address in use, as does metadata_service_url."""
    bootstrap: str | list[str] | None = None
    """Another accepted name of bootstrap_servers (the Producer's original one)."""
    auto_offset_reset: str | None = None
    """kafka-python's name for the start of a new group: ``earliest`` (= subscription_mode
    ``all``) or ``latest`` (= ``new``). Also where manually assign()ed partitions without a
    committed offset start (default earliest)."""
    key_deserializer: Deserializer | None = None
    """Applied to every record's key (bytes, not None) before poll() returns it."""
    value_deserializer: Deserializer | None = None
    """Applied to every record's value (bytes, not None) before poll() returns it."""
    metadata_max_age_ms: int = 300_000
    """How often a pattern subscription (subscribe(pattern=...)) lists the topics again."""
    consumer_timeout_ms: float = float("inf")
    """``for record in consumer`` ends (StopIteration) once no record came for this long
    (kafka-python's setting; default: never)."""
    security_protocol: str | None = None
    """"PLAINTEXT" or "SSL" (implied by any ssl_* setting); see dmq.client._security."""
    ssl_cafile: str | None = None
    """The CA of the servers' certificates (default: $DMQ_SSL_CAFILE)."""
    ssl_certfile: str | None = None
    """A client certificate, for clusters with mutual TLS (default: $DMQ_SSL_CERTFILE)."""
    ssl_keyfile: str | None = None
    """The client certificate's key (default: $DMQ_SSL_KEYFILE)."""
    token: str | None = field(default=None, repr=False)
    """A signed token naming the principal (default: $DMQ_TOKEN)."""
    _from_ms: int | None = field(default=None, init=False, repr=False, compare=False)
    security: ClientSecurity | None = field(default=None, init=False, repr=False, compare=False)
    """TLS and token settled by __post_init__ from the five settings above and the environment."""
    address: str = field(default="", init=False, repr=False, compare=False)
    """The bootstrap address(es) __post_init__ settled on: a str, where the settings it came from are optional."""

    def __post_init__(self) -> None:
        problems = list(self._problems())
        if problems:
            raise InvalidConfigError("invalid ConsumerConfig: " + "; ".join(problems))
        self.security = client_security({n: getattr(self, n) for n in SECURITY_SETTINGS})
        address = bootstrap_address({n: getattr(self, n) for n in BOOTSTRAP_NAMES}, "ConsumerConfig")
        # The address in use (the first reachable of several); `address` keeps them all, for the
        # Cluster to follow the active coordinator among them.
        self.metadata_service_url = self.bootstrap_servers = address.split(",")[0]
        self.address = address
        self.bootstrap = None
        if self.auto_offset_reset is not None and self.subscription_mode is None:
            self.subscription_mode = AUTO_OFFSET_RESETS[self.auto_offset_reset]

    @property
    def start_latest(self) -> bool:
        """Manually assigned partitions with nothing committed start at the log end."""
        return self.auto_offset_reset == "latest"

    def _problems(self) -> list[str]:
        out: list[str] = []
        try:
            bootstrap_address({n: getattr(self, n) for n in BOOTSTRAP_NAMES}, "ConsumerConfig", probe=False)
        except InvalidConfigError as e:
            out.append(str(e))
        if not isinstance(self.group_id, str) or not self.group_id:
            out.append("group_id must be a non-empty string")
        for f in fields(self):
            if not f.init:
                continue
            value = getattr(self, f.name)
            if f.name.endswith(("_ms", "_bytes", "_records")) and f.name not in ("subscription_from",
                                                                                   "consumer_timeout_ms"):
                if isinstance(value, bool) or not isinstance(value, int):
                    out.append(f"{f.name} must be an int, got {type(value).__name__}")
        if out:
            return out
        positive = (
            "heartbeat_interval_ms",
            "session_timeout_ms",
            "max_poll_records",
            "auto_commit_interval_ms",
            "max_poll_interval_ms",
            "fetch_max_bytes",
            "max_partition_fetch_bytes",
            "request_timeout_ms",
            "metadata_max_age_ms",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                out.append(f"{name} must be > 0, got {getattr(self, name)}")
        timeout = self.consumer_timeout_ms
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
            out.append(f"consumer_timeout_ms must be milliseconds >= 0 (float('inf'): iterate forever), got {timeout!r}")
        for name in ("fetch_min_bytes", "retry_backoff_ms"):
            if getattr(self, name) < 0:
                out.append(f"{name} must be >= 0, got {getattr(self, name)}")
        # The group coordinator refuses a JoinGroup outside these (dmq.proto.limits): checked here,
        # a bad value fails when the config is built instead of at the first subscribe.
        for name, low, high in (
            ("session_timeout_ms", limits.SESSION_TIMEOUT_MS_MIN, limits.SESSION_TIMEOUT_MS_MAX),
            ("max_poll_interval_ms", limits.MAX_POLL_INTERVAL_MS_MIN, limits.MAX_POLL_INTERVAL_MS_MAX),
        ):
            if getattr(self, name) > 0 and not low <= getattr(self, name) <= high:
                out.append(f"{name} must be within {low}..{high} ms (the group coordinator's limits), "
                           f"got {getattr(self, name)}")
        if not 0 <= self.fetch_max_wait_ms <= MAX_FETCH_WAIT_MS:
            out.append(f"fetch_max_wait_ms must be within 0..{MAX_FETCH_WAIT_MS}, got {self.fetch_max_wait_ms}")
        if self.heartbeat_interval_ms > 0 and self.heartbeat_interval_ms * 3 > self.session_timeout_ms:
            out.append(
                f"heartbeat_interval_ms ({self.heartbeat_interval_ms}) must be at most a third of "
                f"session_timeout_ms ({self.session_timeout_ms}), so two heartbeats can be lost "
                "before the session expires: lower heartbeat_interval_ms or raise session_timeout_ms"
            )
        if self.fetch_max_wait_ms >= self.request_timeout_ms:
            out.append(
                f"fetch_max_wait_ms ({self.fetch_max_wait_ms}) must be below request_timeout_ms "
                f"({self.request_timeout_ms}), or every idle fetch would time out"
            )
        if self.fetch_max_bytes > MAX_FETCH_RESPONSE_BYTES:
            # Brokers refuse a Fetch asking for more (broker/service.py): every poll would come
            # back empty.
            out.append(f"fetch_max_bytes must be at most {MAX_FETCH_RESPONSE_BYTES}, got {self.fetch_max_bytes}")
        if self.max_partition_fetch_bytes > self.fetch_max_bytes:
            out.append(
                f"max_partition_fetch_bytes ({self.max_partition_fetch_bytes}) must not exceed "
                f"fetch_max_bytes ({self.fetch_max_bytes})"
            )
        if not isinstance(self.client_id, str) or not self.client_id or len(self.client_id) > 255:
            out.append("client_id must be a string of 1..255 characters")
        reset = self.auto_offset_reset
        if reset is not None and reset not in AUTO_OFFSET_RESETS:
            out.append(f"auto_offset_reset must be 'earliest' or 'latest', got {reset!r}")
        elif reset is not None and self.subscription_mode not in (None, AUTO_OFFSET_RESETS[reset]):
            out.append(
                f"auto_offset_reset={reset!r} means subscription_mode={AUTO_OFFSET_RESETS[reset]!r}, but "
                f"subscription_mode={self.subscription_mode!r} was given too: give one of them"
            )
        for name in ("key_deserializer", "value_deserializer"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                out.append(f"{name} must be a callable taking bytes, got {type(getattr(self, name)).__name__}")
        mode = self.subscription_mode
        if mode is not None and mode not in SUBSCRIPTION_MODES:
            out.append(f"subscription_mode must be one of {', '.join(SUBSCRIPTION_MODES)} or None, got {mode!r}")
        elif mode == "timestamp":
            try:
                self._from_ms = _to_epoch_ms(self.subscription_from)
            except (TypeError, ValueError) as e:
                out.append(f"subscription_from: {e}")
        elif self.subscription_from is not None:
            out.append("subscription_from is only used with subscription_mode='timestamp'")
        return out

    @property
    def subscription_from_ms(self) -> int | None:
        return self._from_ms


def _to_epoch_ms(value: object) -> int:
    if value is None:
        raise ValueError("subscription_mode='timestamp' needs subscription_from (epoch ms or an aware datetime)")
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            raise ValueError("a datetime must be timezone-aware (e.g. datetime.now(timezone.utc))")
        value = int(value.timestamp() * 1000)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"must be epoch milliseconds (int) or an aware datetime, got {type(value).__name__}")
    # 0 means "no time" on the wire and the coordinator refuses it for mode timestamp; the log
    # start is subscription_mode='all'.
    if value <= 0:
        raise ValueError(f"must be > 0 epoch milliseconds (for the log start use subscription_mode='all'), got {value}")
    return value


SETTINGS = frozenset(f.name for f in fields(ConsumerConfig) if f.init)
_dataclass_init = ConsumerConfig.__init__


def _init(self: ConsumerConfig, *args: Any, **settings: Any) -> None:
    # The dataclass's own __init__ answers a misspelt setting with a bare TypeError; this names
    # it and the settings close to it (UnknownSettingError is a TypeError too).
    reject_unknown("ConsumerConfig", {k: v for k, v in settings.items() if k not in SETTINGS}, SETTINGS)
    _dataclass_init(self, *args, **settings)


_init.__doc__ = _dataclass_init.__doc__
_init.__signature__ = inspect.signature(_dataclass_init)  # type: ignore[attr-defined]
ConsumerConfig.__init__ = _init  # type: ignore[method-assign]
