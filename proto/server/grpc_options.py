"""gRPC settings of the servers: message limits, connections and calls per connection.

The message limits are the contract's (dmq.proto.grpc_options.MAX_MESSAGE_BYTES, which channels
use too); the rest only servers set.

Connections:
  - at most `max_connections` at once per server, enforced by gRPC core when it accepts
    (`grpc.max_allowed_incoming_connections`: a connection over the limit is closed at once, so it
    holds no descriptor). The limit is also capped at half the process's open-file limit
    (RLIMIT_NOFILE), so idle sockets can never take the descriptors the logs need: with
    `ulimit -n 1024`, 1,100 idle connections used to make fsync fail with EMFILE;
  - a connection with no call for `idle_ms` is closed (`grpc.max_connection_idle_ms`, a GOAWAY the
    client's channel handles by reconnecting on its next call);
  - per client address: see dmq.proto.server.connections (gRPC core has no such setting).

Calls per connection (fairness): at most `max_calls_per_connection` calls of one connection are
open at the server at once (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS); the client's channel holds
the rest until one ends. Why: grpc.aio takes new calls off gRPC core's queue one at a time, and
that queue is shared by every connection and served in arrival order. A client keeping 32 large
produces in flight kept ~25 of them in that queue, and a small producer on another connection
waited behind all of them (bench/load_bench.py, profiled: 95-115 ms of a 120 ms median spent
before its handler was even started, its handler took ~9 ms). The server's rate of taking calls
did not grow with the flood's concurrency (~200 calls/s with 4 in flight or 32), so extra
in-flight calls of one client only add queueing for everyone else. With the cap, a flood queues
in its own channel and the shared queue holds at most `max_calls_per_connection` of its calls.
Measured on the load bench (2 shared vCPUs, load ~8): small-producer p50 121 ms uncapped, 56 ms
with 16, 36 ms with 8, 20 ms with 4; the flood's throughput unchanged. The default is 100 all the
same: a cap must stay above the calls a well-behaved client keeps open for good (one watch stream
per subscribed topic, long-poll fetches), or that client's short calls (heartbeats) wait behind
its own streams.
"""

from __future__ import annotations

import contextlib
import resource

from dmq.proto.grpc_options import MAX_MESSAGE_BYTES

DEFAULT_MAX_CONNECTIONS = 10_000
DEFAULT_CONNECTION_IDLE_MS = 5 * 60 * 1000  # Kafka's connections.max.idle.ms is 9 min; clients reconnect cheaply
MIN_CONNECTIONS = 16  # even under a tiny descriptor limit a server must take a few clients
# Calls one connection may have open at the server at once (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS).
# See the module docstring (fairness) for why. Not 8, which gave the load bench its best median:
# a consumer holds one long-lived WatchGroup stream per subscribed topic on its coordinator
# channel, so at 8 a consumer of 12 topics had its heartbeats queued behind its own watches and
# was evicted over and over (tests/integration/test_calls_per_connection.py).
DEFAULT_MAX_CALLS_PER_CONNECTION = 100


def open_files_limit() -> int:
    """The process's soft RLIMIT_NOFILE (a large number when unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def connection_limit(max_connections: int = DEFAULT_MAX_CONNECTIONS) -> int:
    """`max_connections`, capped so that connections use at most half of the open-file limit."""
    return max(MIN_CONNECTIONS, min(max_connections, open_files_limit() // 2))


def raise_open_files_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; returns the new soft limit.

    Process-wide: only process owners (the `dmq` commands, benches) call it, before servers are
    built. It widens the room for connections and log files; it is not a substitute for the limits.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return open_files_limit()


def server_options(
    *,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    idle_ms: int = DEFAULT_CONNECTION_IDLE_MS,
    max_calls_per_connection: int = DEFAULT_MAX_CALLS_PER_CONNECTION,
) -> list[tuple[str, int]]:
    if idle_ms <= 0:
        raise ValueError(f"idle_ms must be > 0, got {idle_ms}")
    if max_calls_per_connection < 1:
        raise ValueError(f"max_calls_per_connection must be >= 1, got {max_calls_per_connection}")
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.so_reuseport", 0),
        ("grpc.max_allowed_incoming_connections", connection_limit(max_connections)),
        ("grpc.max_connection_idle_ms", idle_ms),
        ("grpc.max_concurrent_streams", max_calls_per_connection),
        # Over the limit a client's calls wait in its own channel. With gRPC's default
        # "overload protection" the server would instead refuse them (RST_STREAM REFUSED_STREAM,
        # UNAVAILABLE to the caller) whenever the client opens more than the limit at once.
        ("grpc.http.overload_protection", 0),
    ]
