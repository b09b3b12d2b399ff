"""AdminClient's access-control operations: add, remove and list ACL entries (issue 18).

The entries are `dmq.proto.security.acls.Acl` (validated words: principal or "*", resource type
topic / group / cluster, literal or prefixed name, operation, allow or deny); the coordinator keeps
them with a version that brokers follow. A mixin, as the queue and trace operations are.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from dmq.proto import dmq_pb2 as pb
from dmq.proto.security.acls import Acl

__all__ = ["AclAdminMixin", "AclChange", "AclList"]


@dataclass(frozen=True, slots=True)
class AclChange:
    version: int  # the ACLs' version after the change
    changed: int  # entries added or removed (those already present / absent do not count)


@dataclass(frozen=True, slots=True)
class AclList:
    version: int
    acls: tuple[Acl, ...]


def _to_proto(a: Acl) -> pb.AclEntry:
    return pb.AclEntry(principal=a.principal, resource_type=a.resource_type, pattern_type=a.pattern_type,
                       resource_name=a.resource_name, operation=a.operation, permission=a.permission)


def _from_proto(e: pb.AclEntry) -> Acl:
    return Acl.parse(e.principal, e.resource_type, e.resource_name, e.operation, e.permission, e.pattern_type)


class AclAdminMixin:
    def _metadata_call(self, method: str, request: Any, what: str) -> Any:  # AdminClient's
        raise NotImplementedError

    def add_acls(self, acls: Iterable[Acl]) -> AclChange:
        answer = self._metadata_call("AddAcls", pb.AddAclsRequest(acls=[_to_proto(a) for a in acls]), "add ACLs")
        return AclChange(answer.version, answer.changed)

    def remove_acls(self, acls: Iterable[Acl]) -> AclChange:
        """Remove exactly these entries (as list_acls shows them)."""
        answer = self._metadata_call("RemoveAcls", pb.RemoveAclsRequest(acls=[_to_proto(a) for a in acls]),
                                     "remove ACLs")
        return AclChange(answer.version, answer.changed)

    def list_acls(self, principal: str | None = None) -> AclList:
        """Every entry, or one principal's."""
        answer = self._metadata_call("ListAcls", pb.ListAclsRequest(principal=principal or ""), "list ACLs")
        return AclList(answer.version, tuple(_from_proto(e) for e in answer.acls))
