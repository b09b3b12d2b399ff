"""DMQ client library: Producer, DMQConsumer, SimpleConsumer, AdminClient.

The public surface is re-exported here; the modules starting with "_" are internals.
"""

from dmq.client import errors
from dmq.client.admin import (
    AdminClient,
    BrokerDescription,
    LogDescription,
    OffsetInfo,
    PartitionDescription,
    TopicDescription,
)
from dmq.client.errors import DMQError
from dmq.client.producer import Producer, RecordFuture, SendManyFuture
from dmq.client.records import ConsumerRecord, RecordMetadata
from dmq.client.simple_consumer import SimpleConsumer

__all__ = [
    "AdminClient",
    "BrokerDescription",
    "ConsumerRecord",
    "DMQError",
    "LogDescription",
    "OffsetInfo",
    "PartitionDescription",
    "Producer",
    "RecordFuture",
    "RecordMetadata",
    "SendManyFuture",
    "SimpleConsumer",
    "TopicDescription",
    "errors",
]

# Consumer groups (DMQConsumer, ConsumerConfig) are re-exported below by their module's owner.
