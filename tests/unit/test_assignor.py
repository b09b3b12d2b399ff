"""Range assignor: table-driven, one row per scenario."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dmq.coordinator.group import PartitionAssignor, RangeAssignor, range_assign

SCENARIOS = {
    "ten_partitions_three_members": (
        ["m-a", "m-b", "m-c"],
        range(10),
        {"m-a": [0, 1, 2, 3], "m-b": [4, 5, 6], "m-c": [7, 8, 9]},
    ),
    "reassignment_when_second_member_removed": (
        ["m-a", "m-c"],
        range(10),
        {"m-a": [0, 1, 2, 3, 4], "m-c": [5, 6, 7, 8, 9]},
    ),
    # Kafka RangeAssignor javadoc: C0, C1 and 3 partitions per topic -> C0 [p0, p1], C1 [p2]
    # (the same for t0 and t1; we assign one topic at a time).
    "kafka_javadoc_two_consumers_three_partitions": (
        ["C0", "C1"],
        range(3),
        {"C0": [0, 1], "C1": [2]},
    ),
    "no_members_assigns_nothing": ([], range(5), {}),
    "more_members_than_partitions_last_get_none": (
        ["a", "b", "c", "d"],
        range(2),
        {"a": [0], "b": [1], "c": [], "d": []},
    ),
    "no_partitions_every_member_gets_empty": (["a", "b"], [], {"a": [], "b": []}),
    "single_member_gets_all": (["only"], range(4), {"only": [0, 1, 2, 3]}),
    "equal_split_no_remainder": (["a", "b"], range(4), {"a": [0, 1], "b": [2, 3]}),
    "inputs_sorted_before_assigning": (
        ["c", "a", "b"],
        [5, 3, 4, 0, 2, 1],
        {"a": [0, 1], "b": [2, 3], "c": [4, 5]},
    ),
    "sorting_is_lexicographic_on_member_ids": (
        ["m-10", "m-9"],
        range(3),
        {"m-10": [0, 1], "m-9": [2]},
    ),
}


@pytest.mark.parametrize(
    ("members", "partitions", "expected"), SCENARIOS.values(), ids=list(SCENARIOS)
)
def test_range_assign(members: list[str], partitions: range, expected: dict[str, list[int]]) -> None:
    assert range_assign(members, partitions) == expected


@pytest.mark.parametrize(
    ("members", "partitions"),
    [(["a", "a"], range(3)), (["a"], [1, 1])],
    ids=["duplicate_members", "duplicate_partitions"],
)
def test_duplicates_are_rejected(members: list[str], partitions: list[int]) -> None:
    with pytest.raises(ValueError, match="duplicate"):
        range_assign(members, partitions)


def test_range_assignor_satisfies_protocol_and_is_stateless() -> None:
    assignor: PartitionAssignor = RangeAssignor()
    assert assignor.name == "range"
    first = assignor.assign(["b", "a"], range(5))
    assignor.assign(["x"], range(100))  # an unrelated call must not influence the next one
    assert assignor.assign(["a", "b"], range(5)) == first == {"a": [0, 1, 2], "b": [3, 4]}
    assert repr(assignor) == "RangeAssignor()"


@settings(deadline=None, max_examples=200)
@given(
    members=st.sets(st.text(min_size=1, max_size=6), max_size=12),
    partition_count=st.integers(min_value=0, max_value=64),
)
def test_range_invariant(members: set[str], partition_count: int) -> None:
    result = range_assign(list(members), range(partition_count))
    assert set(result) == members
    assigned = [p for ps in result.values() for p in ps]
    if members:
        assert sorted(assigned) == list(range(partition_count))  # each exactly once
        sizes = [len(result[m]) for m in sorted(members)]
        per, extra = divmod(partition_count, len(members))
        assert sizes == [per + 1] * extra + [per] * (len(members) - extra)
        for ps in result.values():  # contiguous runs
            assert ps == list(range(ps[0], ps[0] + len(ps))) if ps else True
    else:
        assert assigned == []
