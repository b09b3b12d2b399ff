"""gRPC settings every channel and server of DMQ shares: the message size limits.

gRPC's default 4 MiB message limit is below the largest record batch (16 MiB by default) and the
largest fetch response, so both sides raise it to MAX_MESSAGE_BYTES. Requests above the limit are
refused by gRPC itself with RESOURCE_EXHAUSTED before any handler runs. `channel_options` is what
every channel (clients', and the nodes' own calls to each other) is built with; what only servers
set (connection limits, idle connections, calls per connection) is dmq.proto.server.grpc_options.
"""

from __future__ import annotations

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# Fetch responses are capped below the transport limit so that framing never pushes one over.
MAX_FETCH_RESPONSE_BYTES = 60 * 1024 * 1024


def channel_options(*, reconnect_backoff_max_ms: int | None = None) -> list[tuple[str, int]]:
    """reconnect_backoff_max_ms: cap gRPC's reconnect backoff (default 1 s growing 1.6x to 120 s,
    jittered +-20% by gRPC), for a channel that must notice a server back within that long."""
    options = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        # Separate channels per client object: do not share subchannels across them, so closing
        # one client never disturbs another's in-flight calls.
        ("grpc.use_local_subchannel_pool", 1),
    ]
    if reconnect_backoff_max_ms is not None:
        if reconnect_backoff_max_ms <= 0:
            raise ValueError(f"reconnect_backoff_max_ms must be > 0, got {reconnect_backoff_max_ms}")
        options += [
            ("grpc.initial_reconnect_backoff_ms", min(100, reconnect_backoff_max_ms)),
            ("grpc.min_reconnect_backoff_ms", min(100, reconnect_backoff_max_ms)),
            ("grpc.max_reconnect_backoff_ms", reconnect_backoff_max_ms),
        ]
    return options
