"""Produce and consume throughput with security off, TLS only, and TLS + tokens + ACLs.

    .venv/bin/python bench/security_bench.py [--records 200000] [--seconds 3] [--rounds 5]
                                             [--size 100] [--partitions 4]
                                             [--batch-size 1048576] [--fetch-bytes 4194304]

Three embedded servers (coordinator + one broker each, as `dmq server`) run side by side, each
in a CHILD process with its own data directory (bench/_server.py), one per mode:
  plain            security off (as `make run`);
  tls              TLS on the port, no authentication;
  tls+tokens+acls  TLS, HS256 tokens, and the measured client is an ordinary principal allowed
                   by ACLs: every call is authenticated and authorized.
Issue 18's target: tls+tokens+acls keeps >= 75% of plain.

The machine is shared and noisy, so the modes are measured in interleaved rounds: every round
runs each mode once (the order rotating round by round), so a burst of load elsewhere hits the
three alike. In each mode's turn this process measures, excluding connection set-up:
  1. produce: one Producer (acks=all, send() on the sticky fast path) sends --size-byte values
     (a pool of --records, sent over and over) for at least --seconds, then flushes;
  2. consume: one SimpleConsumer reads the topic from offset 0 with consume_batches(), every
     record iterated, partition after partition and over again, for --seconds;
  3. calls: Fetch RPCs of a one-record topic, back to back on one channel, for --seconds: the
     cost of a call itself (authentication, authorization, interceptors, TLS framing).
Printed: every round's rates and ratios to plain, the medians, and the CPU seconds per million
records (µs per call for the calls) of this client process (all its threads) and of the server
process, a measure the other load on the machine disturbs less than wall-clock rates.

The security work is per call (authentication, authorization) or per byte (TLS). With the default
1 MiB batches and 4 MiB fetches there are few calls; `--batch-size 16384 --fetch-bytes 16384`
makes ~60 times more of both, where per-call costs show.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import pathlib
import statistics
import sys
import tempfile
import textwrap
import time

import structlog

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _server import ChildServer  # noqa: E402  (the bench helpers, shared)
from produce_consume import make_values  # noqa: E402

SECRET = "bench-secret-0123456789-abcdefghijklmnop"
TOPIC = "bench"
CALLS_TOPIC = "bench-calls"  # one record, fetched call after call
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
PHASES = ("produce", "consume", "calls")
SECURE = MODES[-1]


@dataclasses.dataclass
class Phase:
    """One timed phase: records moved, wall seconds, CPU seconds of this process and the server's."""

    records: int
    wall_s: float
    client_cpu_s: float
    server_cpu_s: float

    @property
    def rate(self) -> float:
        return self.records / self.wall_s

    def cpu_per_million(self, which: str) -> float:
        return getattr(self, f"{which}_cpu_s") * 1e6 / self.records


class Meter:
    """Wall clock and both processes' CPU clocks, started together."""

    def __init__(self, server: ChildServer) -> None:
        self.server = server
        self.wall, self.cpu, self.server_cpu = time.perf_counter(), time.process_time(), server.cpu_s()

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.wall

    def stop(self, records: int) -> Phase:
        return Phase(records, self.elapsed_s(), time.process_time() - self.cpu, self.server.cpu_s() - self.server_cpu)


def client_settings(mode: str, certs: pathlib.Path, principal: str) -> dict[str, str]:
    from dmq.proto.security.tokens import create_token

    if mode == "plain":
        return {}
    settings = {"ssl_cafile": str(certs / "ca.pem")}
    if mode == SECURE:
        settings["token"] = create_token(principal, ttl_s=3600, secret=SECRET)
    return settings


def start_server(mode: str, tmp: pathlib.Path, certs: pathlib.Path, partitions: int) -> ChildServer:
    from dmq.client import AdminClient, Producer
    from dmq.proto import dmq_pb2 as pb

    server = ChildServer(SERVER_SCRIPT, str(tmp / mode), mode, str(certs), SECRET)
    with AdminClient(server.bootstrap, **client_settings(mode, certs, "admin")) as admin:
        admin.create_topic(TOPIC, partitions=partitions)
        admin.create_topic(CALLS_TOPIC, partitions=1)
        if mode == SECURE:  # the measured client is an ordinary principal, allowed by ACLs
            entries = [pb.AclEntry(principal="bench", resource_type="topic", resource_name=topic,
                                   operation=op, permission="allow")
                       for op in ("read", "write") for topic in (TOPIC, CALLS_TOPIC)]
            admin.cluster.metadata_stub().AddAcls(pb.AddAclsRequest(acls=entries), timeout=10)
    with Producer(server.bootstrap, **client_settings(mode, certs, "bench")) as producer:
        producer.send(CALLS_TOPIC, b"x" * 100).get(30)
    return server


def produce(server: ChildServer, settings: dict[str, str], values: list[bytes], seconds: float, batch_size: int) -> Phase:
    from dmq.client import Producer

    with Producer(server.bootstrap, batch_size=batch_size, **settings) as producer:
        producer.send(TOPIC, values[0]).get(30)  # metadata and connection outside the clock
        send = producer.send
        meter = Meter(server)
        sent = 0
        while sent == 0 or meter.elapsed_s() < seconds:
            for value in values:
                send(TOPIC, value)
            sent += len(values)
        producer.flush()
        return meter.stop(sent)


def consume(server: ChildServer, settings: dict[str, str], partitions: int, seconds: float, max_bytes: int) -> Phase:
    from dmq.client import SimpleConsumer

    with SimpleConsumer(server.bootstrap, max_wait_ms=0, max_bytes=max_bytes, **settings) as consumer:
        ends = [consumer.offsets(TOPIC, p)[1] for p in range(partitions)]  # connection outside the clock
        meter = Meter(server)
        read = 0
        while meter.elapsed_s() < seconds:
            for p in range(partitions):
                for batch in consumer.consume_batches(TOPIC, p, 0, end_offset=ends[p]):
                    for _record in batch:
                        read += 1
                    if meter.elapsed_s() >= seconds:
                        break
                else:
                    continue
                break
        return meter.stop(read)


def calls(server: ChildServer, settings: dict[str, str], seconds: float) -> Phase:
    """Fetch RPCs of one 100-byte record back to back: what each call costs beyond its data."""
    from dmq.proto import dmq_pb2 as pb
    from dmq.proto import dmq_pb2_grpc as pb_grpc
    from dmq.proto.security.settings import ClientSecurity, sync_channel

    channel = sync_channel(server.bootstrap, ClientSecurity.from_settings(settings, env={}))
    try:
        fetch = pb_grpc.BrokerStub(channel).Fetch
        request = pb.FetchRequest(partitions=[pb.FetchPartition(topic=CALLS_TOPIC, partition=0, offset=0)],
                                  max_wait_ms=0, max_bytes=1024)
        assert fetch(request, timeout=10).partitions[0].records  # the connection, outside the clock
        meter = Meter(server)
        made = 0
        while meter.elapsed_s() < seconds:
            for _ in range(100):
                fetch(request, timeout=10)
            made += 100
        return meter.stop(made)
    finally:
        channel.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000,
                        help="values in the produce pool: a produce phase sends at least this many")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each produce and consume phase")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the three modes")
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=1 << 20,
                        help="the producer's batch_size (smaller: more Produce calls, per-call costs show)")
    parser.add_argument("--fetch-bytes", type=int, default=4 << 20,
                        help="the consumer's max_bytes per Fetch (smaller: more Fetch calls)")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    from dmq.client.cli._certs import create_dev_certs

    values = make_values(args.records, args.size)
    results: dict[str, list[tuple[Phase, ...]]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="dmq-security-bench-") as d:
        tmp = pathlib.Path(d)
        certs = tmp / "certs"
        create_dev_certs(certs, clients=())
        servers: dict[str, ChildServer] = {}
        try:
            for mode in MODES:
                servers[mode] = start_server(mode, tmp, certs, args.partitions)
            settings = {mode: client_settings(mode, certs, "bench") for mode in MODES}
            print(f"{args.size} B values, {args.partitions} partitions, acks=all, {args.seconds:g} s per phase, "
                  f"{args.rounds} rounds (order rotating), batch_size {args.batch_size:,}, Fetch max_bytes {args.fetch_bytes:,}")
            print(f"{'round':<6}{'mode':<17}" + "".join(f"{name + '/s':>12}{'% plain':>8}" for name in PHASES)
                  + "   CPU client/server: s per 1M records (produce, consume), µs per call (calls)")
            for r in range(args.rounds):
                for mode in MODES[r % len(MODES):] + MODES[: r % len(MODES)]:
                    server = servers[mode]
                    results[mode].append((produce(server, settings[mode], values, args.seconds, args.batch_size),
                                          consume(server, settings[mode], args.partitions, args.seconds, args.fetch_bytes),
                                          calls(server, settings[mode], args.seconds)))
                for mode in MODES:
                    run, plain = results[mode][r], results["plain"][r]
                    print(f"{r + 1:<6}{mode:<17}"
                          + "".join(f"{p.rate:>12,.0f}{p.rate / q.rate:>8.0%}" for p, q in zip(run, plain))
                          + "   " + "   ".join(f"{_cpu(p, 'client', name)} / {_cpu(p, 'server', name)}"
                                              for p, name in zip(run, PHASES)))
        finally:
            for server in servers.values():
                server.stop()
    print_medians(results)


def _cpu(phase: Phase, which: str, name: str) -> str:
    value = phase.cpu_per_million(which)
    return f"{value:5.0f}" if name == "calls" else f"{value:5.2f}"


def print_medians(results: dict[str, list[tuple[Phase, ...]]]) -> None:
    def median(mode: str, phase: int, value: str) -> float:
        return statistics.median(getattr(run[phase], value) if value == "rate" else run[phase].cpu_per_million(value)
                                 for run in results[mode])

    def ratio(mode: str, phase: int) -> float:
        return statistics.median(run[phase].rate / plain[phase].rate for run, plain in zip(results[mode], results["plain"]))

    print("medians over the rounds (ratio = median of the per-round ratios to plain; CPU client / server):")
    for mode in MODES:
        cells = []
        for i, name in enumerate(PHASES):
            digits = 0 if name == "calls" else 2
            cells.append(f"{name} {median(mode, i, 'rate'):>10,.0f}/s {ratio(mode, i):>5.0%} "
                         f"{median(mode, i, 'client'):.{digits}f} / {median(mode, i, 'server'):.{digits}f} "
                         f"{'µs/call' if name == 'calls' else 's/1M'}")
        print(f"  {mode:<17}" + "   ".join(cells))
    produce_ratio, consume_ratio = ratio(SECURE, 0), ratio(SECURE, 1)
    verdict = "met" if min(produce_ratio, consume_ratio) >= 0.75 else "NOT met"
    print(f"target: {SECURE} >= 75% of plain msgs/s: produce {produce_ratio:.0%}, consume {consume_ratio:.0%}: {verdict}")

    # Less disturbed by other load: records per CPU-second (client + server) against plain's.
    def per_cpu(mode: str, phase: int) -> float:
        return 1 / (median(mode, phase, "client") + median(mode, phase, "server"))

    print(f"records (calls) per CPU-second of client + server, {SECURE} / plain: "
          + ", ".join(f"{name} {per_cpu(SECURE, i) / per_cpu('plain', i):.0%}" for i, name in enumerate(PHASES)))


if __name__ == "__main__":
    main()
