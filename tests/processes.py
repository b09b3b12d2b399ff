"""The child processes tests start (servers, consoles, clients): waiting for a server to serve, stopping."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

import grpc

from dmq.proto import dmq_pb2 as pb
from dmq.proto.dmq_pb2_grpc import MetadataStub

KILLED_REAP_TIMEOUT_S = 10.0


def stop_process(proc: subprocess.Popen[Any], timeout_s: float, sig: int = signal.SIGTERM) -> bool:
    """sig (if it is still running), and SIGKILL if it has not exited within timeout_s; reaped
    either way. True when it exited without the SIGKILL, for tests that check a clean stop."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(KILLED_REAP_TIMEOUT_S)
        return False
    return True


def wait_until_a_broker_is_alive(
    metadata: MetadataStub, proc: subprocess.Popen[Any], deadline: float, log_tail: Callable[[], str]
) -> bool:
    """Poll the coordinator (metadata) of the `dmq server` proc until it lists a live broker: True
    then, False at deadline (time.monotonic()); RuntimeError with log_tail() if proc exits first."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dmq server exited with {proc.returncode}: {log_tail()}")
        try:
            if any(b.alive for b in metadata.ListBrokers(pb.ListBrokersRequest(), timeout=1.0).brokers):
                return True
        except grpc.RpcError:
            pass
        time.sleep(0.05)  # polling a condition under a deadline
    return False
