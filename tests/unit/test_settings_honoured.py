"""Issue 13, settings accepted but not honoured: each is refused when built, naming the setting,
instead of failing (or silently doing nothing) later."""

from __future__ import annotations

import pytest

from dmq.client.consumer import ConsumerConfig
from dmq.client.errors import InvalidConfigError
from dmq.client.producer import Producer
from dmq.proto.grpc_options import MAX_FETCH_RESPONSE_BYTES


def test_a_delivery_timeout_shorter_than_linger_plus_request_timeout_is_refused() -> None:
    """Before: linger_ms=2000 with delivery_timeout_ms=1000 was accepted, and every batch expired
    the moment linger sealed it, never sent, on a healthy cluster."""
    with pytest.raises(ValueError, match=r"delivery_timeout_ms \(1000\) must be at least linger_ms \+ request_timeout_ms"):
        Producer("127.0.0.1:1", linger_ms=2_000, request_timeout_ms=500, delivery_timeout_ms=1_000)


def test_a_fetch_max_bytes_above_what_brokers_serve_is_refused() -> None:
    """Before: accepted, then every Fetch was refused by the broker and poll() returned nothing."""
    with pytest.raises(InvalidConfigError, match=f"fetch_max_bytes must be at most {MAX_FETCH_RESPONSE_BYTES}"):
        ConsumerConfig(metadata_service_url="127.0.0.1:1", group_id="g", fetch_max_bytes=100 * 1024 * 1024)
    ConsumerConfig(metadata_service_url="127.0.0.1:1", group_id="g", fetch_max_bytes=MAX_FETCH_RESPONSE_BYTES)
