"""Key partitioning is part of the wire contract: these pinned values must never change."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dmq.client._partitioner import StickyChooser, crc32_partition
from tests.threads import run_in_threads

# (key, partition count, partition). Computed once with CRC-32/ISO-HDLC; a change here moves
# every keyed record of every existing topic to another partition.
PINNED = [
    (b"", 8, 0),
    (b"a", 8, 3),
    (b"a", 10, 7),
    (b"123456789", 8, 6),
    (b"123456789", 100, 62),
    (b"customer-7", 3, 2),
    (b"customer-7", 100, 20),
    (b"user-42", 10, 5),
    (b"\x00\xff", 100, 94),
    ("ключ".encode(), 10, 8),
]


@pytest.mark.parametrize(("key", "count", "expected"), PINNED)
def test_pinned_partitions(key: bytes, count: int, expected: int) -> None:
    assert crc32_partition(key, count) == expected


def test_hash_is_the_ieee_crc32_check_value() -> None:
    # 0xCBF43926 is the published check value of CRC-32/ISO-HDLC for "123456789": the same
    # function as Java's CRC32 and Go's crc32.ChecksumIEEE, so other clients can match us.
    assert crc32_partition(b"123456789", 2**32) == 0xCBF43926


@settings(deadline=None, max_examples=200)
@given(key=st.binary(max_size=64), count=st.integers(min_value=1, max_value=10_000))
def test_partition_is_in_range_and_deterministic(key: bytes, count: int) -> None:
    p = crc32_partition(key, count)
    assert 0 <= p < count
    assert crc32_partition(key, count) == p


def test_keys_spread_over_partitions() -> None:
    counts = Counter(crc32_partition(b"user-%d" % i, 8) for i in range(8000))
    assert set(counts) == set(range(8))
    assert min(counts.values()) > 800  # 1000 expected per partition


def test_sticky_chooser_round_robins_over_available_partitions() -> None:
    chooser = StickyChooser()
    picks = [chooser.next("t", (0, 2, 5)) for _ in range(9)]
    assert Counter(picks) == {0: 3, 2: 3, 5: 3}
    # consecutive picks always move on (the next batch goes elsewhere)
    assert all(a != b for a, b in zip(picks, picks[1:]))


def test_sticky_chooser_topics_are_independent() -> None:
    chooser = StickyChooser()
    a = [chooser.next("a", (0, 1, 2, 3)) for _ in range(4)]
    b = [chooser.next("b", (0, 1, 2, 3)) for _ in range(4)]
    assert sorted(a) == sorted(b) == [0, 1, 2, 3]


def test_sticky_chooser_is_fair_across_threads() -> None:
    chooser = StickyChooser()
    picks: list[int] = []
    lock = threading.Lock()

    def work() -> None:
        mine = [chooser.next("t", tuple(range(4))) for _ in range(1000)]
        with lock:
            picks.extend(mine)

    run_in_threads(work, 4, 10)
    # every tick of the shared counter went to exactly one pick: perfectly even
    assert Counter(picks) == {0: 1000, 1: 1000, 2: 1000, 3: 1000}
