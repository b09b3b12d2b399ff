"""Ready-made serializers for Producer(key_serializer=..., value_serializer=...) and
deserializers for DMQConsumer(key_deserializer=..., value_deserializer=...).

    producer = Producer(bootstrap_servers="127.0.0.1:9091", value_serializer=json_serializer)
    consumer = DMQConsumer(bootstrap_servers="127.0.0.1:9091", group_id="app",
                           value_deserializer=json_deserializer)

Any callable works: a serializer takes the object and returns bytes, a deserializer takes bytes
(never None: a record without a key keeps key None) and returns the object.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["json_deserializer", "json_serializer", "str_deserializer", "str_serializer"]


def str_serializer(value: str) -> bytes:
    """UTF-8 bytes of a str."""
    if not isinstance(value, str):
        raise TypeError(f"str_serializer takes a str, got {type(value).__name__}")
    return value.encode("utf-8")


def str_deserializer(data: bytes) -> str:
    return data.decode("utf-8")


def json_serializer(value: Any) -> bytes:
    """Compact UTF-8 JSON (what json.dumps accepts; anything else raises TypeError)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def json_deserializer(data: bytes) -> Any:
    return json.loads(data)
