"""AsyncConsumer's Chunk (client/aio/_consumer_parts.py) over a RecordSequence and over a list
(deserialized records): records go out once, in order, whoever takes them (the iterator an
``async for`` steps, take()); what is left is counted exactly; detach() and drop() end the
iterator a reader holds."""

from __future__ import annotations

import pytest

from dmq.client.aio._consumer_parts import Chunk
from dmq.client.consumer._records import TopicPartition
from dmq.client.records import ConsumerRecord, RecordSequence
from dmq.proto.records import decode, encode

TP = TopicPartition("t", 0)


def records(lists: bool) -> RecordSequence | list[ConsumerRecord]:
    seq = RecordSequence("t", 0, [decode(encode([b"v%d" % i for i in range(6)], base_offset=10))], 10, 16)
    return list(seq) if lists else seq


@pytest.mark.parametrize("lists", [False, True])
def test_iterator_and_take_share_one_hand_out(lists: bool) -> None:
    chunk = Chunk(TP, records(lists))
    held = chunk.it  # what an ``async for`` steps
    assert chunk.left() == 6 and chunk.next_offset() == 10
    assert next(held).offset == 10
    taken = chunk.take(2)
    assert [r.offset for r in taken] == [11, 12] and chunk.left() == 3 and chunk.next_offset() == 13
    assert next(held).offset == 13  # the reader goes on after what take() handed out
    assert [r.offset for r in chunk.take(10)] == [14, 15]
    assert chunk.left() == 0 and chunk.next_offset() is None and list(held) == [] and len(chunk.take(1)) == 0


@pytest.mark.parametrize("lists", [False, True])
def test_detach_ends_the_held_iterator_and_keeps_the_rest(lists: bool) -> None:
    chunk = Chunk(TP, records(lists))
    held = chunk.it
    assert next(held).offset == 10
    chunk.detach()
    assert list(held) == []  # the reader stops between two records
    assert chunk.left() == 5 and chunk.next_offset() == 11
    assert [r.offset for r in chunk.it] == [11, 12, 13, 14, 15] and chunk.left() == 0


@pytest.mark.parametrize("lists", [False, True])
def test_drop_ends_everything(lists: bool) -> None:
    chunk = Chunk(TP, records(lists))
    held = chunk.it
    next(held)
    chunk.drop()
    assert list(held) == [] and chunk.left() == 0 and chunk.next_offset() is None
