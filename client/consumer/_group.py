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


import grpc

from dmq.client._log import get_logger
from dmq.client._cluster import Cluster
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
from dmq.proto.names import group_id_for  # noqa: F401 - re-exported for the consumers

log = get_logger(__name__)

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

    # Each RPC comes as start_*() -> grpc future (with its own request_timeout_ms deadline, so it
    # completes whatever the caller's poll timeout) and finish_*(future) on the application thread,
    # which applies the answer or raises DMQError. poll() starts one, returns when its own
    # timeout is up, and finishes the call in a later poll() once the future is done.

    def start_find(self, topic: str) -> grpc.Future:
        c = self._config
        request = pb.FindOrCreateGroupRequest(
            topic=topic,
            app_id=c.group_id,
            subscription_mode=_MODES[c.subscription_mode],
            subscription_from_ms=c.subscription_from_ms or 0,
        )
        return self._stub().FindOrCreateGroup.future(request, timeout=self._timeout_s)

    def finish_find(self, m: Membership, future: grpc.Future) -> None:
        c = self._config
        try:
            response = future.result()
        except grpc.RpcError as e:
            raise from_rpc_error(
                e,
                context=(f"FindOrCreateGroup for topic {m.topic!r}, group_id {c.group_id!r} "
                         f"at the coordinator {self._cluster.bootstrap}"),
                overrides={
                    grpc.StatusCode.NOT_FOUND: TopicNotFoundError,
                    grpc.StatusCode.UNAVAILABLE: CoordinatorUnavailableError,
                },
            ) from e
        log.info(
            "group found" if not response.created else "group created",
            topic=m.topic, group=response.group_id, mode=pb.SubscriptionMode.Name(response.subscription.mode),
        )
        m.group_id = response.group_id
        m.coordinator = response.coordinator_address or self._cluster.bootstrap
        m.subscription = response.subscription
        m.found = True

    def find_or_create(self, topic: str) -> Membership:
        m = Membership.pending(topic, group_id_for(topic, self._config.group_id), self._cluster.bootstrap)
        self.finish_find(m, self.start_find(topic))
        return m

    def start_join(self, m: Membership) -> grpc.Future:
        c = self._config
        request = pb.JoinGroupRequest(
            group_id=m.group_id,
            consumer_id=self.consumer_id,
            client_id=c.client_id,
            session_timeout_ms=c.session_timeout_ms,
            max_poll_interval_ms=c.max_poll_interval_ms,
        )
        return self._stub(m).JoinGroup.future(request, timeout=self._timeout_s)

    def finish_join(self, m: Membership, future: grpc.Future) -> None:
        try:
            response = future.result()
        except grpc.RpcError as e:
            raise from_rpc_error(
                e,
                context=f"JoinGroup {m.group_id} at the coordinator {m.coordinator}",
                overrides={
                    grpc.StatusCode.NOT_FOUND: GroupNotFoundError,
                    grpc.StatusCode.UNAVAILABLE: CoordinatorUnavailableError,
                },
            ) from e
        # The heartbeat thread compares member ids before flagging, so a flag meant for the
        # previous member id can never land on this one; attribute writes need no lock.
        m.generation = -1
        m.partitions = frozenset()
        m.rejoin_reason = None
        m.assignment_stale = True
        m.member_id = response.member_id
        m.member_secret = response.member_secret
        log.info("joined group", group=m.group_id, member=m.member_id, generation=response.generation)

    def join(self, m: Membership) -> None:
        self.finish_join(m, self.start_join(m))

    def start_get_assignment(self, m: Membership, wait_ms: int) -> grpc.Future:
        request = pb.GetAssignmentRequest(group_id=m.group_id, member_id=m.member_id, wait_ms=wait_ms,
                                          member_secret=m.member_secret)
        # Bounded by the session too: poll() holds the membership's records back while this is
        # in flight, and a member must hear from the coordinator within its session anyway.
        timeout_s = min(self._timeout_s, self._config.session_timeout_ms / 1000)
        return self._stub(m).GetAssignment.future(request, timeout=timeout_s + wait_ms / 1000)

    def finish_get_assignment(self, m: Membership, future: grpc.Future) -> pb.GetAssignmentResponse:
        try:
            response = future.result()
        except grpc.RpcError as e:
            raise self._member_error(e, "GetAssignment", m) from e
        m.generation = response.generation
        m.partitions = frozenset(response.partitions)
        m.rebalance_in_progress = response.rebalance_in_progress
        return response

    def get_assignment(self, m: Membership, wait_ms: int) -> pb.GetAssignmentResponse:
        return self.finish_get_assignment(m, self.start_get_assignment(m, wait_ms))

    def leave(self, m: Membership, timeout_s: float | None = None) -> None:
        """Leave the group (its partitions are released at once). Errors are logged, not raised:
        leaving is best effort, the session timeout is the backstop. Waits at most `timeout_s`
        (default min(request_timeout_ms, 5 s))."""
        if not m.joined:
            return
        member_id = m.member_id
        m.member_id = ""
        m.partitions = frozenset()
        wait_s = min(self._timeout_s, 5.0) if timeout_s is None else max(0.001, timeout_s)
        try:
            self._stub(m).LeaveGroup(
                pb.LeaveGroupRequest(group_id=m.group_id, member_id=member_id, member_secret=m.member_secret),
                timeout=wait_s,
            )
            log.info("left group", group=m.group_id, member=member_id)
        except grpc.RpcError as e:
            err = from_rpc_error(e, context=f"LeaveGroup {m.group_id}")
            log.warning("leave failed; the session timeout will remove the member", group=m.group_id,
                        member=member_id, error=str(err))
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
