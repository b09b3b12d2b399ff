"""``for record in consumer`` (DMQConsumer.__iter__ / __next__) over an in-memory feed of polls:
every record once and in order, the loop ended by consumer_timeout_ms or close(), and what was
not handed out given back (the partitions moved back to it, the loop stopped at once) whenever
positions are read or set, whichever iterator handed the records out."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dmq.client.consumer import DMQConsumer
from dmq.client.consumer._config import ConsumerConfig
from dmq.client.consumer._records import ConsumerRecords, TopicPartition
from dmq.client.records import RecordSequence
from dmq.proto.records import decode, encode


def poll_of(*parts: tuple[int, int, int], lists: bool = False) -> ConsumerRecords:
    """A poll's records: per (partition, first offset, count), one batch's RecordSequence (or a
    list of its records: what poll() returns after deserializers)."""
    out: dict[TopicPartition, Any] = {}
    for partition, first, n in parts:
        batch = decode(encode([b"%d-%d" % (partition, first + i) for i in range(n)], base_offset=first))
        seq = RecordSequence("t", partition, [batch], first, first + n)
        out[TopicPartition("t", partition)] = list(seq) if lists else seq
    return ConsumerRecords(out)


class FakeSubs:
    def __init__(self) -> None:
        self.seeks: dict[TopicPartition, int] = {}

    def get(self, tp: TopicPartition) -> object:
        return tp  # every partition assigned

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks[tp] = offset


class FakeFetcher:
    def __init__(self) -> None:
        self.dropped: list[TopicPartition] = []

    def drop(self, tp: TopicPartition) -> None:
        self.dropped.append(tp)


class Consumer(DMQConsumer):
    """No cluster: poll() returns the given polls in turn, then nothing."""

    def __init__(self, *polls: ConsumerRecords) -> None:  # noqa: D107 - no super(): no cluster
        self.config = ConsumerConfig(metadata_service_url="unused:1", group_id="g", consumer_timeout_ms=0)
        self._closed = False
        self._reset_iteration()
        self._subs = FakeSubs()  # type: ignore[assignment]
        self._fetcher = FakeFetcher()  # type: ignore[assignment]
        self.polls = list(polls)
        self.poll_calls = 0

    def poll(self, timeout_ms: float = 0, max_records: int | None = None, *, timeout: object = None) -> ConsumerRecords:
        self.poll_calls += 1
        if self._iter_parts:  # as the real poll(): records of the iteration not handed out go back
            self._hand_back_unreturned()
        return self.polls.pop(0) if self.polls else ConsumerRecords()

    def seeks(self) -> dict[int, int]:
        return {tp.partition: o for tp, o in self._subs.seeks.items()}  # type: ignore[attr-defined]


def offsets(records: Iterator[Any] | list[Any]) -> list[tuple[int, int]]:
    return [(r.partition, r.offset) for r in records]


@pytest.mark.parametrize("lists", [False, True])
def test_every_record_once_in_order_then_the_loop_ends(lists: bool) -> None:
    c = Consumer(poll_of((0, 0, 3), (1, 10, 2), lists=lists), poll_of((0, 3, 2), lists=lists))
    got = [(r.partition, r.offset, r.value) for r in c]
    assert got == [(0, 0, b"0-0"), (0, 1, b"0-1"), (0, 2, b"0-2"), (1, 10, b"1-10"), (1, 11, b"1-11"),
                   (0, 3, b"0-3"), (0, 4, b"0-4")]
    assert c.poll_calls == 3  # the third found nothing: consumer_timeout_ms=0 ended the loop
    assert c.seeks() == {}  # everything was handed out: nothing to give back
    c.polls.append(poll_of((1, 12, 1)))
    assert offsets(c) == [(1, 12)]  # a new loop polls again


@pytest.mark.parametrize("lists", [False, True])
def test_leaving_mid_poll_gives_back_the_rest(lists: bool) -> None:
    c = Consumer(poll_of((0, 0, 4), (1, 10, 3), (2, 20, 2), lists=lists), poll_of((3, 30, 1), lists=lists))
    it = iter(c)
    assert offsets(next(it) for _ in range(2)) == [(0, 0), (0, 1)]
    c._hand_back_unreturned()  # what position(), seek(), commit*() and close() do first
    assert c.seeks() == {0: 2, 1: 10, 2: 20}
    assert c._fetcher.dropped == [TopicPartition("t", p) for p in (0, 1, 2)]  # type: ignore[attr-defined]
    # the loop does not go on with the records given back: it asks poll() again
    assert offsets(it) == [(3, 30)]
    assert c.poll_calls == 3


def test_giving_back_at_a_partition_boundary_and_after_the_last_record() -> None:
    c = Consumer(poll_of((0, 0, 2), (1, 10, 2)))
    it = iter(c)
    assert offsets(next(it) for _ in range(2)) == [(0, 0), (0, 1)]
    c._hand_back_unreturned()
    assert c.seeks() == {1: 10}  # partition 0 was handed out whole
    c = Consumer(poll_of((0, 0, 2), (1, 10, 2)))
    it = iter(c)
    assert len([next(it) for _ in range(4)]) == 4
    c._hand_back_unreturned()
    assert c.seeks() == {}


def test_a_poll_in_the_loop_returns_what_the_loop_had_not_handed_out() -> None:
    c = Consumer(poll_of((0, 0, 3)))
    it = iter(c)
    assert next(it).offset == 0
    c.poll(0)  # the real poll() would return offsets 1-2 again: the partition was moved back to 1
    assert c.seeks() == {0: 1}
    assert list(it) == []


def test_next_and_a_loop_share_the_records() -> None:
    """next(consumer) inside ``for r in consumer`` takes the next record, neither skipping
    nor repeating any, across partitions and polls."""
    c = Consumer(poll_of((0, 0, 3), (1, 10, 2)), poll_of((2, 20, 2)))
    got = []
    for r in c:
        got.append((r.partition, r.offset))
        if r.offset in (1, 2, 10):
            nxt = next(c)
            got.append((nxt.partition, nxt.offset))
    assert got == [(0, 0), (0, 1), (0, 2), (1, 10), (1, 11), (2, 20), (2, 21)]
    with pytest.raises(StopIteration):
        next(c)
    c.polls.append(poll_of((0, 3, 1)))
    assert next(c).offset == 3  # after StopIteration, next() polls again


def test_close_mid_loop_gives_back_and_ends_the_loop() -> None:
    c = Consumer(poll_of((0, 0, 3)), poll_of((0, 3, 3)))
    got = []
    for r in c:
        got.append(r.offset)
        c._hand_back_unreturned()  # close() does this first ...
        c._closed = True  # ... and ends with this
    assert got == [0] and c.seeks() == {0: 1} and c.poll_calls == 1
