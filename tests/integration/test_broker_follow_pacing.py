"""A broker given several coordinators follows a takeover without flooding them (issue 28 item 3).

Until the killed active coordinator's lease lapses, the standby names it as the active one, and its
closed port refuses at once; a broker that followed each answer at once (the standby names the dead
one, the dead one refuses, back to the standby...) called them in a tight loop, hundreds of times a
second, each on a new connection, until the coordinators' per-address connection limit refused it
(and every other client on its host) and it was declared dead at the new active coordinator. It
follows at once for one round of the list, then at most once every FOLLOW_PAUSE_S (0.1 s).

The lease is 8 s so that the window in which the standby names a dead coordinator is long enough to
tell the two apart by far: the loop made ~240 calls a second here (2004 in 8.4 s), the paced broker at most
one per FOLLOW_PAUSE_S after a round of the list.
"""

from __future__ import annotations

import pathlib
import signal
import time

import grpc
import pytest

from dmq.broker.node import FOLLOW_PAUSE_S
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from tests.integration.test_coordinator_election import WAIT_S, _broker, _Coordinator, _one_active, _stop, _wait

pytestmark = pytest.mark.processes  # left out of `make check`

TTL_S = 8
FAILED = "broker heartbeat failed"


def _broker_alive_at(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            listed = pb_grpc.MetadataStub(channel).ListBrokers(pb.ListBrokersRequest(), timeout=WAIT_S)
        except grpc.RpcError:
            return False
    return any(b.broker_id == 0 and b.alive for b in listed.brokers)


def test_a_broker_follows_a_takeover_at_its_heartbeat_pace(tmp_path: pathlib.Path, etcd_url: str) -> None:
    coordinators = [_Coordinator(tmp_path, f"c{i}", etcd_url, ttl_s=TTL_S) for i in range(2)]
    broker = None
    try:
        first = _one_active(coordinators, WAIT_S)
        second = next(c for c in coordinators if c is not first)
        broker = _broker(tmp_path, coordinators)
        log_path = tmp_path / "broker0.log"
        _wait(lambda: _broker_alive_at(first.address), WAIT_S, "broker registered")

        before = log_path.read_text(errors="replace").count(FAILED)
        first.proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        first.proc.wait(10)
        _wait(second.active, WAIT_S, "takeover")
        window_s = time.monotonic() - killed
        failures = log_path.read_text(errors="replace").count(FAILED) - before
        print(f"{failures} failed heartbeats in the {window_s:.1f}s until the standby took over")
        # Paced: one call per FOLLOW_PAUSE_S past a round of the list, and some slack; the loop: hundreds a second.
        assert failures <= 1.5 * window_s / FOLLOW_PAUSE_S + 10, f"{failures} failed heartbeats in {window_s:.1f}s: a tight loop"
        # Its connections were never refused: it is alive at the new active coordinator.
        _wait(lambda: _broker_alive_at(second.address), WAIT_S, "broker alive at the new active coordinator")
    finally:
        _stop(broker, coordinators)
