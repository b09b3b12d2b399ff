"""The group coordinator's wake-ups and watch streams.

Wake-ups: one-shot asyncio.Events per (group, member) (`Signals`). Events of the group machine are
mapped to the members they concern (`affected`), so a rebalance of a 1,000-member group wakes each
waiter (a GetAssignment long poll, a watch stream, the ticker) a bounded number of times, not once
per other member's request.

Watch streams (WatchGroup, `WatchStreams`): each stream sends GroupEvent(generation,
assignment_changed) when what it would tell the member changes: a new generation,
assignment_changed turning true, or still true after the member fetched its assignment (so nothing
it must act on is swallowed). Its queue is a coalescing slot of size one: every GroupEvent is a
full snapshot, so when the client reads slowly the newest state replaces older ones and nothing
grows. The stream ends with NOT_FOUND when the member is gone, and normally when the service stops.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

import grpc

from dmq.coordinator.group import (
    Event,
    GenerationStarted,
    Group,
    GroupRegistry,
    MemberJoined,
    MemberRemoved,
    PartitionsAcquired,
    PartitionsReleased,
    StateChanged,
)
from dmq.proto import dmq_pb2 as pb
from dmq.proto.server.server_errors import fail

__all__ = ["ALL_MEMBERS", "Signals", "WatchStreams", "affected", "wait_or_timeout"]

WATCH_IDLE_MS = 30_000  # a watch stream re-evaluates at least this often (a safety net)
MAX_WATCHES_PER_MEMBER = 4  # a client holds one; a few more cover reconnect overlap
MAX_WATCHES = 100_000  # over all groups, bounds the coordinator's stream tasks


async def wait_or_timeout(event: asyncio.Event, timeout_s: float) -> None:
    """Until the event is set or the timeout passes (asyncio.timeout: no extra task per wait,
    unlike wait_for, which matters with a thousand watch streams)."""
    if event.is_set():
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()


ALL_MEMBERS = "*"


class Signals:
    """One-shot broadcast events keyed by (group, member): `get` hands out the current event of a
    key, `fire` sets it and forgets it, so the next `get` starts a fresh one. A waiter takes its
    event *before* it evaluates the state and waits *after*, so a change in between is never
    missed. Only keys with a waiter are held."""

    __slots__ = ("_events",)

    def __init__(self) -> None:
        self._events: dict[str, dict[str, asyncio.Event]] = {}

    def get(self, group_id: str, member_id: str) -> asyncio.Event:
        members = self._events.setdefault(group_id, {})
        event = members.get(member_id)
        if event is None:
            event = members[member_id] = asyncio.Event()
        return event

    def fire(self, group_id: str, member_ids: Collection[str]) -> None:
        members = self._events.get(group_id)
        if not members:
            return
        if ALL_MEMBERS in member_ids:
            self._events.pop(group_id)
            for event in members.values():
                event.set()
            return
        for member_id in member_ids:
            waiting = members.pop(member_id, None)
            if waiting is not None:
                waiting.set()
        if not members:
            del self._events[group_id]

    def fire_all(self) -> None:
        groups, self._events = self._events, {}
        for members in groups.values():
            for event in members.values():
                event.set()

    def __len__(self) -> int:
        return sum(len(m) for m in self._events.values())


def affected(group: Group | None, event: Event) -> set[str]:
    """The members whose answer (GetAssignment's rebalance_in_progress / what a watch stream
    would send) may change because of ``event``. Cases:
    1. a new generation or a state change: everyone (generation, rebalance_in_progress);
    2. partitions freed (released by their owner, or their owner is gone): their target owners,
       who can now acquire them, and the member itself;
    3. a join, an acquisition: the member itself;
    4. a scheduled rebalance, a partition count change: nobody until the generation starts."""
    if isinstance(event, (GenerationStarted, StateChanged)):
        return {ALL_MEMBERS}
    if isinstance(event, (PartitionsReleased, MemberRemoved)):
        freed = event.partitions if isinstance(event, PartitionsReleased) else event.released
        members = {event.member_id}
        if group is not None:
            members.update(m for p in freed if (m := group.target_owner.get(p)) is not None)
        return members
    if isinstance(event, (MemberJoined, PartitionsAcquired)):
        return {event.member_id}
    return set()


@dataclass(slots=True)
class _Watch:
    """Book-keeping of one (group, member)'s open watch streams."""

    count: int = 0


class WatchStreams:
    """The WatchGroup streams: their bounds (per member, overall) and the loop each one runs.

    Collaborators are passed in: the registry the streams read (under no lock: reads only, no
    await between them), the signals that wake them, the GetAssignment counts per member (an
    acknowledgement re-sends a still-true assignment_changed) and whether the service stops."""

    def __init__(
        self,
        registry: GroupRegistry,
        signals: Signals,
        ack_seq: Mapping[tuple[str, str], int],
        stopping: Callable[[], bool],
    ) -> None:
        self._registry = registry
        self._signals = signals
        self._ack_seq = ack_seq
        self._stopping = stopping
        self._watches: dict[tuple[str, str], _Watch] = {}
        self._total = 0

    def __repr__(self) -> str:
        return f"<WatchStreams streams={self._total} members={len(self._watches)}>"

    def __len__(self) -> int:
        return self._total

    async def serve(
        self, group_id: str, member_id: str, context: grpc.aio.ServicerContext[pb.WatchGroupRequest, pb.GroupEvent]
    ) -> None:
        """Hold one stream open for the member (within the bounds) until it ends."""
        key = (group_id, member_id)
        watch = self._watches.get(key)
        if watch is not None and watch.count >= MAX_WATCHES_PER_MEMBER:
            fail(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"member {member_id!r} already has {watch.count} watch streams open: close one first",
            )
        if self._total >= MAX_WATCHES:
            fail(grpc.StatusCode.RESOURCE_EXHAUSTED, f"the coordinator holds {MAX_WATCHES} watch streams: retry later")
        watch = self._watches.setdefault(key, _Watch())
        watch.count += 1
        self._total += 1
        try:
            await self._stream(group_id, member_id, context)
        finally:
            watch.count -= 1
            self._total -= 1
            if watch.count == 0 and self._watches.get(key) is watch:
                del self._watches[key]

    async def _stream(
        self, group_id: str, member_id: str, context: grpc.aio.ServicerContext[pb.WatchGroupRequest, pb.GroupEvent]
    ) -> None:
        key = (group_id, member_id)
        sent: tuple[int, bool] | None = None
        sent_ack = -1
        while not self._stopping():
            wake = self._signals.get(group_id, member_id)  # taken before evaluating: see Signals
            group = self._registry.get(group_id)
            group.member(member_id)  # NOT_FOUND ends the stream: the member is gone
            generation = group.generation
            changed = group.assignment_changed(member_id)
            ack = self._ack_seq.get(key, 0)
            if sent is None or generation != sent[0] or (changed and (not sent[1] or ack != sent_ack)):
                await context.write(pb.GroupEvent(generation=generation, assignment_changed=changed))
            sent, sent_ack = (generation, changed), ack
            await wait_or_timeout(wake, WATCH_IDLE_MS / 1000)
