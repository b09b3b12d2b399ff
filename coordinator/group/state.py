"""Group states, what each one does, and the one gate every state change goes through.

State machine (``*`` = timer event; "membership change" = a join, a leave, or a member
expiring by ``session_timeout_ms`` or ``max_poll_interval_ms``)::

                 join                          debounce fires *
      EMPTY ------------> PREPARING_REBALANCE ----------------> REBALANCING
        ^                   ^    ^   |  membership change            |  every member acknowledged
        |                   |    |   |  (re-arms the debounce)       |  and owns exactly its target
        |                   |    |   v                               v
        |                   |    +-- (self)                       STABLE
        |                   +-------------- membership change /------+
        |                               partition count increase     |
        +--------- last member gone (from any non-EMPTY state) ------+

The legal previous states of every state are in ``VALID_PREVIOUS_STATES`` (one table), and
every change goes through ``transition_to()``, which raises on anything else.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from .errors import IllegalStateTransitionError


class GroupState(enum.Enum):
    """The values equal dmq.v1.GroupStateCode, so the service maps with ``GroupStateCode(s.value)``."""

    EMPTY = 0
    """No members. The group keeps its subscription (mode, time, snapshot offsets); its
    committed offsets live on the brokers.

    action: join -> adds the member, moves to PREPARING_REBALANCE;
            heartbeat / get_assignment / leave / poll / member commit -> UnknownGroupMemberError;
            operator offset reset (member "" and generation -1) -> allowed;
            delete -> allowed.
    transition: a member joins => PREPARING_REBALANCE.
    """

    PREPARING_REBALANCE = 1
    """Membership (or the partition count) changed; a rebalance is scheduled and debounced
    (``rebalance_debounce_ms``, re-armed by each further change but never later than
    ``rebalance_max_delay_ms`` after the first one), so several consumers starting together
    produce one generation, not several.

    action: join -> adds the member (re-arms the debounce); it owns nothing until the next
            generation; heartbeat -> current generation, assignment_changed when the member has
            hand-off work under the *current* target; get_assignment -> hand-offs of the
            current generation continue (nothing stops: owners keep consuming), the answer says
            a rebalance is in progress; leave -> releases the member's partitions at once;
            commits -> accepted from current owners.
    transition: debounce fires with members => REBALANCING (generation + 1, new target);
                last member gone => EMPTY.
    """

    REBALANCING = 2
    """A new generation and target exist; ownership is being handed over. A partition moving
    from A to B stays owned by A until A acknowledges (its next get_assignment) or A is gone;
    only then can B acquire it, on B's next get_assignment. No partition is ever owned twice.

    action: join / leave / expiry -> PREPARING_REBALANCE; heartbeat -> assignment_changed when
            calling get_assignment would change something for that member; get_assignment ->
            acknowledges the generation: releases partitions outside the member's target,
            acquires free partitions of its target; commits -> accepted from current owners.
    transition: every member acknowledged the generation and owns exactly its target => STABLE;
                membership change or partition count increase => PREPARING_REBALANCE;
                last member gone => EMPTY.
    """

    STABLE = 3
    """Every partition is owned by the member the current generation assigns it to, and every
    member has acknowledged that generation.

    action: heartbeat -> assignment_changed only if the member has not fetched this generation;
            get_assignment -> the same partitions again; commits -> accepted from owners.
    transition: membership change or partition count increase => PREPARING_REBALANCE;
                last member gone => EMPTY.
    """


#: For each state, the states it may be entered from. The single source of truth.
VALID_PREVIOUS_STATES: Mapping[GroupState, frozenset[GroupState]] = {
    GroupState.EMPTY: frozenset(
        {GroupState.PREPARING_REBALANCE, GroupState.REBALANCING, GroupState.STABLE}
    ),
    GroupState.PREPARING_REBALANCE: frozenset(
        {GroupState.EMPTY, GroupState.REBALANCING, GroupState.STABLE}
    ),
    GroupState.REBALANCING: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.STABLE: frozenset({GroupState.REBALANCING}),
}


def can_transition(current: GroupState, target: GroupState) -> bool:
    return current in VALID_PREVIOUS_STATES[target]


def transition_to(current: GroupState, target: GroupState) -> GroupState:
    """Return ``target`` if ``current -> target`` is legal, else raise.

    Staying in the same state is not a transition and is illegal here: callers that only
    re-arm a timer must not call this.
    """
    if not can_transition(current, target):
        allowed = sorted(s.name for s in VALID_PREVIOUS_STATES[target])
        raise IllegalStateTransitionError(
            f"illegal group state transition {current.name} -> {target.name} "
            f"({target.name} may only follow {', '.join(allowed)})"
        )
    return target
