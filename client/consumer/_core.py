"""The client side of the group protocol, sans I/O: one core for DMQConsumer and AsyncConsumer.

As coordinator/group/ is the server's group state machine without I/O, this is the member's:
it holds the memberships (one per subscribed topic, ``G_<topic>_<group_id>``), decides which
group call each one needs next, applies the answers, and says what the shell must do about
them. It makes no call, starts no thread or task and never reads a clock: time comes in as
``now`` (time.monotonic() seconds), answers and errors come in as values, and what to do
comes out as values (a `GroupCall` to make; an `Outcome`: partitions to drop, listener
callbacks to call in order, an error to raise). The two shells drive it:

    DMQConsumer (consumer/_consumer.py)  grpc futures finished by later poll()s; the heartbeat
                                         thread sets the memberships' flags
    AsyncConsumer (aio/consumer.py)      one asyncio task awaits the calls; heartbeat tasks on
                                         the loop set the same flags

Per membership, one group call at a time, chosen in this order (``next_call``):

    1. FIND        the group is not found yet (the coordinator was away at subscribe(), or the
                   group was deleted since): FindOrCreateGroup.
    2. JOIN        the coordinator forgot the member (``rejoin_reason``: session expired,
                   coordinator restarted, max_poll_interval_ms exceeded) or it never joined:
                   its partitions are LOST first (dropped, on_partitions_lost), then JoinGroup.
    3. HANDOVER    a new generation or assignment (``assignment_stale``): commit the positions
                   of the records handed out for its partitions, so a revoked partition's next
                   owner starts right after them; then
       ASSIGNMENT  GetAssignment, which acknowledges the generation and hands revoked
                   partitions over. Its answer revokes (drop, on_partitions_revoked) BEFORE it
                   assigns (on_partitions_assigned), as Kafka's listener contract says.

What an error means (``answered`` with `error`), the same for every call:

    UnknownMemberError    the coordinator forgot the member: re-join (no backoff).
    GroupNotFoundError    (JoinGroup) the group was deleted since it was found: find it again.
    retriable             back off per membership (retry_backoff_ms doubling up to 1 s, so a
                          returning coordinator is found within about a second); a failed
                          GetAssignment leaves the assignment stale, so it is asked again.
    anything else         raised to the application (a person must fix it).

The core also keeps the commit rules both consumers share: who may commit (``check_can_commit``:
a member that lost its group may not), what a refused commit means (``commit_refused``: ask for
the assignment again), when an auto-commit is due and what it covers (``auto_commit``), and
what leaving a group commits and revokes (``leave`` / ``release``). Positions stay in the
SubscriptionState (pure data, shared with the fetcher); what has been HANDED OUT to the
application is the shell's to say (``to_commit``): the asyncio consumer buffers records that
are fetched but not handed out yet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from dmq.client._calls import RetryPolicy
from dmq.client._log import KeyValueLogger
from dmq.client.consumer._config import ConsumerConfig
from dmq.client.consumer._group import ASSIGNMENT, FIND, HANDOVER, JOIN, Membership, group_id_for
from dmq.client.consumer._records import OffsetAndMetadata, TopicPartition
from dmq.client.consumer._subscription import EARLIEST, LATEST, SubscriptionState
from dmq.client.errors import CommitFailedError, DMQError, GroupNotFoundError, UnknownMemberError
from dmq.proto import dmq_pb2 as pb

__all__ = ["FIND", "JOIN", "HANDOVER", "ASSIGNMENT", "Callbacks", "GroupCall", "Outcome", "Leaving", "ConsumerCore"]

# How long a hand-off waits for its commits before asking for the new assignment anyway.
# Healthy brokers answer in milliseconds; a stopped one would otherwise hold the rebalance (and
# this member's other partitions, held meanwhile) for a whole request timeout.
HANDOVER_COMMIT_WAIT_S = 1.0
MAX_GROUP_BACKOFF_MS = 1_000
_WHAT = {FIND: "finding the group", JOIN: "joining the group", HANDOVER: "committing before the hand-off",
         ASSIGNMENT: "fetching the assignment"}

Offsets = dict[TopicPartition, OffsetAndMetadata]
# The listener's callbacks to call, in order: (method name, partitions)
Callbacks = tuple[tuple[str, frozenset[TopicPartition]], ...]
# The shell's positions of what it handed out: (topic or None for all, only those not committed yet)
ToCommit = Callable[[str | None, bool], Offsets]


class FindAnswer(Protocol):
    group_id: str
    created: bool
    coordinator_address: str
    subscription: pb.Subscription


@dataclass(slots=True)
class Outcome:
    """What an answer means for the shell, in this order: drop the fetched records of `dropped`,
    make `next` (a hand-off's GetAssignment), start heartbeats when `track`, call the listener's
    `callbacks` in order, raise `error`. `rebalanced`: the assignment changed (Kafka's count)."""

    dropped: frozenset[TopicPartition] = frozenset()
    callbacks: Callbacks = ()
    next: GroupCall | None = None
    track: bool = False
    rebalanced: bool = False
    succeeded: bool = False
    error: DMQError | None = None


@dataclass(frozen=True, slots=True)
class GroupCall:
    """A group call the shell is to make for `membership` (one in flight per membership).

    kind      FIND, JOIN, HANDOVER (commit `offsets`, then report the commits and make the
              ASSIGNMENT call `answered` returns) or ASSIGNMENT
    held      the membership's partitions: no record of theirs may be handed out until the
              assignment is applied (a record returned now and then revoked would be read
              again by the next owner)
    before    what to carry out before making the call (an Outcome): a JOIN's partitions lost
              without a hand-off, already dropped from the SubscriptionState (drop their
              fetched records, call on_partitions_lost)
    """

    kind: str
    membership: Membership
    offsets: Offsets = field(default_factory=dict)
    held: frozenset[TopicPartition] = frozenset()
    before: Outcome | None = None

    @property
    def topic(self) -> str:
        return self.membership.topic


@dataclass(frozen=True, slots=True)
class Leaving:
    """A membership being left: commit `offsets` (empty: nothing to commit), then `release`
    the `owned` partitions, then LeaveGroup."""

    membership: Membership
    owned: frozenset[TopicPartition]
    offsets: Offsets


class ConsumerCore:
    """The memberships and their group calls (see the module comment). Not thread-safe: the
    shell's one application thread (or event loop) drives it; the heartbeat side only sets the
    Membership flags it reads."""

    def __init__(self, config: ConsumerConfig, subs: SubscriptionState, to_commit: ToCommit, log: KeyValueLogger,
                 *, now: float, policy: RetryPolicy | None = None) -> None:
        self.config = config
        self.subs = subs
        self._to_commit = to_commit
        self._log = log
        # group calls per topic: up to 1 s apart, so a returning coordinator is found within about a second
        self._policy = policy or RetryPolicy(config.retry_backoff_ms, MAX_GROUP_BACKOFF_MS)
        self.memberships: dict[str, Membership] = {}
        self._in_flight: dict[str, GroupCall] = {}
        self._backoff: dict[str, tuple[float, int]] = {}  # topic -> (retry at, failures in a row)
        self._next_auto_commit = now + config.auto_commit_interval_ms / 1000
        self._in_poll, self._last_poll = False, now

    def __repr__(self) -> str:
        return (f"<ConsumerCore memberships={sorted(self.memberships)} in_flight="
                f"{ {t: c.kind for t, c in sorted(self._in_flight.items())} } backing_off={sorted(self._backoff)}>")

    # -- memberships -----------------------------------------------------------------------------

    def add(self, m: Membership) -> Membership:
        self.memberships[m.topic] = m
        return m

    def unwanted(self, topics: list[str]) -> list[str]:
        """The topics of memberships a subscription to `topics` leaves."""
        return [t for t in self.memberships if t not in topics]

    def added(self, topics: list[str], coordinator: str) -> Iterator[Membership]:
        """New memberships (their groups not found yet) for the `topics` without one, each
        added as the caller reaches it (subscribe() joins one before adding the next)."""
        for t in topics:
            if t not in self.memberships:
                yield self.add(Membership.pending(t, group_id_for(t, self.config.group_id), coordinator))

    def group_ids(self) -> dict[str, str]:
        """Topic -> group id of the memberships whose group was found."""
        return {t: m.group_id for t, m in self.memberships.items() if m.found}

    # The max_poll_interval_ms watchdog (the heartbeat side) reads the poll age; 0 inside a poll.

    def poll_started(self, now: float) -> None:
        self._in_poll, self._last_poll = True, now

    def poll_ended(self, now: float) -> None:
        self._in_poll, self._last_poll = False, now

    def poll_age_s(self, now: float) -> float:
        return 0.0 if self._in_poll else now - self._last_poll

    def in_flight(self, topic: str) -> GroupCall | None:
        return self._in_flight.get(topic)

    def wants_call(self, topic: str, now: float) -> bool:
        """Whether `topic`'s membership needs a group call that may start now."""
        m = self.memberships.get(topic)
        if m is None or topic in self._in_flight or self.retry_at(topic) > now:
            return False
        return not m.found or m.rejoin_reason is not None or not m.joined or m.assignment_stale

    def retry_at(self, topic: str) -> float:
        return self._backoff.get(topic, (0.0, 0))[0]

    def next_call(self, topic: str, now: float) -> GroupCall | None:
        """The group call `topic`'s membership needs next (see the module comment), recorded
        as in flight until `answered`; None when it needs none, has one in flight, or backs off."""
        if not self.wants_call(topic, now):
            return None
        m = self.memberships[topic]
        if not m.found:
            call = GroupCall(FIND, m)
        elif m.rejoin_reason is not None or not m.joined:
            lost = self._lose(m)
            call = GroupCall(JOIN, m, before=Outcome(dropped=lost, callbacks=(("on_partitions_lost", lost),))
                             if lost else None)
        else:
            m.assignment_stale = False
            owned = frozenset(self.subs.assigned(topic))
            offsets = self._to_commit(topic, True) if owned else {}
            call = GroupCall(HANDOVER if offsets else ASSIGNMENT, m, offsets=offsets, held=owned)
        self._in_flight[topic] = call
        return call

    def begin(self, m: Membership, kind: str) -> GroupCall:
        """A FIND or JOIN the shell makes of its own accord (subscribe() waits for its first
        answers), recorded as in flight like those next_call gives."""
        call = self._in_flight[m.topic] = GroupCall(kind, m)
        return call

    def abandon(self, call: GroupCall) -> None:
        """The shell did not make `call` (a listener callback raised first): next_call gives it again."""
        if self._in_flight.get(call.topic) is call:
            del self._in_flight[call.topic]

    def _lose(self, m: Membership) -> frozenset[TopicPartition]:
        lost = frozenset(self.subs.assigned(m.topic))
        for tp in lost:
            self.subs.remove(tp)
        if lost:
            self._log.warning("partitions lost without a hand-off", group=m.group_id, member=m.member_id,
                              partitions=sorted(tp.partition for tp in lost), reason=m.rejoin_reason or "not a member")
        return lost

    # -- answers ---------------------------------------------------------------------------------

    def answered(self, call: GroupCall, now: float, response: object = None, *, error: DMQError | None = None,
                 coordinator: str = "", failed: Mapping[TopicPartition, str] | None = None) -> Outcome:
        """Apply the answer to `call`: its `response`, or the `error` it failed with. A
        HANDOVER is answered with the partitions whose commit `failed` (or did not answer
        within HANDOVER_COMMIT_WAIT_S) and why; the shell has marked the others committed.
        `coordinator`: the address a FIND answer without one falls back to."""
        m = call.membership
        if self._in_flight.get(call.topic) is call:
            del self._in_flight[call.topic]
        if self.memberships.get(call.topic) is not m:
            return Outcome()  # left meanwhile
        if error is not None:
            return self._failed(call, error, now)
        out = Outcome(succeeded=True)
        if call.kind == FIND:
            self._found(m, response, coordinator)  # type: ignore[arg-type]
        elif call.kind == JOIN:
            self._joined(m, response)  # type: ignore[arg-type]
            out.track = True
        elif call.kind == HANDOVER:
            for tp, why in (failed or {}).items():
                # Ownership already moved (expired) or the broker is away: the next owner
                # re-reads from the last good commit. Duplicates, never loss.
                self._log.warning("commit before the hand-off failed; going on without it", group=m.group_id,
                                  member=m.member_id, partition=tp.partition, error=why)
            out.next = self._in_flight[call.topic] = GroupCall(ASSIGNMENT, m, held=call.held)
            return out  # the hand-off succeeds with its GetAssignment
        else:
            self._assigned(m, response, out)  # type: ignore[arg-type]
        self._backoff.pop(call.topic, None)
        return out

    def _failed(self, call: GroupCall, error: DMQError, now: float) -> Outcome:
        m = call.membership
        if isinstance(error, UnknownMemberError):
            m.rejoin_reason = str(error)
            return Outcome()
        if call.kind == JOIN and isinstance(error, GroupNotFoundError):
            m.found = False  # deleted since it was found (an empty group can be): find it again
            return Outcome()
        if call.kind in (HANDOVER, ASSIGNMENT):
            m.assignment_stale = True  # ask again
        if not error.retriable:
            return Outcome(error=error)
        self._back_off(m, _WHAT[call.kind], error, now)
        return Outcome()

    def _back_off(self, m: Membership, what: str, error: DMQError, now: float) -> None:
        failures = self._backoff.get(m.topic, (0.0, 0))[1] + 1
        delay_s = self._policy.backoff_s(failures)
        self._backoff[m.topic] = (now + delay_s, failures)
        # A warning for the first failure in a row, then quieter: the coordinator may be away for
        # minutes, and poll() retries every second meanwhile.
        emit = self._log.warning if failures == 1 else self._log.debug
        emit("group call failed; retrying", what=what, group=m.group_id, error=str(error),
             retry_in_ms=int(delay_s * 1000))

    def _found(self, m: Membership, response: FindAnswer, coordinator: str) -> None:
        self._log.info("group found" if not response.created else "group created", topic=m.topic,
                       group=response.group_id, mode=pb.SubscriptionMode.Name(response.subscription.mode))
        m.group_id = response.group_id
        m.coordinator = response.coordinator_address or coordinator or m.coordinator
        m.subscription = response.subscription
        m.found = True

    def _joined(self, m: Membership, response: pb.JoinGroupResponse) -> None:
        # The heartbeat side compares member ids before flagging, so a flag meant for the
        # previous member id can never land on this one; attribute writes need no lock.
        m.generation = -1
        m.partitions = frozenset()
        m.rejoin_reason = None
        m.assignment_stale = True
        m.member_id = response.member_id
        m.member_secret = response.member_secret
        self._log.info("joined group", group=m.group_id, member=m.member_id, generation=response.generation)

    def _assigned(self, m: Membership, response: pb.GetAssignmentResponse, out: Outcome) -> None:
        m.generation = response.generation
        m.partitions = frozenset(response.partitions)
        m.rebalance_in_progress = response.rebalance_in_progress
        owned = set(self.subs.assigned(m.topic))
        now_owned = {TopicPartition(m.topic, p) for p in response.partitions}
        revoked, added = frozenset(owned - now_owned), frozenset(now_owned - owned)
        for tp in revoked:
            self.subs.remove(tp)
        # Never waited for in the coordinator (wait_ms=0): partitions still held by their previous
        # owner come with a later watch event / heartbeat, and consuming goes on meanwhile.
        starts = {sp.partition: sp.offset for sp in response.start_positions}
        for tp in sorted(added):
            self.subs.add(tp, starts.get(tp.partition, EARLIEST))
        if not (revoked or added):
            return
        self._log.info("assignment changed", group=m.group_id, member=m.member_id, generation=response.generation,
                       revoked=sorted(tp.partition for tp in revoked), assigned=sorted(tp.partition for tp in added),
                       owned=sorted(response.partitions), rebalance_in_progress=response.rebalance_in_progress)
        out.dropped, out.rebalanced = revoked, True
        out.callbacks = tuple((name, tps) for name, tps in (("on_partitions_revoked", revoked),
                                                            ("on_partitions_assigned", added)) if tps)

    # -- commits ---------------------------------------------------------------------------------

    def check_can_commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata],
                         memberships: Mapping[str, Membership] | None = None) -> None:
        """CommitFailedError when a partition's membership (of `memberships`, default all) lost
        its group, even when no position moved (Kafka's rule): the application must learn that
        its partitions may be gone."""
        memberships = self.memberships if memberships is None else memberships
        for topic in {tp.topic for tp in offsets}:
            m = memberships.get(topic)
            if m is not None and m.rejoin_reason is not None:
                m_tps = sorted(str(tp) for tp in offsets if tp.topic == topic)
                raise CommitFailedError(
                    f"commit of {', '.join(m_tps)} refused: this consumer is no longer in group "
                    f"{m.group_id} ({m.rejoin_reason}); its partitions may belong to another member. "
                    f"If processing a poll's records takes longer than max_poll_interval_ms "
                    f"({self.config.max_poll_interval_ms} ms), raise max_poll_interval_ms or lower "
                    f"max_poll_records ({self.config.max_poll_records}). The next poll() re-joins."
                )

    def commit_refused(self, topics: object = None) -> None:
        """A commit failed with CommitFailedError: the assignment moved; ask for it again (the
        memberships of `topics`, an iterable of names, or all of them)."""
        names = self.memberships if topics is None else topics
        for topic in names:  # type: ignore[attr-defined]
            m = self.memberships.get(topic)
            if m is not None:
                m.assignment_stale = True

    def auto_commit(self, now: float) -> Offsets:
        """The positions an auto-commit covers now (only changed ones, of memberships in their
        group), or {} when auto-commit is off or not due until auto_commit_interval_ms passed."""
        if not self.config.enable_auto_commit or now < self._next_auto_commit:
            return {}
        self._next_auto_commit = now + self.config.auto_commit_interval_ms / 1000
        return {tp: o for tp, o in self._to_commit(None, True).items()
                if (m := self.memberships.get(tp.topic)) is not None and m.joined and m.rejoin_reason is None}

    # -- leaving ---------------------------------------------------------------------------------

    def leave(self, topic: str) -> Leaving:
        """Forget `topic`'s membership (its call in flight, if any, is the shell's to cancel):
        what to commit first (auto-commit on, still a member), and the partitions it owned."""
        m = self.memberships.pop(topic)
        self._in_flight.pop(topic, None)
        self._backoff.pop(topic, None)
        owned = frozenset(self.subs.assigned(topic))
        commit = owned and self.config.enable_auto_commit and m.rejoin_reason is None and m.joined
        return Leaving(m, owned, self._to_commit(topic, True) if commit else {})

    def release(self, leaving: Leaving) -> Callbacks:
        """The left membership's partitions are no longer assigned: the listener's callbacks."""
        for tp in leaving.owned:
            self.subs.remove(tp)
        return (("on_partitions_revoked", leaving.owned),) if leaving.owned else ()

    def subscription_from_ms(self, topic: str) -> int:
        """Where a partition of `topic` with no commit starts, by subscription time (ListOffsets)."""
        m = self.memberships.get(topic)
        if m is not None:
            return m.subscription.from_ms
        return LATEST if self.config.start_latest else EARLIEST
