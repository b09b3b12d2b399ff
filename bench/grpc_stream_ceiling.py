"""The ceiling of the transport alone for issue 17's conditional-append target: CPU per call of a
unary echo RPC vs one message on a bidirectional stream, grpc.aio server in one process, K client
processes each with a sync channel and one request in flight (as EventStore.append is sync).

No DMQ code runs: the figures bound what any append RPC can reach on this machine. Compare them with
`event_store_bench.py --only-appends`, which prints the broker's and a client's CPU per append.

    .venv/bin/python bench/grpc_stream_ceiling.py --clients 16 --n 300 unary stream unary stream
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import queue
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc

PAYLOAD = 200  # bytes per message, about one conditional append of one small event
WARMUP = 20


def _same(b: bytes) -> bytes:
    return b


def serve(port_q: Any) -> None:
    async def run() -> None:
        async def unary(req: bytes, ctx: Any) -> bytes:
            return req

        async def stream(it: AsyncIterator[bytes], ctx: Any) -> AsyncIterator[bytes]:
            async for req in it:
                yield req

        handler = grpc.method_handlers_generic_handler(
            "bench.Echo",
            {
                "Unary": grpc.unary_unary_rpc_method_handler(unary, _same, _same),
                "Stream": grpc.stream_stream_rpc_method_handler(stream, _same, _same),
            },
        )
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        port_q.put(port)
        await server.wait_for_termination()

    asyncio.run(run())


def client(port: int, mode: str, n: int, barrier: Any, out_q: Any) -> None:
    msg = os.urandom(PAYLOAD)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        if mode == "unary":
            call = ch.unary_unary("/bench.Echo/Unary", _same, _same)
            for _ in range(WARMUP):
                call(msg)
            barrier.wait(timeout=60)
            c0, t0 = time.process_time(), time.perf_counter()
            for _ in range(n):
                call(msg)
        else:
            requests: queue.Queue[bytes | None] = queue.Queue(maxsize=1)  # one message in flight

            def gen() -> Iterator[bytes]:
                while (m := requests.get()) is not None:
                    yield m

            answers = ch.stream_stream("/bench.Echo/Stream", _same, _same)(gen())
            for _ in range(WARMUP):
                requests.put(msg)
                next(answers)
            barrier.wait(timeout=60)
            c0, t0 = time.process_time(), time.perf_counter()
            for _ in range(n):
                requests.put(msg)
                next(answers)
            requests.put(None)
        out_q.put((time.process_time() - c0, t0, time.perf_counter()))


def cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(mode: str, clients: int, n: int) -> None:
    ctx = mp.get_context("spawn")
    port_q = ctx.Queue()
    server = ctx.Process(target=serve, args=(port_q,))
    server.start()
    try:
        port = port_q.get(timeout=30)
        barrier, out_q = ctx.Barrier(clients + 1), ctx.Queue()
        procs = [ctx.Process(target=client, args=(port, mode, n, barrier, out_q)) for _ in range(clients)]
        for p in procs:
            p.start()
        barrier.wait(timeout=120)
        cpu0 = cpu_s(server.pid or 0)
        res = [out_q.get(timeout=600) for _ in procs]
        server_ms = (cpu_s(server.pid or 0) - cpu0) / (clients * n) * 1e3
        for p in procs:
            p.join(timeout=30)
    finally:
        server.kill()
        server.join()
    wall = max(r[2] for r in res) - min(r[1] for r in res)
    client_ms = sum(r[0] for r in res) / (clients * n) * 1e3
    print(
        f"{mode:6} {clients} client process(es): {clients * n / wall:,.0f} calls/s; CPU per call: server "
        f"{server_ms:.3f} ms, client {client_ms:.3f} ms; load average {os.getloadavg()[0]:.1f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--n", type=int, default=300, help="calls per client process")
    ap.add_argument("modes", nargs="*", default=["unary", "stream", "unary", "stream"], help="unary / stream, in order")
    args = ap.parse_args()
    for mode in args.modes:
        measure(mode, args.clients, args.n)


if __name__ == "__main__":
    main()
