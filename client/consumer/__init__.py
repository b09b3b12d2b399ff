"""DMQConsumer: consumer groups with subscribe / poll / commit (see _consumer.py for the flow)."""

from dmq.client.consumer._config import ConsumerConfig
from dmq.client.consumer._consumer import DMQConsumer
from dmq.client.consumer._listener import ConsumerRebalanceListener
from dmq.client.consumer._records import (
    ConsumerRecord,
    ConsumerRecords,
    OffsetAndMetadata,
    OffsetAndTimestamp,
    TopicPartition,
)
from dmq.client.errors import CorruptRecordError, InvalidConfigError

__all__ = [
    "DMQConsumer",
    "ConsumerConfig",
    "ConsumerRecords",
    "ConsumerRecord",
    "ConsumerRebalanceListener",
    "TopicPartition",
    "OffsetAndMetadata",
    "OffsetAndTimestamp",
    "InvalidConfigError",
    "CorruptRecordError",
]
