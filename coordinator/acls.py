"""The ACLs kept by the coordinator: stored in its metadata store, served to brokers with a version.

Every change (AddAcls / RemoveAcls) is one store transaction that also bumps the version; then the
AclView the coordinator's server decides with is replaced at once, and brokers, which see the
version in their heartbeat answers, fetch the new set with ListAcls (within a heartbeat interval).
Changes are serialized by a lock, so versions are never reused or reordered. Refusals are
DomainErrors (dmq.proto.server.domain_errors), answered by the servicer's rpc_handler.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import structlog

from dmq.coordinator.metastore.base import MetadataStore, StoreError, StoreFullError
from dmq.proto import dmq_pb2 as pb
from dmq.proto.security.acls import MAX_ACLS, Acl, AclSet
from dmq.proto.server.domain_errors import DomainError, ErrorCode
from dmq.proto.server.security.interceptor import AclView

log = structlog.get_logger(__name__)

MAX_ACLS_PER_REQUEST = 1_000


def acl_from_proto(entry: pb.AclEntry, index: int) -> Acl:
    try:
        return Acl.parse(entry.principal, entry.resource_type, entry.resource_name, entry.operation,
                         entry.permission or "allow", entry.pattern_type or "literal")
    except ValueError as e:
        raise DomainError(f"acls[{index}]: {e}", code=ErrorCode.INVALID_ARGUMENT) from e


def acl_to_proto(acl: Acl) -> pb.AclEntry:
    return pb.AclEntry(principal=acl.principal, resource_type=acl.resource_type, pattern_type=acl.pattern_type,
                       resource_name=acl.resource_name, operation=acl.operation, permission=acl.permission)


def _row(acl: Acl) -> tuple[str, ...]:
    return (acl.principal, acl.resource_type, acl.pattern_type, acl.resource_name, acl.operation, acl.permission)


class AclManager:
    def __init__(self, store: MetadataStore, view: AclView) -> None:
        self.store = store
        self.view = view
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"<AclManager {self.view!r}>"

    async def load(self) -> None:
        version, rows = await self.store.load_acls()
        acls = []
        for p, rt, pt, name, op, perm in rows:
            try:
                acls.append(Acl.parse(p, rt, name, op, perm, pt))
            except ValueError as e:
                # Stored before the names were checked (issue 26): it could never match anything,
                # so leaving it out changes no decision; the coordinator still starts.
                log.warning("stored acl ignored: it can never match", principal=p, resource_type=rt,
                            resource_name=name, error=str(e))
        self.view.replace(AclSet(acls, version))

    def _parse(self, entries: Iterable[pb.AclEntry]) -> list[Acl]:
        entries = list(entries)
        if not entries:
            raise DomainError("acls: name at least one entry", code=ErrorCode.INVALID_ARGUMENT)
        if len(entries) > MAX_ACLS_PER_REQUEST:
            raise DomainError(
                f"acls: at most {MAX_ACLS_PER_REQUEST} entries per request, got {len(entries)}", code=ErrorCode.INVALID_ARGUMENT
            )
        return [acl_from_proto(e, i) for i, e in enumerate(entries)]

    async def change(self, add: Iterable[pb.AclEntry] = (), remove: Iterable[pb.AclEntry] = ()) -> pb.AclsChangeResponse:
        adding, removing = list(add), list(remove)
        new = self._parse(adding) if adding else []
        gone = self._parse(removing) if removing else []
        async with self._lock:
            current = self.view.current
            after = (set(current.acls) | set(new)) - set(gone)
            if len(after) > MAX_ACLS:
                raise DomainError(f"at most {MAX_ACLS} ACLs in a cluster; remove some first", code=ErrorCode.RESOURCE_EXHAUSTED)
            version = current.version + 1
            try:
                changed = await self.store.change_acls([_row(a) for a in new], [_row(a) for a in gone], version)
            except StoreFullError as e:
                raise DomainError(f"ACLs not changed: {e}", code=ErrorCode.RESOURCE_EXHAUSTED) from e
            except StoreError as e:  # etcd unreachable, or another coordinator took control
                raise DomainError(f"ACLs not changed: {e}: retry", code=ErrorCode.UNAVAILABLE) from e
            self.view.replace(AclSet(after, version))
        log.info("acls changed", added=[str(a) for a in new], removed=[str(a) for a in gone], version=version)
        return pb.AclsChangeResponse(version=version, changed=changed)

    def listing(self, principal: str = "") -> pb.ListAclsResponse:
        current = self.view.current
        return pb.ListAclsResponse(
            acls=[acl_to_proto(a) for a in current.acls if not principal or a.principal == principal],
            version=current.version,
        )
