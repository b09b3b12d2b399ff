"""What both consumers (DMQConsumer, AsyncConsumer) do alike outside the group protocol:
reading TopicPartition arguments, checking a partition is assigned, applying deserializers."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dmq.client.consumer._config import ConsumerConfig
from dmq.client.consumer._records import OffsetAndMetadata, TopicPartition
from dmq.client.consumer._subscription import PartitionState, SubscriptionState
from dmq.client.errors import IllegalStateError, InvalidArgumentError, SerializationError


def tp_of(value: Any) -> TopicPartition:
    if isinstance(value, TopicPartition):
        return value
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], int):
        return TopicPartition(value[0], value[1])
    raise InvalidArgumentError(f"expected a TopicPartition(topic, partition), got {value!r}")


def tps_of(args: tuple[Any, ...]) -> list[TopicPartition]:
    """Partitions given as varargs, or as one iterable of them."""
    out: list[TopicPartition] = []
    for a in args:
        if isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], str):
            out.append(tp_of(a))
        else:
            out.extend(tp_of(x) for x in a)
    return out


def commit_offsets(offsets: Mapping[Any, int | OffsetAndMetadata]) -> dict[TopicPartition, OffsetAndMetadata]:
    """commit()'s offsets checked: each partition's next offset to consume, an int >= 0."""
    out = {}
    for tp, o in offsets.items():
        om = o if isinstance(o, OffsetAndMetadata) else OffsetAndMetadata(o)
        if isinstance(om.offset, bool) or not isinstance(om.offset, int) or om.offset < 0:
            raise InvalidArgumentError(f"commit offset for {tp} must be an int >= 0, got {om.offset!r}")
        out[tp_of(tp)] = om
    return out


def time_queries(timestamps: Mapping[Any, int]) -> dict[TopicPartition, int]:
    """offsets_for_times()'s arguments checked: epoch ms (int >= 0) per partition."""
    queries = {}
    for tp, ts in timestamps.items():
        if isinstance(ts, bool) or not isinstance(ts, int) or ts < 0:
            raise InvalidArgumentError(f"offsets_for_times(): timestamp of {tp} must be epoch ms (int >= 0), got {ts!r}")
        queries[tp_of(tp)] = ts
    return queries


def check_seek_offset(offset: Any) -> None:
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise InvalidArgumentError(f"seek() offset must be an int >= 0, got {offset!r}")


def assigned_state(subs: SubscriptionState, value: Any, what: str) -> tuple[TopicPartition, PartitionState]:
    """The partition and its state; IllegalStateError naming the assigned ones when it is not assigned."""
    tp = tp_of(value)
    state = subs.get(tp)
    if state is None:
        raise IllegalStateError(
            f"{what}: {tp} is not assigned to this consumer (assigned: "
            f"{sorted(map(str, subs.assigned())) or 'none yet: poll() first'})"
        )
    return tp, state


def deserialize(config: ConsumerConfig, records: Mapping[TopicPartition, Sequence[Any]],
                seek: Callable[[TopicPartition, int], None]) -> dict[TopicPartition, list[Any]]:
    """Apply the deserializers. A record that fails is not skipped (Kafka's rule): the records
    before it are returned, and the next poll raises SerializationError with the partition's
    position at the failed record, which the application may seek() past."""
    kd, vd = config.key_deserializer, config.value_deserializer
    out: dict[TopicPartition, list[Any]] = {}
    pending = list(records.items())
    for i, (tp, rs) in enumerate(pending):
        done: list[Any] = []
        for r in rs:
            what = "key"
            try:
                key = r.key if kd is None or r.key is None else kd(r.key)
                what = "value"
                value = r.value if vd is None or r.value is None else vd(r.value)
            except Exception as e:
                # Rewind what this poll will not return: tp to the failed record, the
                # partitions not reached yet to their first record.
                seek(tp, r.offset)
                for other, others in pending[i + 1:]:
                    seek(other, others[0].offset)
                if done:
                    out[tp] = done
                if out:
                    return out
                raise SerializationError(
                    f"{what}_deserializer failed on {tp} offset {r.offset}: {e!r}; the position stays "
                    f"there: seek(TopicPartition({tp.topic!r}, {tp.partition}), {r.offset + 1}) skips the record"
                ) from e
            done.append(r._replace(key=key, value=value))
        out[tp] = done
    return out
