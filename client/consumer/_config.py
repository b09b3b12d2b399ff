"""ConsumerConfig: every DMQConsumer setting, validated when it is built.

Names are the snake_case of the seed's settings (DESIGN.md "Client"), units last. A bad value
raises ``InvalidConfigError`` whose message names the setting and says what to change, before any
connection is made.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field, fields

from dmq.client._cluster import parse_address as _parse_address
from dmq.client.errors import InvalidConfigError
from dmq.proto import limits
from dmq.proto.grpc_options import MAX_FETCH_RESPONSE_BYTES

SUBSCRIPTION_MODES = ("all", "new", "timestamp")

# The broker refuses a fetch that waits longer (broker/service.py MAX_FETCH_WAIT_MS).
MAX_FETCH_WAIT_MS = 60_000
# gRPC message limit the servers and channels are built with (proto/grpc_options.py).
_DEFAULT_FETCH_MAX_BYTES = 50 * 1024 * 1024


def parse_address(url: str) -> str:
    """``host:port``, also from ``dmq://host:port`` (a URL-looking value is a common slip)."""
    address = url.strip()
    if "://" in address:
        address = address.split("://", 1)[1].rstrip("/")
    try:
        return _parse_address(address)
    except ValueError as e:
        raise InvalidConfigError(f"metadata_service_url: {e}") from e


@dataclass
class ConsumerConfig:
    metadata_service_url: str
    """The coordinator (``dmq server``) address, ``host:port``; brokers are found through it."""
    group_id: str
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
    _from_ms: int | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        problems = list(self._problems())
        if problems:
            raise InvalidConfigError("invalid ConsumerConfig: " + "; ".join(problems))
        self.metadata_service_url = parse_address(self.metadata_service_url)

    def _problems(self) -> list[str]:
        out: list[str] = []
        if not isinstance(self.metadata_service_url, str) or not self.metadata_service_url.strip():
            out.append("metadata_service_url must be the coordinator's host:port")
        else:
            try:
                parse_address(self.metadata_service_url)
            except InvalidConfigError as e:
                out.append(str(e))
        if not isinstance(self.group_id, str) or not self.group_id:
            out.append("group_id must be a non-empty string")
        for f in fields(self):
            if not f.init:
                continue
            value = getattr(self, f.name)
            if f.name.endswith(("_ms", "_bytes", "_records")) and f.name != "subscription_from":
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
        )
        for name in positive:
            if getattr(self, name) <= 0:
                out.append(f"{name} must be > 0, got {getattr(self, name)}")
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
