"""The consumer's heartbeat thread against a scripted GroupCoordinator (a real gRPC server).

The fake answers Heartbeat from a script (failures, NOT_FOUND, assignment changes) and streams
WatchGroup events on demand, so each rule of the thread is checked on its own: failures are
logged and retried, NOT_FOUND flags a re-join, a new generation flags the membership (from the
heartbeat or, faster, from the watch), the poll watchdog leaves the group, and stop() is quick.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from dmq.client.consumer._config import ConsumerConfig
from dmq.client.consumer._group import Membership
from dmq.client.consumer._heartbeat import HeartbeatThread
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc


class ScriptedCoordinator(pb_grpc.GroupCoordinatorServicer):
    def __init__(self) -> None:
        self.heartbeat_script: queue.Queue[grpc.StatusCode | pb.HeartbeatResponse] = queue.Queue()
        self.events: queue.Queue[pb.GroupEvent | None] = queue.Queue()
        self.heartbeats: list[pb.HeartbeatRequest] = []
        self.leaves: list[pb.LeaveGroupRequest] = []
        self.generation = 1

    def Heartbeat(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        self.heartbeats.append(request)
        try:
            step = self.heartbeat_script.get_nowait()
        except queue.Empty:
            step = pb.HeartbeatResponse(generation=self.generation)
        if isinstance(step, grpc.StatusCode):
            context.abort(step, f"scripted {step.name}")
        return step

    def WatchGroup(self, request, context) -> Iterator[pb.GroupEvent]:  # type: ignore[no-untyped-def]  # noqa: N802
        while context.is_active():
            try:
                event = self.events.get(timeout=0.1)
            except queue.Empty:
                continue
            if event is None:
                return
            yield event

    def LeaveGroup(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        self.leaves.append(request)
        return pb.LeaveGroupResponse()


@pytest.fixture
def coordinator() -> Iterator[tuple[ScriptedCoordinator, str]]:
    servicer = ScriptedCoordinator()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_GroupCoordinatorServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    servicer.events.put(None)
    server.stop(0)


def start(address: str, *, poll_age: list[float] | None = None, **settings: int) -> tuple[HeartbeatThread, Membership, threading.Event]:
    config = ConsumerConfig(address, "app", **{"heartbeat_interval_ms": 50, "session_timeout_ms": 1000, **settings})  # type: ignore[arg-type]
    wakeup = threading.Event()
    ages = poll_age if poll_age is not None else [0.0]
    hb = HeartbeatThread("consumer-under-test", config, wakeup, lambda: ages[0])
    hb.start()
    m = Membership("t", "G_t_app", address, pb.Subscription())
    m.member_id, m.generation = "member-1", 1
    hb.track(m)
    return hb, m, wakeup


def eventually(condition, timeout_s: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_failed_heartbeats_are_retried_and_do_not_end_the_membership(coordinator) -> None:  # type: ignore[no-untyped-def]
    fake, address = coordinator
    for _ in range(3):
        fake.heartbeat_script.put(grpc.StatusCode.UNAVAILABLE)
    hb, m, _ = start(address)
    try:
        eventually(lambda: hb.heartbeats_sent >= 2)
        assert hb.heartbeat_failures == 3
        assert m.rejoin_reason is None and not m.assignment_stale
        assert all(r.member_id == "member-1" and r.generation == 1 and r.group_id == "G_t_app" for r in fake.heartbeats)
        assert "sent=" in repr(hb) and "failed=3" in repr(hb)
    finally:
        hb.stop()


def test_a_new_generation_from_a_heartbeat_flags_the_membership_and_wakes_poll(coordinator) -> None:  # type: ignore[no-untyped-def]
    fake, address = coordinator
    hb, m, wakeup = start(address)
    try:
        fake.heartbeat_script.put(pb.HeartbeatResponse(generation=2, assignment_changed=True))
        assert wakeup.wait(5)
        assert m.assignment_stale and m.rejoin_reason is None
    finally:
        hb.stop()


def test_a_watch_event_flags_the_membership_before_any_heartbeat(coordinator) -> None:  # type: ignore[no-untyped-def]
    fake, address = coordinator
    hb, m, wakeup = start(address, heartbeat_interval_ms=3000, session_timeout_ms=10_000)
    try:
        time.sleep(0.2)
        fake.events.put(pb.GroupEvent(generation=1, assignment_changed=False))  # nothing new
        time.sleep(0.2)
        assert not m.assignment_stale
        fake.events.put(pb.GroupEvent(generation=2, assignment_changed=True))
        assert wakeup.wait(2)
        assert m.assignment_stale and fake.heartbeats == []
    finally:
        hb.stop()


def test_not_found_flags_a_rejoin_and_stops_heartbeating(coordinator) -> None:  # type: ignore[no-untyped-def]
    fake, address = coordinator
    fake.heartbeat_script.put(grpc.StatusCode.NOT_FOUND)
    hb, m, wakeup = start(address)
    try:
        assert wakeup.wait(5)
        eventually(lambda: m.rejoin_reason is not None)
        assert "unknown" in m.rejoin_reason
        sent = len(fake.heartbeats)
        time.sleep(0.3)
        assert len(fake.heartbeats) == sent  # the old member id is not heartbeated any more
    finally:
        hb.stop()


def test_the_watchdog_leaves_when_poll_is_not_called_in_time(coordinator) -> None:  # type: ignore[no-untyped-def]
    fake, address = coordinator
    ages = [0.0]
    hb, m, wakeup = start(address, poll_age=ages, max_poll_interval_ms=1000)
    try:
        time.sleep(0.3)
        assert fake.leaves == []
        ages[0] = 1.5  # the application has not called poll() for 1.5 s
        eventually(lambda: len(fake.leaves) == 1)
        assert fake.leaves[0].member_id == "member-1"
        assert "max_poll_interval_ms" in (m.rejoin_reason or "") and wakeup.is_set()
    finally:
        hb.stop()


def test_stop_ends_the_named_daemon_thread_within_a_second(coordinator) -> None:  # type: ignore[no-untyped-def]
    _, address = coordinator
    hb, _, _ = start(address)
    thread = next(t for t in threading.enumerate() if t.name == "consumer-under-test")
    assert thread.daemon
    time.sleep(0.1)
    started = time.monotonic()
    hb.stop()
    assert not thread.is_alive() and time.monotonic() - started < 1.0
    hb.stop()  # idempotent
