"""Cluster membership: the broker registry and the brokers' sessions (Kafka's cluster control).

A broker is alive while it has registered with this coordinator process and its last heartbeat is
at most broker_session_timeout_ms old (clock_ms is injected for tests). Liveness is computed from
the clock on every read, so metadata answers leader_alive=false as soon as the session has
elapsed, not when the node's monitor next runs. The default session is short
(DEFAULT_BROKER_SESSION_TIMEOUT_MS, 6 s) because clients route around a dead broker only once it
is declared dead; brokers are told to heartbeat four times per session. Brokers known from the
store but not yet registered since start are not alive; their heartbeats are answered with
reregister=true, as are those of a broker whose session expired, so every (re-)registration hands
the broker its full placement and repairs any CreatePartitions call that was lost
(dmq.coordinator.controller.controller runs what a registration, a shutdown or an expiry changes
for the partitions). Sessions themselves: dmq.coordinator.controller.sessions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import structlog

from dmq.coordinator.broker_pool import BrokerPool
from dmq.coordinator.controller.sessions import DEFAULT_BROKER_SESSION_TIMEOUT_MS, restart_after_pause, wall_clock_ms
from dmq.coordinator.controller.sessions import BrokerSession as _BrokerState
from dmq.coordinator.metadata_errors import InvalidMetadataRequestError, MetadataError
from dmq.coordinator.metastore.base import BrokerRecord, MetadataStore
from dmq.coordinator.pause_watch import PauseWatch
from dmq.coordinator.store_writes import complete_even_if_cancelled, coordinator_disk_full
from dmq.proto import error_details
from dmq.proto.server.domain_errors import ErrorCode

log = structlog.get_logger(__name__)

HOST_MAX_CHARS = 253  # a DNS name's limit
BROKER_ID_MAX = 2**31 - 1
RACK_MAX_CHARS = 64


class BrokerIdTakenError(MetadataError):
    # FAILED_PRECONDITION: another, live broker holds the id. A broker restarted at a new address
    # retries until the old registration's session expires (dmq.broker.node).
    code = ErrorCode.FAILED_PRECONDITION
    reason = error_details.BROKER_ID_TAKEN


def broker_address(host: str, port: int) -> str:
    """ "host:port", with IPv6 literals bracketed as gRPC expects."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


class BrokerMembership:
    """The brokers known to the cluster and their sessions. `partitions_led(broker_id)` counts what
    a broker leads, for the log lines of its registration and expiry."""

    def __init__(
        self,
        store: MetadataStore,
        broker_pool: BrokerPool,
        *,
        partitions_led: Callable[[int], int],
        broker_session_timeout_ms: int = DEFAULT_BROKER_SESSION_TIMEOUT_MS,
        clock_ms: Callable[[], int] = wall_clock_ms,
        pause_watch: PauseWatch | None = None,
    ) -> None:
        if broker_session_timeout_ms <= 0:
            raise ValueError(f"broker_session_timeout_ms must be > 0, got {broker_session_timeout_ms}")
        self.store = store
        self.broker_pool = broker_pool
        self.partitions_led = partitions_led
        self.broker_session_timeout_ms = broker_session_timeout_ms
        self.clock_ms = clock_ms
        # Armed by the node's monitor; a pause shorter than half a session cannot expire a broker
        # that heartbeats four times per session.
        self.pause_watch = pause_watch or PauseWatch(max(1, broker_session_timeout_ms // 2))
        self._brokers: dict[int, _BrokerState] = {}

    def __len__(self) -> int:
        return len(self._brokers)

    def load(self, records: list[BrokerRecord], now_ms: int) -> None:
        """The brokers known from the store: each is awaited for one session from now_ms."""
        self._brokers = {b.broker_id: _BrokerState(b, last_heartbeat_ms=now_ms, awaited=True) for b in records}

    @property
    def heartbeat_interval_ms(self) -> int:
        """What brokers are told: several heartbeats fit in one session, so one lost beat is harmless."""
        return max(10, self.broker_session_timeout_ms // 4)

    # -- reads -------------------------------------------------------------------------------------

    def broker(self, broker_id: int) -> BrokerRecord | None:
        state = self._brokers.get(broker_id)
        return state.record if state else None

    def brokers(self) -> list[BrokerRecord]:
        return [self._brokers[i].record for i in sorted(self._brokers)]

    def broker_address(self, broker_id: int) -> str | None:
        state = self._brokers.get(broker_id)
        return broker_address(state.record.host, state.record.port) if state else None

    def is_broker_alive(self, broker_id: int) -> bool:
        state = self._brokers.get(broker_id)
        return state is not None and self._alive(state, self._now())

    def live_broker_ids(self) -> list[int]:
        """The brokers that may lead and hold new replicas: alive and not shutting down."""
        now = self._now()
        return sorted(i for i, s in self._brokers.items() if self._alive(s, now) and not s.shutting_down)

    def racks(self) -> dict[int, str]:
        return {i: s.record.rack for i, s in self._brokers.items() if s.record.rack}

    def last_heartbeat_ms(self, broker_id: int) -> int:
        state = self._brokers.get(broker_id)
        return state.last_heartbeat_ms if state else -1

    def _alive(self, state: _BrokerState, now_ms: int) -> bool:
        return state.registered and now_ms - state.last_heartbeat_ms <= self.broker_session_timeout_ms

    def _now(self) -> int:
        """The session clock, after forgiving a pause of this process (dmq.coordinator.pause_watch):
        a broker whose session was running when the coordinator stopped gets a new one from now."""
        now = self.clock_ms()
        paused_ms = self.pause_watch.observe()
        if paused_ms:
            restart_after_pause(self._brokers, paused_ms, now, self.broker_session_timeout_ms)
        return now

    # -- sessions ----------------------------------------------------------------------------------

    async def register(self, broker_id: int, host: str, port: int, *, principal: str | None, rack: str) -> None:
        """Record the broker and mark it alive.

        Refused (BrokerIdTakenError) when the id is bound to another principal, or when the id's
        broker is live at another address: a registration never moves a live broker's partitions
        away from it (a stray or hostile RegisterBroker re-pointed broker 0 and producers then
        timed out). Security off, every caller is the same anonymous principal and the liveness
        rule alone protects the id."""
        _validate_broker(broker_id, host, port)
        if len(rack) > RACK_MAX_CHARS or any(c.isspace() or not c.isprintable() for c in rack):
            raise InvalidMetadataRequestError(f"rack: must be up to {RACK_MAX_CHARS} printable characters without spaces, got {rack[:80]!r}")
        now = self._now()
        previous = self._brokers.get(broker_id)
        if previous is not None:
            if previous.principal is not None and principal is not None and previous.principal != principal:
                raise BrokerIdTakenError(
                    f"broker id {broker_id} is bound to principal {previous.principal!r}; {principal!r} may not "
                    "register it (give this broker its own id)"
                )
            moved = (previous.record.host, previous.record.port) != (host, port)
            if moved and self._alive(previous, now):
                raise BrokerIdTakenError(
                    f"broker id {broker_id} is live at {broker_address(previous.record.host, previous.record.port)}; "
                    f"a registration moving it to {broker_address(host, port)} is refused until that broker's "
                    f"session ({self.broker_session_timeout_ms} ms) expires: two brokers with one id?"
                )
        record = BrokerRecord(broker_id=broker_id, host=host, port=port, registered_ms=now, rack=rack)
        await complete_even_if_cancelled(self._apply_registration(record, now))
        self._brokers[broker_id].principal = principal

    async def _apply_registration(self, record: BrokerRecord, now_ms: int) -> None:
        previous = self._brokers.get(record.broker_id)
        if previous is None or (previous.record.host, previous.record.port, previous.record.rack) != (
            record.host, record.port, record.rack
        ):
            with coordinator_disk_full():
                await self.store.upsert_broker(record)
        if previous is not None and (previous.record.host, previous.record.port) != (record.host, record.port):
            old = broker_address(previous.record.host, previous.record.port)
            # Two brokers configured with one id would flap here; the log line is how to spot it.
            log.warning(
                "broker address changed",
                broker_id=record.broker_id,
                old_address=old,
                new_address=broker_address(record.host, record.port),
                was_alive=self._alive(previous, now_ms),
            )
            self.broker_pool.forget(old)
        state = _BrokerState(record, registered=True, last_heartbeat_ms=now_ms)
        if previous is not None and (previous.record.host, previous.record.port) == (record.host, record.port):
            # keep the first registration time of this address
            state.record = replace(previous.record, rack=record.rack)
        self._brokers[record.broker_id] = state
        log.info(
            "broker registered",
            broker_id=record.broker_id,
            address=broker_address(record.host, record.port),
            partitions=self.partitions_led(record.broker_id),
        )

    def heartbeat(self, broker_id: int) -> bool:
        """Refresh the broker's session; True when it must re-register (unknown or expired)."""
        state = self._brokers.get(broker_id)
        now = self._now()
        if state is None or not self._alive(state, now):
            if state is not None and state.registered:
                state.registered = False
                log.warning("heartbeat after the broker's session expired", broker_id=broker_id)
            return True
        state.last_heartbeat_ms = now
        return False

    def mark_shutting_down(self, broker_id: int) -> None:
        """The broker said it is shutting down (after a heartbeat() that kept it registered): it
        leads nothing and joins no ISR until it registers again."""
        state = self._brokers[broker_id]
        if not state.shutting_down:
            state.shutting_down = True
            log.info("broker shutting down: moving its leadership", broker_id=broker_id,
                     partitions=self.partitions_led(broker_id))

    def expire_brokers(self) -> list[int]:
        """End the sessions that timed out, and those of brokers that did not re-register within a
        session of this coordinator's start; the ids. Called periodically by the node's monitor."""
        now = self._now()
        expired = []
        for broker_id, state in sorted(self._brokers.items()):
            if (state.registered or state.awaited) and now - state.last_heartbeat_ms > self.broker_session_timeout_ms:
                why = "broker session expired" if state.registered else "broker did not re-register after the coordinator started"
                state.registered = state.awaited = False
                expired.append(broker_id)
                log.warning(
                    why,
                    broker_id=broker_id,
                    address=broker_address(state.record.host, state.record.port),
                    last_heartbeat_ms=state.last_heartbeat_ms,
                    partitions=self.partitions_led(broker_id),
                )
        return expired


def _validate_broker(broker_id: int, host: str, port: int) -> None:
    if not 0 <= broker_id <= BROKER_ID_MAX:
        raise InvalidMetadataRequestError(f"broker_id: must be between 0 and {BROKER_ID_MAX}, got {broker_id}")
    if not host or len(host) > HOST_MAX_CHARS:
        raise InvalidMetadataRequestError(f"host: must be 1 to {HOST_MAX_CHARS} characters, got {len(host)}")
    if any(c.isspace() or not c.isprintable() or c in "/@" for c in host):
        raise InvalidMetadataRequestError(f"host: {host[:60]!r} is not a host name or IP address")
    if not 1 <= port <= 65535:
        raise InvalidMetadataRequestError(f"port: must be between 1 and 65535, got {port}")
