"""1,100 idle TCP connections against a `dmq server`-shaped child with `ulimit -n 1024` (issue 13).

Before: every connection was accepted, the descriptors ran out, an acks=all produce's fsync hit
EMFILE and the partition went offline until restart. Now the server accepts at most half its
descriptor limit in connections (grpc.max_allowed_incoming_connections); the rest are closed at
accept, and the logs keep their descriptors.
"""

from __future__ import annotations

import os
import pathlib
import resource
import socket
import subprocess
import sys
import textwrap
import time

import grpc
import pytest

from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import records
from dmq.proto.grpc_options import channel_options
from tests.processes import stop_process

NOFILE = 1024
FLOOD = 1_100

SERVER = textwrap.dedent(
    """
    import asyncio, logging, pathlib, resource, sys
    import structlog
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[2]), resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    from dmq.client.cli.runner import ClusterOptions, run_embedded
    def ready(cluster):
        print("READY", cluster.bootstrap, flush=True)
    asyncio.run(run_embedded(ClusterOptions(data_dir=pathlib.Path(sys.argv[1])), ready))
    """
)


@pytest.fixture
def server(tmp_path: pathlib.Path):
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(tmp_path / "data"), str(NOFILE)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("READY"), line
    yield proc, line.split()[1]
    stop_process(proc, 15)
    proc.stdout.close()  # our end of the pipe (else a ResourceWarning)


@pytest.fixture
def room_for_sockets():
    """This test process holds the 1,100 client sockets: it needs the descriptors for them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < FLOOD + 200:
        pytest.skip(f"the hard open-files limit ({hard}) is too low to hold {FLOOD} client sockets")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, FLOOD + 500), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _produce(stub: pb_grpc.BrokerStub, value: bytes) -> int:
    return stub.Produce(
        pb.ProduceRequest(topic="t", partition=0, batch=records.encode([value]), acks=pb.ACKS_ALL), timeout=10
    ).base_offset


def test_idle_connection_flood_under_a_low_descriptor_limit(server, room_for_sockets) -> None:
    proc, address = server
    host, port = address.rsplit(":", 1)
    channel = grpc.insecure_channel(address, options=channel_options())
    pb_grpc.MetadataStub(channel).CreateTopic(pb.CreateTopicRequest(name="t", partitions=1), timeout=10)
    broker = pb_grpc.BrokerStub(channel)
    assert _produce(broker, b"before") == 0
    sockets: list[socket.socket] = []
    try:
        for _ in range(FLOOD):
            try:
                sockets.append(socket.create_connection((host, int(port)), timeout=5))
            except OSError:
                break  # the server's backlog may refuse some; what matters is what it keeps
        time.sleep(1.0)
        fds = len(os.listdir(f"/proc/{proc.pid}/fd"))
        assert fds < NOFILE - 100, f"the server holds {fds} descriptors of {NOFILE}"
        # the connection made before the flood still serves, and acks=all fsyncs succeed
        acked = [_produce(broker, f"during-{i}".encode()) for i in range(20)]
        assert acked == list(range(1, 21))
    finally:
        for s in sockets:
            s.close()
    # and after the flood, new clients are served
    fresh = grpc.insecure_channel(address, options=channel_options())
    deadline = time.monotonic() + 10
    while True:
        try:
            assert _produce(pb_grpc.BrokerStub(fresh), b"after") == 21
            break
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() < deadline, (e.code(), e.details())
            time.sleep(0.2)
    resp = broker.Fetch(pb.FetchRequest(partitions=[pb.FetchPartition(topic="t", partition=0, offset=0)]), timeout=10)
    assert len(list(records.decode_batches(resp.partitions[0].records))) == 22
    fresh.close()
    channel.close()
    assert proc.poll() is None
