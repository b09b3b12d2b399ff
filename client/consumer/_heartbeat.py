"""The heartbeat thread: keeps memberships alive and notices rebalances, nothing else.

One daemon thread per consumer, named after the consumer id, runs a private asyncio loop with
grpc.aio so that one thread can heartbeat and hold a WatchGroup stream for every membership at
once. Per tracked membership it runs two tasks:

    heartbeat   Heartbeat every heartbeat_interval_ms. A failure is logged and retried at the
                next interval (the session timeout allows two to be lost). NOT_FOUND means the
                coordinator forgot the member: flag it for re-joining.
    watch       the WatchGroup stream: events arrive as soon as a generation starts or a
                hand-off completes, so a rebalance takes about the coordinator's debounce, not a
                heartbeat interval. A broken stream is reopened after a backoff.

and one watchdog for the consumer: when the application has not called poll() for
max_poll_interval_ms, it leaves every group (Kafka's rule: a stuck processing loop must not keep
its partitions) and flags the memberships, so the next commit fails with CommitFailedError and
the next poll() joins again.

With several coordinators (bootstrap_servers naming them all), both tasks send to whichever the
cluster's CoordinatorRouter believes active, and report their failures to it, so they follow a
takeover as the application thread's calls do: a member that kept heartbeating to the coordinator
it joined at would never be heard by the new active one, which removes it after one session.

What it never does: commit, fetch an assignment, or touch the SubscriptionState. It only sets
Membership flags and the consumer's wake-up event; poll() acts on them on the caller's thread.
The owner (DMQConsumer) calls stop(), which returns within about a second.

Ending a task never abandons a call in flight (see _end): grpc.aio delivers each call's completion
to the loop that started it, and one arriving after this thread closed its loop is dispatched by
whichever other loop of the process polls grpc next (an application's asyncio.run, say), which
fails and prints "RuntimeError: Event loop is closed" on its stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

import grpc

from dmq.client._coordinators import CoordinatorRouter
from dmq.client._log import get_logger
from dmq.client.consumer._config import ConsumerConfig
from dmq.client.consumer._group import Membership
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto.grpc_options import channel_options
from dmq.proto.security.settings import aio_channel

log = get_logger(__name__)

STOP_TIMEOUT_S = 1.0
MAX_WATCH_BACKOFF_S = 1.0
_START_TIMEOUT_S = 5.0


class HeartbeatThread:
    def __init__(
        self,
        name: str,
        config: ConsumerConfig,
        wakeup: threading.Event,
        poll_age_s: Callable[[], float],
        *,
        router: CoordinatorRouter | None = None,
    ) -> None:
        self.name = name
        self._router = router
        self._config = config
        self._wakeup = wakeup
        self._poll_age_s = poll_age_s
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._tasks: dict[str, list[asyncio.Task[None]]] = {}  # topic -> its two tasks
        self._live: set[asyncio.Task[None]] = set()  # every task started here and not finished, untracked ones too
        self._ending: set[asyncio.Task[None]] = set()  # tasks told to end (see _end)
        self._calls: dict[asyncio.Task[None], grpc.aio.Call] = {}  # task -> the call it awaits now
        self._tracked: dict[str, Membership] = {}
        self.heartbeats_sent = 0  # for tests and __repr__
        self.heartbeat_failures = 0

    def __repr__(self) -> str:
        return (
            f"<HeartbeatThread {self.name!r} alive={self._thread.is_alive()} tracked={sorted(self._tracked)} "
            f"sent={self.heartbeats_sent} failed={self.heartbeat_failures}>"
        )

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # -- owner's side (application thread) ---------------------------------------------------------

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(_START_TIMEOUT_S):  # pragma: no cover - a loop that cannot start
            raise RuntimeError(f"heartbeat thread {self.name} did not start")

    def track(self, m: Membership) -> None:
        """(Re)start heartbeats and the watch for m's current member id."""
        self._call(self._track, m)

    def untrack(self, topic: str) -> None:
        self._call(self._untrack, topic)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # loop already stopped
                loop.call_soon_threadsafe(stopping.set)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
            if self._thread.is_alive():  # pragma: no cover
                log.warning("heartbeat thread did not stop in time", thread=self.name, timeout_s=timeout_s)

    def _call(self, fn: Callable[..., None], *args: object) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(fn, *args)

    # -- the thread ---------------------------------------------------------------------------------

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
            # grpc.aio's own tasks of the calls ended above (their final status) finish before the
            # loop closes, so no completion of theirs arrives for a closed loop.
            leftover = asyncio.all_tasks(loop)
            if leftover:
                loop.run_until_complete(asyncio.wait(leftover, timeout=STOP_TIMEOUT_S / 4))
        except Exception:  # noqa: BLE001 - a dying heartbeat thread must say why
            log.exception("heartbeat thread failed", thread=self.name)
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _main(self) -> None:
        self._stopping = asyncio.Event()
        self._ready.set()
        self._start(self._watchdog(), f"{self.name}-watchdog")
        try:
            await self._stopping.wait()
        finally:
            self._tasks.clear()
            tasks = set(self._live)  # untracked tasks still ending included
            for t in tasks:
                self._end(t)
            if tasks:
                _, late = await asyncio.wait(tasks, timeout=STOP_TIMEOUT_S / 2)
                for t in late:  # a call that outlives the wait is abandoned rather than the stop held
                    t.cancel()
                if late:
                    await asyncio.wait(late, timeout=STOP_TIMEOUT_S / 4)
            for ch in self._channels.values():
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(ch.close(grace=None), STOP_TIMEOUT_S / 4)
            self._channels.clear()

    def _start(self, coro: Any, name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        self._live.add(task)
        task.add_done_callback(self._forget)
        return task

    def _forget(self, task: asyncio.Task[None]) -> None:
        self._live.discard(task)
        self._ending.discard(task)
        self._calls.pop(task, None)

    def _end(self, task: asyncio.Task[None]) -> None:
        """Make `task` end without abandoning a call: cancelling a task that awaits a call would
        leave the call's completion to arrive later, perhaps after the loop closed (see the module
        comment). A sleeping task is cancelled; a WatchGroup stream is cancelled through gRPC, so
        its pending read completes and the task ends; a unary call is left to answer (or reach
        its deadline) and the task ends after it."""
        if task.done():
            return
        self._ending.add(task)
        call = self._calls.get(task)
        if call is None:
            task.cancel()
        elif isinstance(call, grpc.aio.UnaryStreamCall):
            call.cancel()

    async def _await_call(self, call: Any) -> Any:
        """Await a unary call, registered so _end lets it finish."""
        task = asyncio.current_task()
        assert task is not None
        self._calls[task] = call
        try:
            return await call
        finally:
            self._calls.pop(task, None)

    def _told_to_end(self) -> bool:
        return asyncio.current_task() in self._ending

    def _stub(self, address: str) -> pb_grpc.GroupCoordinatorStub:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = aio_channel(address, self._config.security, channel_options())
        return pb_grpc.GroupCoordinatorStub(ch)  # type: ignore[no-untyped-call]  # generated stubs are untyped

    def _address(self, m: Membership) -> str:
        """Where m's calls go: the coordinator that answered for its group, or, when that is one
        of several, whichever is active as far as the router knows."""
        router = self._router
        return router.current if router is not None and m.coordinator in router.addresses else m.coordinator

    def _follow(self, address: str, error: grpc.aio.AioRpcError) -> None:
        if self._router is not None:
            self._router.observe(address, error)

    def _track(self, m: Membership) -> None:
        self._untrack(m.topic)
        if not m.member_id:
            return
        self._tracked[m.topic] = m
        member_id = m.member_id
        self._tasks[m.topic] = [
            self._start(self._heartbeat_loop(m, member_id), f"{self.name}-heartbeat-{m.topic}"),
            self._start(self._watch_loop(m, member_id), f"{self.name}-watch-{m.topic}"),
        ]

    def _untrack(self, topic: str) -> None:
        self._tracked.pop(topic, None)
        for t in self._tasks.pop(topic, ()):
            self._end(t)  # _main's stop still waits for it

    # -- flags ----------------------------------------------------------------------------------------

    def _flag_stale(self, m: Membership, member_id: str, why: str) -> None:
        if m.member_id == member_id and not m.assignment_stale:
            m.assignment_stale = True
            log.debug("assignment changed", group=m.group_id, member=member_id, why=why)
            self._wakeup.set()

    def _flag_rejoin(self, m: Membership, member_id: str, reason: str) -> None:
        if m.member_id == member_id and m.rejoin_reason is None:
            m.rejoin_reason = reason
            self._wakeup.set()

    # -- tasks --------------------------------------------------------------------------------------

    async def _heartbeat_loop(self, m: Membership, member_id: str) -> None:
        c = self._config
        interval_s = c.heartbeat_interval_ms / 1000
        while m.member_id == member_id and m.rejoin_reason is None and not self._told_to_end():
            await asyncio.sleep(interval_s)
            if m.member_id != member_id or m.rejoin_reason is not None or self._told_to_end():
                return
            # The poll age lets the coordinator remove this member if the application is stuck,
            # even should this thread's own watchdog fail to leave in time.
            request = pb.HeartbeatRequest(
                group_id=m.group_id,
                member_id=member_id,
                generation=m.generation,
                poll_age_ms=int(self._poll_age_s() * 1000),
                member_secret=m.member_secret,
            )
            address = self._address(m)
            try:
                response = await self._await_call(self._stub(address).Heartbeat(request, timeout=max(interval_s, 1.0)))
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    log.warning("coordinator forgot this member; re-joining at the next poll()",
                                group=m.group_id, member=member_id, error=e.details())
                    self._flag_rejoin(m, member_id, f"member unknown to the coordinator: {e.details()}")
                    return
                self.heartbeat_failures += 1
                log.warning("heartbeat failed; retrying", group=m.group_id, member=member_id,
                            code=e.code().name, error=e.details())
                self._follow(address, e)
                continue
            self.heartbeats_sent += 1
            if self._told_to_end():
                return
            if response.assignment_changed or response.generation != m.generation:
                self._flag_stale(m, member_id, f"heartbeat: generation {response.generation}")

    async def _watch_loop(self, m: Membership, member_id: str) -> None:
        c = self._config
        backoff_s = c.retry_backoff_ms / 1000
        me = asyncio.current_task()
        assert me is not None
        while m.member_id == member_id and m.rejoin_reason is None and not self._told_to_end():
            address = self._address(m)
            call = self._stub(address).WatchGroup(pb.WatchGroupRequest(group_id=m.group_id, member_id=member_id,
                                                        member_secret=m.member_secret))
            self._calls[me] = call
            try:
                async for event in call:
                    backoff_s = c.retry_backoff_ms / 1000
                    if event.assignment_changed or event.generation != m.generation:
                        self._flag_stale(m, member_id, f"watch: generation {event.generation}")
            except grpc.aio.AioRpcError as e:
                code = e.code()
                if code == grpc.StatusCode.NOT_FOUND:
                    self._flag_rejoin(m, member_id, f"member unknown to the coordinator: {e.details()}")
                    return
                if code == grpc.StatusCode.UNIMPLEMENTED:
                    log.info("coordinator has no WatchGroup; relying on heartbeats", group=m.group_id)
                    return
                log.debug("group watch broke; reopening", group=m.group_id, member=member_id,
                          code=code.name, error=e.details())
                self._follow(address, e)
            finally:
                self._calls.pop(me, None)
                call.cancel()
            if self._told_to_end():
                return
            await asyncio.sleep(backoff_s)
            # Capped at a second: when a restarted coordinator answers the reopened watch with
            # NOT_FOUND, the member re-joins at once instead of after a heartbeat interval.
            backoff_s = min(backoff_s * 2, MAX_WATCH_BACKOFF_S, c.heartbeat_interval_ms / 1000)

    async def _watchdog(self) -> None:
        limit_s = self._config.max_poll_interval_ms / 1000
        check_s = min(0.5, limit_s / 10)
        while not self._told_to_end():
            await asyncio.sleep(check_s)
            age_s = self._poll_age_s()
            if age_s <= limit_s:
                continue
            for topic, m in list(self._tracked.items()):
                member_id = m.member_id
                if not member_id or m.rejoin_reason is not None:
                    continue
                log.warning(
                    "poll() was not called within max_poll_interval_ms: leaving the group so its "
                    "partitions go to live members; raise max_poll_interval_ms or lower "
                    "max_poll_records if processing a batch takes this long",
                    group=m.group_id, member=member_id, poll_age_ms=int(age_s * 1000),
                    max_poll_interval_ms=self._config.max_poll_interval_ms,
                )
                self._flag_rejoin(m, member_id, f"poll() not called for {age_s:.1f}s (max_poll_interval_ms)")
                self._untrack(topic)
                try:
                    await self._await_call(self._stub(self._address(m)).LeaveGroup(
                        pb.LeaveGroupRequest(group_id=m.group_id, member_id=member_id, member_secret=m.member_secret),
                        timeout=5.0,
                    ))
                except grpc.aio.AioRpcError as e:
                    log.warning("leave after poll timeout failed; the coordinator will expire the member",
                                group=m.group_id, member=member_id, error=e.details())
