"""A group's membership as durable data: what a restarted coordinator resumes from (issue 28).

Pure, like the rest of the machine: ``snapshot(group)`` turns the state a restart must not forget
into a JSON-able dict; ``restore(group, data, now_ms)`` puts it back into a group freshly replayed
from its GroupCreated record (the service stores the dict beside the group's subscription).

Kept: the generation and state, and per member its id, client and consumer ids, host, session
timeout, max poll interval, acknowledged generation, secret, target partitions and owned partitions
(with the generation each was acquired in). So after a restart the generation keeps increasing,
member ids and secrets stay valid, and the commit rule (handlers.check_ownership) fences exactly
what it fenced before. Not kept: times (deadlines are monotonic and meaningless in another
process). Every restored member gets one full session and poll interval from ``now_ms`` to be
heard again, as Kafka's group coordinator gives members after it moves; one not heard by then
expires as usual, and its partitions go to the others through a rebalance.

Shape (``SNAPSHOT_VERSION`` 1)::

    {"v": 1, "generation": 7, "state": "STABLE",
     "members": [{"member_id": ..., "client_id": ..., "consumer_id": ..., "host": ...,
                  "session_timeout_ms": ..., "max_poll_interval_ms": ..., "acked_generation": 7,
                  "secret": ..., "target": [0, 1], "owned": [[0, 5], [1, 7]]}, ...]}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .group import POLL_TIMER, REBALANCE_TIMER, SESSION_TIMER, Group, Member, Ownership
from .state import GroupState

SNAPSHOT_VERSION = 1


def snapshot(group: Group) -> dict[str, Any]:
    """The group's durable membership (see the module docstring); {} for an empty group."""
    if not group.members:
        return {}
    members = []
    for member_id, m in sorted(group.members.items()):
        members.append({
            "member_id": member_id,
            "client_id": m.client_id,
            "consumer_id": m.consumer_id,
            "host": m.host,
            "session_timeout_ms": m.session_timeout_ms,
            "max_poll_interval_ms": m.max_poll_interval_ms,
            "acked_generation": m.acked_generation,
            "secret": m.secret,
            "target": sorted(group.target.get(member_id, ())),
            "owned": [[p, group.owners[p].since_generation] for p in group.owned_partitions(member_id)],
        })
    return {"v": SNAPSHOT_VERSION, "generation": group.generation, "state": group.state.name, "members": members}


def restore(group: Group, data: Mapping[str, Any], now_ms: int) -> None:
    """Put a snapshot back into ``group`` (just replayed: EMPTY, generation 0). Raises ValueError
    (KeyError, TypeError) on a snapshot it cannot read, having changed nothing."""
    if not data:
        return
    if data.get("v") != SNAPSHOT_VERSION:
        raise ValueError(f"group snapshot version {data.get('v')!r}, this coordinator reads {SNAPSHOT_VERSION}")
    generation = int(data["generation"])
    state = GroupState[str(data["state"])]
    members = [_member(m, now_ms) for m in data["members"]]
    if generation < 0 or state is GroupState.EMPTY or not members:
        raise ValueError(f"group snapshot with generation {generation}, state {state.name}, {len(members)} members")
    count = group.partition_count
    # Parsed whole before anything changes. Partitions beyond the topic's count cannot be: skipped.
    parsed = [
        (member, sorted({int(p) for p in raw["target"] if 0 <= int(p) < count}),
         [(int(p), int(since)) for p, since in raw["owned"] if 0 <= int(p) < count])
        for member, raw in zip(members, data["members"], strict=True)
    ]
    group.generation = generation
    for member, target, owned in parsed:
        member_id = member.member_id
        group.members[member_id] = member
        group.index_consumer(member)
        # One session and one poll interval from now: the coordinator was away, not the member.
        group.timer.schedule((SESSION_TIMER, member_id), now_ms + member.session_timeout_ms)
        group.timer.schedule((POLL_TIMER, member_id), now_ms + member.max_poll_interval_ms)
        group.target[member_id] = frozenset(target)
        for p in target:
            group.target_owner[p] = member_id
        owned_now = group.owned_by.setdefault(member_id, set())
        for p, since in owned:
            if p not in group.owners:
                group.owners[p] = Ownership(member_id, since)
                owned_now.add(p)
    # Set, not transitioned: this is the state the group was in, not a change of it.
    group.state = state
    if state is GroupState.PREPARING_REBALANCE or len(group.target_owner) < group.partition_count:
        # A rebalance was pending, or partitions were added while the coordinator was away.
        group.state = GroupState.PREPARING_REBALANCE
        group.prepare_started_ms = now_ms
        group.timer.schedule(REBALANCE_TIMER, now_ms + group.config.rebalance_debounce_ms)


def _member(raw: Mapping[str, Any], now_ms: int) -> Member:
    return Member(
        member_id=str(raw["member_id"]),
        client_id=str(raw["client_id"]),
        consumer_id=str(raw["consumer_id"]),
        host=str(raw["host"]),
        session_timeout_ms=int(raw["session_timeout_ms"]),
        max_poll_interval_ms=int(raw["max_poll_interval_ms"]),
        joined_ms=now_ms,
        last_heartbeat_ms=now_ms,
        last_poll_ms=now_ms,
        acked_generation=int(raw["acked_generation"]),
        secret=str(raw["secret"]),
    )
