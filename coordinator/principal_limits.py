"""Per-principal limits (PrincipalLimits): every topic records the principal that created it, and
the topics and partitions a principal may hold that way are bounded (0 = unlimited). A topic's
partitions count against its creator, also those another principal adds later, so no principal
grows past its limit through someone else's requests. Refused: RESOURCE_EXHAUSTED naming the
principal, the limit and the current count. Exempt: the principals listed (super-users and the
cluster's own), and calls without a principal (security off).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from dmq.coordinator.metadata_errors import MetadataError
from dmq.coordinator.metastore.base import TopicRecord
from dmq.proto.names import shorten
from dmq.proto.server.domain_errors import ErrorCode


class PrincipalLimitExceededError(MetadataError):
    # RESOURCE_EXHAUSTED: valid, but the principal holds as much as it may (delete its unused topics).
    code = ErrorCode.RESOURCE_EXHAUSTED


@dataclass(frozen=True, slots=True)
class PrincipalLimits:
    """How many topics, and partitions of those topics, one principal may have created (0 = no
    limit). `exempt`: principals no limit applies to (the super-users and the cluster principal)."""

    max_topics: int = 0
    max_partitions: int = 0
    exempt: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        for name in ("max_topics", "max_partitions"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0 (0 = unlimited), got {value!r}")

    def applies_to(self, principal: str | None) -> bool:
        return principal is not None and principal not in self.exempt and bool(self.max_topics or self.max_partitions)


def check_principal_limits(
    limits: PrincipalLimits, topics: Iterable[TopicRecord], caller: str | None, owner: str | None, topic: str, *,
    new_topics: int, new_partitions: int,
) -> None:
    """Refuse a change that would take `owner` (the creator the topic counts against) past its
    limits; nothing when the caller or the owner is exempt or unknown."""
    if not (limits.applies_to(caller) and limits.applies_to(owner)):
        return
    mine = [t for t in topics if t.creator == owner]
    held = sum(t.partition_count for t in mine)
    if limits.max_topics and new_topics and len(mine) + new_topics > limits.max_topics:
        raise PrincipalLimitExceededError(
            f"principal {owner!r} has created {len(mine)} topics; the limit (max_topics_per_principal) "
            f"is {limits.max_topics}: cannot create {shorten(topic)}; delete unused topics"
        )
    if limits.max_partitions and held + new_partitions > limits.max_partitions:
        raise PrincipalLimitExceededError(
            f"principal {owner!r} holds {held} partitions in the topics it created; adding {new_partitions} "
            f"to {shorten(topic)} would exceed the limit (max_partitions_per_principal) of "
            f"{limits.max_partitions}: delete unused topics"
        )
