"""Broker sessions: what the controller knows of each broker's liveness (DESIGN.md "Replication").

A broker is alive while it has registered with this coordinator process and its last heartbeat is
at most the broker session timeout old (dmq.coordinator.membership reads it on the session clock,
wall_clock_ms unless injected). Two cases the coordinator's own history adds (issue 28):
  1. A broker known from the store is `awaited` from the coordinator's start: it gets one session
     from the start to re-register, and is then declared dead like an expired one (its partitions
     get new leaders), so a broker that died while the coordinator was down is failed over.
  2. A pause of the coordinator (dmq.coordinator.pause_watch) is not the brokers' fault: every
     session that was running when it stopped restarts at the resume (restart_after_pause).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import structlog

from dmq.coordinator.store import BrokerRecord

log = structlog.get_logger(__name__)

# A dead broker is declared dead at most this long after its last heartbeat. Kafka's KRaft
# default (broker.session.timeout.ms) is 9 s; ours is shorter because a local cluster's brokers
# heartbeat over loopback, and the bound for declaring a broker dead is 6 s.
DEFAULT_BROKER_SESSION_TIMEOUT_MS = 6_000


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(slots=True)
class BrokerSession:
    record: BrokerRecord
    registered: bool = False  # registered with this coordinator process (and not expired since)
    last_heartbeat_ms: int = -1
    principal: str | None = None  # who registered it (this coordinator process): the id is bound to it
    shutting_down: bool = False  # said so in a heartbeat: leads nothing, joins no ISR until it registers again
    # Known from the store and not re-registered since this coordinator started: given one session
    # from the start (last_heartbeat_ms) to do so, then declared dead like an expired one.
    awaited: bool = False


def restart_after_pause(sessions: Mapping[int, BrokerSession], paused_ms: int, now_ms: int, timeout_ms: int) -> list[int]:
    """The coordinator was not running for paused_ms up to now_ms: each session that was running
    when it stopped (registered or awaited, not lapsed by then) restarts now. The ids."""
    stopped_ms = now_ms - paused_ms
    restarted = [i for i, s in sorted(sessions.items())
                 if (s.registered or s.awaited) and stopped_ms - s.last_heartbeat_ms <= timeout_ms]
    for broker_id in restarted:
        sessions[broker_id].last_heartbeat_ms = max(sessions[broker_id].last_heartbeat_ms, now_ms)
    log.warning("coordinator was not running: broker sessions restart now", paused_ms=paused_ms, brokers=restarted)
    return restarted
