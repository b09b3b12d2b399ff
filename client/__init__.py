"""DMQ client library: Producer, DMQConsumer, SimpleConsumer, AdminClient, EventStore.

The public surface is re-exported here; the modules starting with "_" are internals. Names are
imported on first use (PEP 562), so `import dmq.client` — and every `dmq` CLI command, whose
entry point lives in this package — does not pay for the producer, the consumer and gRPC until
they are used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "AdminClient": "dmq.client.admin",
    "BrokerDescription": "dmq.client.admin",
    "LogDescription": "dmq.client.admin",
    "OffsetInfo": "dmq.client.admin",
    "PartitionDescription": "dmq.client.admin",
    "TopicDescription": "dmq.client.admin",
    "DMQError": "dmq.client.errors",
    "EventStore": "dmq.client.events",
    "EventType": "dmq.client.events",
    "Event": "dmq.client.events",
    "Query": "dmq.client.events",
    "QueryItem": "dmq.client.events",
    "AppendCondition": "dmq.client.events",
    "Producer": "dmq.client.producer",
    "RecordFuture": "dmq.client.producer",
    "SendManyFuture": "dmq.client.producer",
    "ConsumerRecord": "dmq.client.records",
    "RecordMetadata": "dmq.client.records",
    "SimpleConsumer": "dmq.client.simple_consumer",
    "QueueConsumer": "dmq.client.queue",
    "QueueLease": "dmq.client.queue",
    "DMQConsumer": "dmq.client.consumer",
    "ConsumerConfig": "dmq.client.consumer",
    "ConsumerRecords": "dmq.client.consumer",
    "ConsumerRebalanceListener": "dmq.client.consumer",
    "OffsetAndMetadata": "dmq.client.consumer",
    "OffsetAndTimestamp": "dmq.client.consumer",
    "TopicPartition": "dmq.client.consumer",
    "json_serializer": "dmq.client.serializers",
    "json_deserializer": "dmq.client.serializers",
    "str_serializer": "dmq.client.serializers",
    "str_deserializer": "dmq.client.serializers",
}

__all__ = sorted([*_EXPORTS, "errors"])

if TYPE_CHECKING:
    from dmq.client import errors
    from dmq.client.admin import (
        AdminClient,
        BrokerDescription,
        LogDescription,
        OffsetInfo,
        PartitionDescription,
        TopicDescription,
    )
    from dmq.client.consumer import (
        ConsumerConfig,
        ConsumerRebalanceListener,
        ConsumerRecords,
        DMQConsumer,
        OffsetAndMetadata,
        OffsetAndTimestamp,
        TopicPartition,
    )
    from dmq.client.errors import DMQError
    from dmq.client.events import AppendCondition, Event, EventStore, EventType, Query, QueryItem
    from dmq.client.producer import Producer, RecordFuture, SendManyFuture
    from dmq.client.queue import QueueConsumer, QueueLease
    from dmq.client.records import ConsumerRecord, RecordMetadata
    from dmq.client.serializers import json_deserializer, json_serializer, str_deserializer, str_serializer
    from dmq.client.simple_consumer import SimpleConsumer


def __getattr__(name: str) -> Any:
    if name == "errors":
        return importlib.import_module("dmq.client.errors")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dmq.client' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
