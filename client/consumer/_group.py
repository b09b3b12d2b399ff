"""The group client: one membership per subscribed topic, and the RPCs that change it.

Who does what (DESIGN.md "Consumer groups", "Client")::

    application thread (poll, subscribe, close)   heartbeat thread (_heartbeat.py)
    -------------------------------------------   ---------------------------------
    FindOrCreateGroup, JoinGroup                  Heartbeat every heartbeat_interval_ms
    GetAssignment (after committing)              WatchGroup stream
    LeaveGroup                                    sets Membership flags, wakes poll()

The heartbeat thread never commits and never fetches an assignment: a partition changes hands
only when its owner calls GetAssignment, and that must happen after the owner committed the
records it already returned, on the thread that returned them.

Membership flags (written by the heartbeat thread, read and cleared by poll())::

    assignment_stale  a new generation or an assignment change: call GetAssignment
    rejoin_reason     the coordinator forgot the member (NOT_FOUND: session expired or
                      coordinator restarted) or this client left after max_poll_interval_ms:
                      the partitions are lost, join again
"""

from __future__ import annotations

from typing import Any

import grpc

from dmq.client._cluster import Cluster
from dmq.client._log import get_logger
from dmq.client.consumer._config import ConsumerConfig
from dmq.client.errors import (
    CoordinatorUnavailableError,
    DMQError,
    GroupNotFoundError,
    TopicNotFoundError,
    UnknownMemberError,
    from_rpc_error,
)
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto.names import group_id_for as group_id_for  # re-exported for the consumers

log = get_logger(__name__)

# The group calls of a membership (see _core.py for when each is made).
FIND, JOIN, HANDOVER, ASSIGNMENT = "find", "join", "handover", "assignment"

_MODES = {
    None: pb.SUBSCRIPTION_MODE_UNSPECIFIED,
    "all": pb.SUBSCRIPTION_MODE_ALL,
    "new": pb.SUBSCRIPTION_MODE_NEW,
    "timestamp": pb.SUBSCRIPTION_MODE_TIMESTAMP,
}


class Membership:
    """This consumer's membership of one topic's group."""

    def __init__(self, topic: str, group_id: str, coordinator: str, subscription: pb.Subscription) -> None:
        self.topic = topic
        self.group_id = group_id
        self.coordinator = coordinator
        self.subscription = subscription
        self.found = True  # False until FindOrCreateGroup answered (see Membership.pending)
        self.member_id = ""  # "" until joined
        # Issued with the member id by JoinGroup: every request of the member carries it.
        self.member_secret = ""
        self.generation = -1  # the generation of the last GetAssignment
        self.partitions: frozenset[int] = frozenset()
        self.rebalance_in_progress = False
        # flags written by the heartbeat thread
        self.assignment_stale = False
        self.rejoin_reason: str | None = None

    def __repr__(self) -> str:
        return (
            f"<Membership group={self.group_id!r} member={self.member_id!r} generation={self.generation} "
            f"partitions={sorted(self.partitions)} stale={self.assignment_stale} rejoin={self.rejoin_reason!r}>"
        )

    @classmethod
    def pending(cls, topic: str, group_id: str, coordinator: str) -> Membership:
        """A membership whose group has not been found yet (the coordinator was not reachable
        when subscribe() ran): poll() calls FindOrCreateGroup first."""
        m = cls(topic, group_id, coordinator, pb.Subscription())
        m.found = False
        return m

    @property
    def joined(self) -> bool:
        return bool(self.member_id)


class GroupClient:
    """Synchronous group RPCs for the application thread; errors come out as DMQError."""

    def __init__(self, cluster: Cluster, config: ConsumerConfig, consumer_id: str) -> None:
        self._cluster = cluster
        self._config = config
        self.consumer_id = consumer_id
        self._timeout_s = config.request_timeout_ms / 1000

    def _stub(self, m: Membership | None = None) -> pb_grpc.GroupCoordinatorStub:
        return self._cluster.group_stub(m.coordinator if m is not None else None)

    # Each call comes as request() (the RPC's name, its request and timeout) and error() (a
    # failure as DMQError); the sync consumer starts it as a grpc future with start() and reads
    # it with result() in a later poll(), the asyncio consumer awaits it. What an answer means
    # is the ConsumerCore's (_core.py).

    def request(self, kind: str, m: Membership) -> tuple[str, Any, float]:
        """The group call `kind` of `m`: (RPC name, request, timeout in seconds)."""
        c = self._config
        if kind == FIND:
            return "FindOrCreateGroup", pb.FindOrCreateGroupRequest(
                topic=m.topic,
                app_id=c.group_id,
                subscription_mode=_MODES[c.subscription_mode],
                subscription_from_ms=c.subscription_from_ms or 0,
            ), self._timeout_s
        if kind == JOIN:
            return "JoinGroup", pb.JoinGroupRequest(
                group_id=m.group_id,
                consumer_id=self.consumer_id,
                client_id=c.client_id,
                session_timeout_ms=c.session_timeout_ms,
                max_poll_interval_ms=c.max_poll_interval_ms,
            ), self._timeout_s
        # Never wait in the coordinator (wait_ms=0): partitions still held by their previous owner
        # come with a later watch event / heartbeat. Bounded by the session too: the membership's
        # records are held back while this is in flight, and a member must hear from the
        # coordinator within its session anyway.
        request = pb.GetAssignmentRequest(group_id=m.group_id, member_id=m.member_id, wait_ms=0,
                                          member_secret=m.member_secret)
        return "GetAssignment", request, min(self._timeout_s, c.session_timeout_ms / 1000)

    def error(self, kind: str, m: Membership, e: grpc.RpcError) -> DMQError:
        """The group call's failure as the DMQError the consumers act on (see _core.py)."""
        if kind == FIND:
            return from_rpc_error(
                e,
                context=(f"FindOrCreateGroup for topic {m.topic!r}, group_id {self._config.group_id!r} "
                         f"at the coordinator {self._cluster.bootstrap}"),
                overrides={
                    grpc.StatusCode.NOT_FOUND: TopicNotFoundError,
                    grpc.StatusCode.UNAVAILABLE: CoordinatorUnavailableError,
                },
            )
        if kind == JOIN:
            return from_rpc_error(
                e,
                context=f"JoinGroup {m.group_id} at the coordinator {m.coordinator}",
                overrides={
                    grpc.StatusCode.NOT_FOUND: GroupNotFoundError,
                    grpc.StatusCode.UNAVAILABLE: CoordinatorUnavailableError,
                },
            )
        return self._member_error(e, "GetAssignment", m)

    def address(self, kind: str, m: Membership) -> str | None:
        """Where the call goes: FindOrCreateGroup to the bootstrap coordinator, the others to the group's."""
        return None if kind == FIND else m.coordinator

    def start(self, kind: str, m: Membership) -> grpc.Future[Any]:
        """The call as a grpc future, with its own deadline (it completes whatever poll()'s timeout)."""
        method, request, timeout_s = self.request(kind, m)
        # the answer's type depends on `kind`: result() hands it to code that knows which
        stub = self._cluster.group_stub(self.address(kind, m))
        future: grpc.Future[Any] = getattr(stub, method).future(request, timeout=timeout_s)
        return future

    def result(self, kind: str, m: Membership, future: grpc.Future[Any]) -> Any:
        """A finished call's answer; DMQError when it failed."""
        try:
            return future.result()
        except grpc.RpcError as e:
            raise self.error(kind, m, e) from e

    @staticmethod
    def leave_request(m: Membership) -> pb.LeaveGroupRequest | None:
        """The LeaveGroup of m (None: not a member), which forgets m's member id and partitions."""
        if not m.joined:
            return None
        member_id = m.member_id
        m.member_id = ""
        m.partitions = frozenset()
        return pb.LeaveGroupRequest(group_id=m.group_id, member_id=member_id, member_secret=m.member_secret)

    def leave(self, m: Membership, timeout_s: float | None = None) -> None:
        """Leave the group (its partitions are released at once). Errors are logged, not raised:
        leaving is best effort, the session timeout is the backstop. Waits at most `timeout_s`
        (default min(request_timeout_ms, 5 s))."""
        request = self.leave_request(m)
        if request is None:
            return
        wait_s = min(self._timeout_s, 5.0) if timeout_s is None else max(0.001, timeout_s)
        try:
            self._stub(m).LeaveGroup(request, timeout=wait_s)
            log.info("left group", group=m.group_id, member=request.member_id)
        except grpc.RpcError as e:
            err = from_rpc_error(e, context=f"LeaveGroup {m.group_id}")
            log.warning("leave failed; the session timeout will remove the member", group=m.group_id,
                        member=request.member_id, error=str(err))
        except ValueError:  # channel closed
            pass

    def _member_error(self, e: grpc.RpcError, rpc: str, m: Membership) -> DMQError:
        return from_rpc_error(
            e,
            context=f"{rpc} {m.group_id} as {m.member_id}",
            overrides={
                grpc.StatusCode.NOT_FOUND: UnknownMemberError,
                grpc.StatusCode.UNAVAILABLE: CoordinatorUnavailableError,
            },
        )
