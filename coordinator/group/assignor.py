"""Partition assignors: stateless functions from (members, partitions) to an assignment.

An assignor keeps no state between calls (no class-level caches, no "previous assignment"):
the same inputs always give the same output, whatever ran before. The group machine owns all
state and only asks an assignor for the *target* of a new generation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class PartitionAssignor(Protocol):
    """Computes a target assignment for one topic.

    Contract for every implementation:
    - every member in ``members`` appears in the result (with an empty list if it gets nothing);
    - every partition in ``partitions`` is assigned to exactly one member when there is at
      least one member, and to none when there are none;
    - the result depends only on the arguments (same inputs, same output).
    """

    name: str

    def assign(self, members: Sequence[str], partitions: Sequence[int]) -> dict[str, list[int]]: ...


def range_assign(members: Sequence[str], partitions: Sequence[int]) -> dict[str, list[int]]:
    """Range assignment: contiguous blocks of sorted partitions to sorted members.

    Invariant: with ``M`` members and ``P`` partitions, both sorted, each member gets a
    contiguous run of ``P // M`` partitions and the first ``P % M`` members get one extra, so
    sizes differ by at most one and the larger runs come first. Every partition is assigned
    exactly once; with no members nothing is assigned; with more members than partitions the
    last ``M - P`` members get empty lists.

    Worked example, 10 partitions and members ``a, b, c``: ``10 // 3 = 3`` each and
    ``10 % 3 = 1`` extra, which goes to ``a``::

        a -> [0, 1, 2, 3]     (4)
        b -> [4, 5, 6]        (3)
        c -> [7, 8, 9]        (3)

    If ``b`` then fails, ``10 // 2 = 5`` each with no remainder::

        a -> [0, 1, 2, 3, 4]
        c -> [5, 6, 7, 8, 9]

    Members and partitions are sorted here, so callers may pass them in any order; duplicates
    are a caller bug and raise ``ValueError`` rather than being silently merged.
    """
    sorted_members = sorted(members)
    sorted_partitions = sorted(partitions)
    if len(set(sorted_members)) != len(sorted_members):
        raise ValueError(f"duplicate member ids in {sorted_members!r}")
    if len(set(sorted_partitions)) != len(sorted_partitions):
        raise ValueError(f"duplicate partitions in {sorted_partitions!r}")

    result: dict[str, list[int]] = {}
    if not sorted_members:
        return result
    per_member, extra = divmod(len(sorted_partitions), len(sorted_members))
    start = 0
    for index, member in enumerate(sorted_members):
        count = per_member + (1 if index < extra else 0)
        result[member] = sorted_partitions[start : start + count]
        start += count
    return result


class RangeAssignor:
    """`PartitionAssignor` wrapper around `range_assign` (no state, safe to share)."""

    __slots__ = ()
    name = "range"

    def assign(self, members: Sequence[str], partitions: Sequence[int]) -> dict[str, list[int]]:
        return range_assign(members, partitions)

    def __repr__(self) -> str:
        return "RangeAssignor()"
