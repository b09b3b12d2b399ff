"""Produce and consume throughput with security off, TLS only, and TLS + tokens + ACLs.

    .venv/bin/python bench/security_bench.py [--records 200000] [--size 100] [--partitions 4]

For each mode, the embedded server (coordinator + one broker) runs in a CHILD process with its
own data directory (as bench/_server.py does), and this process measures:

  1. one Producer, acks=all, --records values of --size bytes through send(), then flush;
  2. one SimpleConsumer reading them all back with consume_batches() (every record iterated).

Modes: `plain` (security off, as `make run`), `tls` (TLS on the port, no authentication),
`tls+tokens+acls` (TLS, HS256 tokens, and the client is an ordinary principal allowed by ACLs:
every call is authenticated and authorized). Issue 18's target: the last keeps >= 75% of plain.
Figures vary run to run on a shared machine: compare within one run.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import textwrap
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _server import ChildServer  # noqa: E402  (the bench helpers, shared)

SECRET = "bench-secret-0123456789-abcdefghijklmnop"
SERVER_SCRIPT = textwrap.dedent(
    """
    import asyncio, logging, pathlib, sys
    import structlog
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    from dmq.client.cli.runner import ClusterOptions, run_embedded
    from dmq.proto.security.settings import ServerSecurity

    data, mode, certs, secret = pathlib.Path(sys.argv[1]), sys.argv[2], pathlib.Path(sys.argv[3]), sys.argv[4]
    tls = dict(tls_certfile=str(certs / "server.pem"), tls_keyfile=str(certs / "server.key"),
               tls_cafile=str(certs / "ca.pem"))
    security = {"plain": None, "tls": ServerSecurity(**tls),
                "tls+tokens+acls": ServerSecurity(**tls, token_secret=secret, super_users=frozenset({"admin"}))}[mode]

    def ready(cluster):
        print("READY", cluster.bootstrap, flush=True)

    asyncio.run(run_embedded(ClusterOptions(data_dir=data, security=security), ready))
    """
)
MODES = ("plain", "tls", "tls+tokens+acls")


def client_settings(mode: str, certs: pathlib.Path, principal: str) -> dict[str, str]:
    from dmq.proto.security.tokens import create_token

    if mode == "plain":
        return {}
    settings = {"ssl_cafile": str(certs / "ca.pem")}
    if mode == "tls+tokens+acls":
        settings["token"] = create_token(principal, ttl_s=3600, secret=SECRET)
    return settings


def run_mode(mode: str, tmp: pathlib.Path, certs: pathlib.Path, values: list[bytes], partitions: int) -> tuple[float, float]:
    from dmq.client import AdminClient, Producer, SimpleConsumer
    from dmq.proto import dmq_pb2 as pb

    server = ChildServer(SERVER_SCRIPT, str(tmp / mode), mode, str(certs), SECRET)
    try:
        with AdminClient(server.bootstrap, **client_settings(mode, certs, "admin")) as admin:
            admin.create_topic("bench", partitions=partitions)
            if mode == "tls+tokens+acls":  # the measured client is an ordinary principal, allowed by ACLs
                entries = [pb.AclEntry(principal="bench", resource_type="topic", resource_name="bench",
                                       operation=op, permission="allow") for op in ("read", "write")]
                admin.cluster.metadata_stub().AddAcls(pb.AddAclsRequest(acls=entries), timeout=10)
        settings = client_settings(mode, certs, "bench")
        with Producer(server.bootstrap, **settings) as producer:
            started = time.perf_counter()
            for i, value in enumerate(values):
                producer.send("bench", value, partition=i % partitions)
            producer.flush()
            produce_s = time.perf_counter() - started
        read = 0
        with SimpleConsumer(server.bootstrap, max_wait_ms=0, **settings) as consumer:
            ends = [consumer.offsets("bench", p)[1] for p in range(partitions)]
            started = time.perf_counter()
            for p in range(partitions):
                for batch in consumer.consume_batches("bench", p, 0, end_offset=ends[p]):
                    for _record in batch:
                        read += 1
            consume_s = time.perf_counter() - started
        assert read == len(values), (read, len(values))
        return len(values) / produce_s, len(values) / consume_s
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    from dmq.client.cli._certs import create_dev_certs

    blob = os.urandom(args.records * args.size)
    values = [blob[i: i + args.size] for i in range(0, len(blob), args.size)]
    with tempfile.TemporaryDirectory(prefix="dmq-security-bench-") as d:
        tmp = pathlib.Path(d)
        certs = tmp / "certs"
        create_dev_certs(certs, clients=())
        results = {mode: run_mode(mode, tmp, certs, values, args.partitions) for mode in MODES}
    plain_produce, plain_consume = results["plain"]
    print(f"{args.records} records of {args.size} B, {args.partitions} partitions, acks=all")
    print(f"{'mode':<18}{'produce msgs/s':>16}{'consume msgs/s':>16}{'produce %':>11}{'consume %':>11}")
    for mode, (produce, consume) in results.items():
        print(f"{mode:<18}{produce:>16,.0f}{consume:>16,.0f}{100 * produce / plain_produce:>10.0f}%"
              f"{100 * consume / plain_consume:>10.0f}%")


if __name__ == "__main__":
    main()
