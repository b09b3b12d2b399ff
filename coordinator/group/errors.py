"""Errors raised by the group machine.

Each class is a DomainError (dmq.proto.server.domain_errors) whose ``code`` the servers' one error
mapping (dmq.proto.server.server_errors) turns into a gRPC status, so this pure package never imports
grpc. Messages are meant for a person and say what to do.

Contract: a handler that raises has changed nothing (it validates before it mutates).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from dmq.proto import error_details
from dmq.proto.server.domain_errors import DomainError, ErrorCode


class GroupError(DomainError):
    """Root of the group machine's errors. `reason` (a dmq.proto.error_details reason) is sent with
    the status where the code alone does not tell a client what happened."""

    #: True when the same request may succeed after the client refreshes its view
    #: (re-join, fetch the assignment) and retries.
    retriable: ClassVar[bool] = False


class InvalidRequestError(GroupError):
    code = ErrorCode.INVALID_ARGUMENT


class ConsumerGroupNotFoundError(GroupError):
    code = ErrorCode.NOT_FOUND

    def __init__(self, group_id: str) -> None:
        # Read by people (`dmq groups describe`), so no RPC names: the group appears when a
        # consumer subscribes (a client's FindOrCreateGroup).
        super().__init__(
            f"group {group_id!r} not found: a group id is G_<topic>_<app_id>, and a group appears when a "
            "consumer of that application subscribes to the topic"
        )
        self.group_id = group_id


class UnknownGroupMemberError(GroupError):
    """The member id is not (or no longer) in the group: it left, expired, or the coordinator
    restarted (membership is in memory only). The client re-joins."""

    code = ErrorCode.NOT_FOUND
    retriable = True

    def __init__(self, group_id: str, member_id: str) -> None:
        super().__init__(
            f"member {member_id!r} is not in group {group_id!r} (left, expired or the coordinator "
            f"restarted): join the group again"
        )
        self.group_id = group_id
        self.member_id = member_id


class MemberSecretError(GroupError):
    """A request for a member without the secret JoinGroup issued to it: whoever sent it learned
    the member id (DescribeGroup shows ids) but is not that member. Not retriable: re-joining
    makes a new member, it does not let anyone act as this one."""

    code = ErrorCode.PERMISSION_DENIED

    def __init__(self, group_id: str, member_id: str) -> None:
        super().__init__(
            f"member {member_id!r} of group {group_id!r}: the member_secret is missing or wrong "
            "(only the member, with the secret its JoinGroup answer gave it, may act as it)"
        )
        self.group_id = group_id
        self.member_id = member_id


class NotOwnerError(GroupError):
    """A commit for partitions the member does not own under the generation it names."""

    code = ErrorCode.FAILED_PRECONDITION
    reason = error_details.NOT_OWNER
    retriable = True

    def __init__(self, group_id: str, member_id: str, reasons: Mapping[int, str]) -> None:
        detail = "; ".join(f"partition {p}: {why}" for p, why in sorted(reasons.items()))
        super().__init__(
            f"stale generation / not owner: fetch your assignment (group {group_id!r}, "
            f"member {member_id!r}: {detail})"
        )
        self.group_id = group_id
        self.member_id = member_id
        self.reasons = dict(reasons)


class ConsumerGroupNotEmptyError(GroupError):
    code = ErrorCode.FAILED_PRECONDITION

    def __init__(self, group_id: str, member_count: int, action: str) -> None:
        super().__init__(
            f"group {group_id!r} has {member_count} active member(s): stop its consumers before "
            f"you {action}"
        )
        self.group_id = group_id


class GroupFullError(GroupError):
    code = ErrorCode.RESOURCE_EXHAUSTED

    def __init__(self, group_id: str, max_members: int) -> None:
        super().__init__(
            f"group {group_id!r} already has {max_members} members (the coordinator's "
            f"max_members): stop some consumers or raise max_members"
        )


class GroupIdCollisionError(GroupError):
    """``G_<topic>_<app_id>`` is ambiguous when names contain ``_``: two (topic, app_id) pairs
    can map to the same group id. The first one keeps it."""

    code = ErrorCode.FAILED_PRECONDITION

    def __init__(self, group_id: str, existing_topic: str, topic: str) -> None:
        super().__init__(
            f"group id {group_id!r} already belongs to topic {existing_topic!r}, not {topic!r}: "
            f"choose another app_id"
        )


class IllegalStateTransitionError(GroupError):
    """A bug in the machine, never a client's fault."""

    code = ErrorCode.INTERNAL
