"""Load and fairness against one broker: idle connections, unread fetches, a produce flood.

    .venv/bin/python bench/load_bench.py [--idle 5000] [--unread 40] [--fetch-mb 45]
                                          [--flood-seconds 20] [--flood-concurrency 32]
                                          [--quota-produce-mb-per-s 50]

Starts a real `dmq server` child process (coordinator + one broker on one port, fsync flush
policy, data in a temporary directory) and, against it:

  1. fills topic `big` with --fetch-mb MB (1 MB batches);
  2. opens --idle raw TCP connections and leaves them idle (they never speak, as a hostile or
     leaking client would);
  3. starts a child that issues --unread Fetch calls of --fetch-mb MB each from offset 0 on one
     channel and is then stopped with SIGSTOP: nobody reads the answers;
  4. starts a child that floods topic `flood` with 1 MB batches (acks=leader) from
     --flood-concurrency concurrent calls;
  5. meanwhile, in this process, a small producer sends one 100-byte record (acks=all) every 10 ms
     to topic `probe` and records each call's latency.

With --quota-produce-mb-per-s R the server runs with tokens, each client (loader, unread fetcher,
flood, probe) is its own principal, and every principal may produce R MB/s
(`--quota-produce-bytes-per-s`, token buckets that delay, never refuse: dmq.proto.server.security.quotas).
That is the fairness DMQ offers against a flood, as Kafka's client quotas: without it the flood
takes the disk and gRPC's queue of new calls from everyone else.

It prints the server's peak RSS (VmHWM), its RSS at the end of the load and 3 s after, the small
producer's p50 / p99 / max latency, and what the flood and the unread fetches got (stored vs
refused with RESOURCE_EXHAUSTED) and the load average. Targets (issue 13): peak RSS <= 1 GB,
probe p99 <= 50 ms. Figures vary run to run on a shared machine: compare builds back to back
(--dmq names another checkout's command).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pathlib
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

import grpc

from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import records
from dmq.proto.grpc_options import channel_options
from dmq.proto.server.grpc_options import raise_open_files_limit

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _common import bench_parser, percentile  # noqa: E402  (the bench helpers, shared)
from _server import stop_process  # noqa: E402

MB = 1024 * 1024

UNREAD_FETCHER = textwrap.dedent(
    """
    import asyncio, sys, grpc
    from dmq.proto import dmq_pb2 as pb, dmq_pb2_grpc as pb_grpc
    from dmq.proto.grpc_options import channel_options
    address, count, size, token = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    auth = (("authorization", "Bearer " + token),) if token else None

    async def main():
        async with grpc.aio.insecure_channel(address, options=channel_options()) as ch:
            stub = pb_grpc.BrokerStub(ch)
            request = pb.FetchRequest(partitions=[pb.FetchPartition(topic="big", partition=0, offset=0)],
                                      max_bytes=size)
            calls = [stub.Fetch(request, timeout=120, metadata=auth) for _ in range(count)]
            await asyncio.sleep(0.2)  # the requests are on the wire
            print("SENT", flush=True)
            codes = {}
            for call in calls:
                try:
                    await call
                    codes["OK"] = codes.get("OK", 0) + 1
                except grpc.aio.AioRpcError as e:
                    codes[e.code().name] = codes.get(e.code().name, 0) + 1
            print("DONE", codes, flush=True)

    asyncio.run(main())
    """
)

FLOODER = textwrap.dedent(
    """
    import asyncio, os, sys, time, grpc
    from dmq.proto import dmq_pb2 as pb, dmq_pb2_grpc as pb_grpc, records
    from dmq.proto.grpc_options import channel_options
    address, seconds, concurrency, token = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    auth = (("authorization", "Bearer " + token),) if token else None
    batch = records.encode([os.urandom(256 * 1024) for _ in range(4)])

    async def main():
        codes = {}
        async with grpc.aio.insecure_channel(address, options=channel_options()) as ch:
            stub = pb_grpc.BrokerStub(ch)
            end = time.monotonic() + seconds
            print("STARTED", flush=True)

            async def worker(i):
                while time.monotonic() < end:
                    try:
                        await stub.Produce(pb.ProduceRequest(topic="flood", partition=i % 4, batch=batch,
                                                             acks=pb.ACKS_LEADER), timeout=10, metadata=auth)
                        codes["OK"] = codes.get("OK", 0) + 1
                    except grpc.aio.AioRpcError as e:
                        codes[e.code().name] = codes.get(e.code().name, 0) + 1
                        await asyncio.sleep(0.05)

            await asyncio.gather(*(worker(i) for i in range(concurrency)))
        print("DONE", codes, flush=True)

    asyncio.run(main())
    """
)


def _die_with_parent() -> None:
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _status_kb(pid: int, field: str) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return -1


def _child(script: str, *args: str) -> subprocess.Popen[str]:
    # No preexec_fn here: this process runs gRPC threads by now, and a Python callback between
    # fork and exec in a threaded process made the child abort in gRPC's poller. The clients are
    # killed in main()'s finally instead.
    return subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True)


def _auth(token: str) -> tuple[tuple[str, str], ...] | None:
    return (("authorization", "Bearer " + token),) if token else None


def _wait_ready(address: str, timeout_s: float, token: str) -> grpc.Channel:
    channel = grpc.insecure_channel(address, options=channel_options())
    meta = pb_grpc.MetadataStub(channel)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if any(b.alive for b in meta.ListBrokers(pb.ListBrokersRequest(), timeout=2, metadata=_auth(token)).brokers):
                return channel
        except grpc.RpcError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"dmq server at {address} did not become ready in {timeout_s} s")
        time.sleep(0.2)


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--idle", type=int, default=5000)
    parser.add_argument("--unread", type=int, default=40)
    parser.add_argument("--fetch-mb", type=int, default=45)
    parser.add_argument("--flood-seconds", type=float, default=20.0)
    parser.add_argument("--flood-concurrency", type=int, default=32)
    parser.add_argument("--probe-acks", choices=["all", "leader"], default="all",
                        help="the small producer's acks (leader: no fsync wait, to separate CPU from disk)")
    parser.add_argument("--quota-produce-mb-per-s", type=float, default=0.0,
                        help="run the server with tokens (each client its own principal) and this produce quota "
                             "per principal (`--quota-produce-bytes-per-s`): the flood is slowed to it by delay, as "
                             "Kafka's quotas do, and the small producer keeps its own share (0 = no quotas)")
    parser.add_argument("--dmq", default=str(pathlib.Path(sys.executable).parent / "dmq"),
                        help="the dmq command that runs the server (e.g. another checkout's, to compare)")
    args = parser.parse_args()

    # This process holds the idle sockets; it is their owner, so it may widen its own limit.
    nofile = raise_open_files_limit()
    if nofile < args.idle + 200:
        raise SystemExit(f"the open-files limit is {nofile}: too low for {args.idle} idle connections")
    dmq = args.dmq
    load_before = os.getloadavg()
    port = _free_port()
    address = f"127.0.0.1:{port}"
    children: list[subprocess.Popen[str]] = []
    sockets: list[socket.socket] = []
    with tempfile.TemporaryDirectory(prefix="dmq-load-") as tmp:
        tokens = {"loader": "", "fetcher": "", "flood": "", "probe": ""}
        quota_argv: list[str] = []
        if args.quota_produce_mb_per_s > 0:
            from dmq.proto.security.tokens import create_token

            secret = os.urandom(32).hex()
            secret_file = pathlib.Path(tmp) / "token-secret"
            secret_file.write_text(secret)
            tokens = {name: create_token(name, ttl_s=3600, secret=secret) for name in tokens}
            quota_argv = ["--token-secret-file", str(secret_file), "--super-users", ",".join(tokens),
                          "--quota-produce-bytes-per-s", str(int(args.quota_produce_mb_per_s * MB))]
        server = subprocess.Popen(
            [str(dmq), "server", "--port", str(port), "--data-dir", str(pathlib.Path(tmp) / "data"),
             "--log-level", "warning", *quota_argv],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent,
        )
        try:
            channel = _wait_ready(address, 30, tokens["loader"])
            loader = _auth(tokens["loader"])
            meta = pb_grpc.MetadataStub(channel)
            broker = pb_grpc.BrokerStub(channel)
            for name, partitions in (("big", 1), ("flood", 4), ("probe", 1)):
                meta.CreateTopic(pb.CreateTopicRequest(name=name, partitions=partitions), timeout=10, metadata=loader)
            chunk = records.encode([os.urandom(256 * 1024) for _ in range(4)])
            for _ in range(args.fetch_mb):
                broker.Produce(pb.ProduceRequest(topic="big", partition=0, batch=chunk), timeout=30, metadata=loader)
            rss_start_kb = _status_kb(server.pid, "VmRSS")
            print(f"server pid {server.pid}: {args.fetch_mb} MB in topic big, RSS {rss_start_kb / 1024:.0f} MB")

            started = time.monotonic()
            for _ in range(args.idle):
                sockets.append(socket.create_connection(("127.0.0.1", port), timeout=10))
            print(f"{len(sockets)} idle connections opened in {time.monotonic() - started:.1f} s")

            fetcher = _child(UNREAD_FETCHER, address, str(args.unread), str(args.fetch_mb * MB), tokens["fetcher"])
            children.append(fetcher)
            assert fetcher.stdout is not None
            line = fetcher.stdout.readline().strip()
            if line != "SENT":
                raise SystemExit(f"the unread-fetch child failed: {line!r} rc={fetcher.wait(10)}")
            fetcher.send_signal(signal.SIGSTOP)
            print(f"{args.unread} fetches of {args.fetch_mb} MB sent; their client is stopped (SIGSTOP)")

            flooder = _child(FLOODER, address, str(args.flood_seconds), str(args.flood_concurrency), tokens["flood"])
            children.append(flooder)
            assert flooder.stdout is not None
            flooder.stdout.readline()
            print(f"produce flood: {args.flood_concurrency} concurrent 1 MB batches for {args.flood_seconds:.0f} s")

            latencies_ms: list[float] = []
            errors: dict[str, int] = {}
            probe = pb.ProduceRequest(topic="probe", partition=0, batch=records.encode([os.urandom(100)]),
                                      acks=pb.ACKS_ALL if args.probe_acks == "all" else pb.ACKS_LEADER)
            rss_samples: list[int] = []
            end = time.monotonic() + args.flood_seconds
            while time.monotonic() < end:
                t0 = time.perf_counter()
                try:
                    broker.Produce(probe, timeout=10, metadata=_auth(tokens["probe"]))
                    latencies_ms.append((time.perf_counter() - t0) * 1000)
                except grpc.RpcError as e:
                    errors[e.code().name] = errors.get(e.code().name, 0) + 1
                rss_samples.append(_status_kb(server.pid, "VmRSS"))
                time.sleep(max(0.0, 0.010 - (time.perf_counter() - t0)))
            rss_end_kb = _status_kb(server.pid, "VmRSS")
            flood_result = flooder.stdout.readline().strip()
            fetcher.send_signal(signal.SIGCONT)
            assert fetcher.stdout is not None
            fetch_result = fetcher.stdout.readline().strip()
            for s in sockets:
                s.close()
            sockets.clear()
            time.sleep(3)
            rss_after_kb = _status_kb(server.pid, "VmRSS")
            peak_kb = _status_kb(server.pid, "VmHWM")

            print()
            print(f"server peak RSS (VmHWM):       {peak_kb / 1024:8.0f} MB   (target <= 1024 MB)")
            print(f"server RSS at the end of load: {rss_end_kb / 1024:8.0f} MB   (sampled max {max(rss_samples) / 1024:.0f} MB)")
            print(f"server RSS 3 s after:          {rss_after_kb / 1024:8.0f} MB")
            if latencies_ms:
                print(
                    f"small producer (acks={args.probe_acks}):{' ' * (7 - len(args.probe_acks))}n={len(latencies_ms)} p50 {statistics.median(latencies_ms):.1f} ms"
                    f"  p99 {percentile(latencies_ms, 0.99):.1f} ms  max {max(latencies_ms):.1f} ms   (target p99 <= 50 ms)"
                )
            print(f"small producer errors:         {errors or 'none'}")
            quota = f"{args.quota_produce_mb_per_s:g} MB/s per principal" if quota_argv else "none"
            print(f"produce quota:                 {quota}")
            print(f"flood:                         {flood_result}")
            print(f"unread fetches (after SIGCONT): {fetch_result}")
            print(f"server alive:                  {server.poll() is None}")
            # The probe's latency depends on the CPU this process, the server and the flood get:
            # report the machine's load with the figures.
            print(f"load average before / after:   {' '.join(f'{x:.2f}' for x in load_before)} / "
                  f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
            channel.close()
        finally:
            for s in sockets:
                s.close()
            for child in children:
                with contextlib.suppress(ProcessLookupError):
                    child.send_signal(signal.SIGCONT)
                    child.kill()
                child.wait(10)
            stop_process(server)


if __name__ == "__main__":
    main()
