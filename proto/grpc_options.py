"""gRPC settings shared by every server and channel.

gRPC's default 4 MiB message limit is below the largest record batch (16 MiB by default) and the
largest fetch response, so both sides raise it to MAX_MESSAGE_BYTES. Requests above the limit are
refused by gRPC itself with RESOURCE_EXHAUSTED before any handler runs.
"""

from __future__ import annotations

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# Fetch responses are capped below the transport limit so that framing never pushes one over.
MAX_FETCH_RESPONSE_BYTES = 60 * 1024 * 1024


def server_options() -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.so_reuseport", 0),
    ]


def channel_options() -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        # Separate channels per client object: do not share subchannels across them, so closing
        # one client never disturbs another's in-flight calls.
        ("grpc.use_local_subchannel_pool", 1),
    ]
