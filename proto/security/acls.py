"""Access-control entries and the decision they make.

An ACL is (principal or "*", resource type, pattern type, resource name, operation, allow/deny):
  - resource types: topic, group, cluster (the one resource named "cluster");
  - pattern types: literal (the name itself; the literal name "*" matches every name) or prefixed
    (every name starting with it);
  - operations: read, write, create, delete, describe, alter.

A decision (`AclSet.allows`), as Kafka's authorizer makes it:
  1. a deny entry matching the principal, resource and operation refuses, whatever allows it;
  2. else an allow entry matching it allows; an allow of read, write, delete or alter also allows
     describe (who may read a topic may see it);
  3. else refused: no entry, no access.
Super-users and the cluster principal are decided before the ACLs (dmq.proto.server.security.interceptor).

An AclSet is immutable and carries the version it was read at; decisions are memoized per set
(bounded), so the per-call cost does not grow with the number of entries.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from dmq.proto import names
from dmq.proto.security.tokens import check_principal

__all__ = ["Acl", "AclSet", "Operation", "PatternType", "Permission", "ResourceType", "CLUSTER_RESOURCE"]

CLUSTER_RESOURCE = "cluster"
MAX_RESOURCE_NAME_CHARS = 512
MAX_ACLS = 100_000  # bounded: every broker keeps a copy
DECISION_CACHE_ENTRIES = 65_536


class ResourceType(enum.StrEnum):
    TOPIC = "topic"
    GROUP = "group"
    CLUSTER = "cluster"


class Operation(enum.StrEnum):
    READ = "read"
    WRITE = "write"
    CREATE = "create"
    DELETE = "delete"
    DESCRIBE = "describe"
    ALTER = "alter"


class PatternType(enum.StrEnum):
    LITERAL = "literal"
    PREFIXED = "prefixed"


class Permission(enum.StrEnum):
    ALLOW = "allow"
    DENY = "deny"


IMPLIES_DESCRIBE = frozenset({Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER})


def _choice(enum_type: type[enum.StrEnum], value: str, field: str) -> str:
    try:
        return enum_type(value.lower() if isinstance(value, str) else value)
    except ValueError:
        choices = ", ".join(m.value for m in enum_type)
        raise ValueError(f"{field} must be one of {choices}, got {str(value)[:40]!r}") from None


def _check_resource_name(rtype: ResourceType, ptype: PatternType, name: str) -> None:
    """A name (or prefix) some resource can have, by the rules of dmq.proto.names: an entry no
    resource can ever match (the topic "\\u202e" or "%s%n") would be listed as if it granted
    something."""
    field = "resource_name"
    if rtype is ResourceType.TOPIC:
        if ptype is PatternType.LITERAL:
            names.check_topic_name(name, field=field)
        else:  # a prefix: the characters and length of a topic name ("." starts ".internal")
            names.check_topic_name(name if name not in (".", "..") else name + "x", field=field)
    elif rtype is ResourceType.GROUP:
        names.check_group_id(name, field=field)


@dataclass(frozen=True, slots=True, order=True)
class Acl:
    principal: str
    resource_type: ResourceType
    pattern_type: PatternType
    resource_name: str
    operation: Operation
    permission: Permission

    @classmethod
    def parse(
        cls,
        principal: str,
        resource_type: str,
        resource_name: str,
        operation: str,
        permission: str = "allow",
        pattern_type: str = "literal",
    ) -> Acl:
        """A validated entry from words (those of `dmq acls` and the AclEntry message); ValueError
        naming the field otherwise."""
        if principal != "*":
            check_principal(principal, "principal")
        rtype = ResourceType(_choice(ResourceType, resource_type, "resource_type"))
        ptype = PatternType(_choice(PatternType, pattern_type or "literal", "pattern_type"))
        if not isinstance(resource_name, str) or not 0 < len(resource_name) <= MAX_RESOURCE_NAME_CHARS:
            raise ValueError(f"resource_name must be 1..{MAX_RESOURCE_NAME_CHARS} characters")
        if rtype is ResourceType.CLUSTER and resource_name not in (CLUSTER_RESOURCE, "*"):
            raise ValueError(f"the cluster resource is named {CLUSTER_RESOURCE!r}, got {resource_name[:40]!r}")
        if ptype is PatternType.PREFIXED and resource_name == "*":
            raise ValueError("a prefixed ACL needs a prefix; '*' is the literal name matching every name")
        if resource_name != "*":
            _check_resource_name(rtype, ptype, resource_name)
        return cls(
            principal, rtype, ptype, resource_name,
            Operation(_choice(Operation, operation, "operation")),
            Permission(_choice(Permission, permission, "permission")),
        )

    def matches_resource(self, resource_type: ResourceType, name: str) -> bool:
        if self.resource_type is not resource_type:
            return False
        if self.pattern_type is PatternType.PREFIXED:
            return name.startswith(self.resource_name)
        return self.resource_name in ("*", name)

    def __str__(self) -> str:
        pattern = "prefix " if self.pattern_type is PatternType.PREFIXED else ""
        return (f"{self.permission} {self.principal} {self.operation} on {self.resource_type} "
                f"{pattern}{self.resource_name!r}")


class AclSet:
    def __init__(self, acls: Iterable[Acl] = (), version: int = 0) -> None:
        self.acls = tuple(sorted(set(acls)))
        if len(self.acls) > MAX_ACLS:
            raise ValueError(f"at most {MAX_ACLS} ACLs, got {len(self.acls)}")
        self.version = version
        self._by_principal: dict[str, list[Acl]] = {}
        for acl in self.acls:
            self._by_principal.setdefault(acl.principal, []).append(acl)
        self._decisions: dict[tuple[str, ResourceType, str, Operation], bool] = {}

    def __repr__(self) -> str:
        return f"<AclSet version={self.version} acls={len(self.acls)}>"

    def __len__(self) -> int:
        return len(self.acls)

    def allows(self, principal: str, resource_type: ResourceType, name: str, operation: Operation) -> bool:
        key = (principal, resource_type, name, operation)
        decided = self._decisions.get(key)
        if decided is None:
            decided = self._decide(principal, resource_type, name, operation)
            if len(self._decisions) >= DECISION_CACHE_ENTRIES:
                self._decisions.clear()  # bounded under hostile names; refilled as calls come
            self._decisions[key] = decided
        return decided

    def _decide(self, principal: str, resource_type: ResourceType, name: str, operation: Operation) -> bool:
        allowed = False
        for acl in (*self._by_principal.get(principal, ()), *self._by_principal.get("*", ())):
            if not acl.matches_resource(resource_type, name):
                continue
            if acl.permission is Permission.DENY:
                if acl.operation is operation:
                    return False  # deny wins
            elif acl.operation is operation or (operation is Operation.DESCRIBE and acl.operation in IMPLIES_DESCRIBE):
                allowed = True
        return allowed
