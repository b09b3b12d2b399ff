"""Group coordinator figures: rebalance latency, heartbeat throughput, a 1,000-member rebalance.

    .venv/bin/python bench/rebalance_bench.py [--trials 20] [--seconds 3] [--in-flight 64] [--members 1000]

The server runs in a SUBPROCESS (its own interpreter and GIL, as in a deployment): the embedded
`dmq server` (coordinator + one broker on one port) with the default 500 ms rebalance debounce.
Members are simulated in this process with grpc.aio and follow the client's protocol
(DESIGN.md "Consumer groups"): WatchGroup for changes; on a change, commit, then GetAssignment
(long-polling only while owning nothing); Fetch from the owned partitions.

1. Leave: 3 members, 12 partitions. One member leaves; the clock runs from LeaveGroup until every
   partition is owned again and both survivors have completed a Fetch of every partition they own
   (p50 / p99 over --trials; target <= 1 s, i.e. the debounce plus a few round trips).
2. Heartbeats: --in-flight concurrent grpc.aio Heartbeat calls (one member each, one channel per
   8 workers) against the coordinator for --seconds; beside it, in the same run, the same load of
   empty unary calls against a trivial servicer (a GroupCoordinator whose Heartbeat returns at
   once) in the same kind of subprocess. Target: heartbeats >= 70% of the empty-call rate.
   The server's CPU time per call (from /proc) is printed too: when this one load-generating
   process, not the server, is the limit (the server below 100% of a core), the rates understate
   the server and the CPU ratio is the steadier comparison.
3. 1,000 members: one group of --members members on as many partitions; one member leaves; the
   clock runs until the group is STABLE again (every partition owned by its target member, every
   member acknowledged). With range assignment nearly every partition moves, so this is the
   worst case of the hand-off. Also reported: the time for all members to join and settle.

Figures vary run to run on a shared machine: compare within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import pathlib
import statistics
import sys
import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc

from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto.grpc_options import channel_options

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _common import bench_parser, quiet_logs  # noqa: E402  (the bench helpers, shared)
from _server import ChildServer, running_embedded_server  # noqa: E402

# The empty-call baseline: a GroupCoordinator whose Heartbeat does nothing, served the same way.
TRIVIAL_SERVER_SCRIPT = textwrap.dedent(
    """
    import asyncio
    import grpc
    from dmq.proto import dmq_pb2 as pb, dmq_pb2_grpc as pb_grpc
    from dmq.proto.server.grpc_options import server_options

    class Trivial(pb_grpc.GroupCoordinatorServicer):
        async def Heartbeat(self, request, context):
            return pb.HeartbeatResponse()

    async def main():
        server = grpc.aio.server(options=server_options())
        pb_grpc.add_GroupCoordinatorServicer_to_server(Trivial(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        print("READY", f"127.0.0.1:{port}", flush=True)
        await server.wait_for_termination()

    asyncio.run(main())
    """
)

TIMEOUT_S = 30.0
SESSION_TIMEOUT_MS = 120_000  # members of the big group must outlive its setup without heartbeats


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


# -- a simulated member ---------------------------------------------------------------------------


@dataclass
class Member:
    """One consumer's membership, following the client's protocol on grpc.aio."""

    stub: pb_grpc.GroupCoordinatorStub
    broker: pb_grpc.BrokerStub
    group_id: str
    topic: str
    fetch: bool = True
    member_id: str = ""
    generation: int = -1
    owned: frozenset[int] = frozenset()
    fetched: frozenset[int] = frozenset()  # partitions of the last completed Fetch
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    progress: asyncio.Event | None = None  # set after every assignment change / fetch
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    stopped: bool = False

    async def join(self) -> None:
        response = await self.stub.JoinGroup(
            pb.JoinGroupRequest(group_id=self.group_id, client_id="bench", session_timeout_ms=SESSION_TIMEOUT_MS),
            timeout=TIMEOUT_S,
        )
        self.member_id = response.member_id
        self.member_secret = response.member_secret  # every later request of the member proves it
        self.changed.set()
        self.tasks = [asyncio.create_task(self._watch()), asyncio.create_task(self._run())]

    async def _watch(self) -> None:
        call = self.stub.WatchGroup(pb.WatchGroupRequest(group_id=self.group_id, member_id=self.member_id,
                                                          member_secret=self.member_secret))
        try:
            async for event in call:
                if event.assignment_changed or event.generation != self.generation:
                    self.changed.set()
        except grpc.aio.AioRpcError as e:
            if e.code() not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.CANCELLED):
                raise
        finally:
            call.cancel()

    async def _run(self) -> None:
        while not self.stopped:
            await self.changed.wait()
            self.changed.clear()
            if self.stopped:
                return
            # (A real client commits its consumed offsets here, before handing partitions over.)
            wait_ms = 0 if self.owned else 10_000
            try:
                answer = await self.stub.GetAssignment(
                    pb.GetAssignmentRequest(group_id=self.group_id, member_id=self.member_id, wait_ms=wait_ms,
                                           member_secret=self.member_secret),
                    timeout=TIMEOUT_S,
                )
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    return
                raise
            self.generation = answer.generation
            self.owned = frozenset(answer.partitions)
            if answer.rebalance_in_progress and not self.owned:
                self.changed.set()  # keep long-polling until something is ours
            if self.fetch and self.owned:
                request = pb.FetchRequest(
                    partitions=[pb.FetchPartition(topic=self.topic, partition=p, offset=0) for p in sorted(self.owned)],
                    max_wait_ms=0,
                )
                await self.broker.Fetch(request, timeout=TIMEOUT_S)
                self.fetched = self.owned
            if self.progress is not None:
                self.progress.set()

    async def leave(self) -> None:
        self.stopped = True
        self.changed.set()
        await self.stub.LeaveGroup(pb.LeaveGroupRequest(group_id=self.group_id, member_id=self.member_id,
                                                     member_secret=self.member_secret),
                                   timeout=TIMEOUT_S)
        await self.close()

    async def close(self) -> None:
        self.stopped = True
        self.changed.set()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    async with grpc.aio.insecure_channel(bootstrap, options=channel_options()) as channel:
        await pb_grpc.MetadataStub(channel).CreateTopic(
            pb.CreateTopicRequest(name=name, partitions=partitions), timeout=120
        )


async def find_group(stub: pb_grpc.GroupCoordinatorStub, topic: str, app_id: str) -> str:
    response = await stub.FindOrCreateGroup(pb.FindOrCreateGroupRequest(topic=topic, app_id=app_id), timeout=TIMEOUT_S)
    return response.group_id


async def group_state(stub: pb_grpc.GroupCoordinatorStub, group_id: str) -> pb.GroupSummary:
    response = await stub.ListGroups(pb.ListGroupsRequest(), timeout=TIMEOUT_S)
    return next(g for g in response.groups if g.group_id == group_id)


async def wait_stable(stub: pb_grpc.GroupCoordinatorStub, group_id: str, after_generation: int,
                      timeout_s: float = 120.0) -> pb.GroupSummary:
    """Polls ListGroups (every 5 ms, a cheap RPC) until STABLE at a newer generation."""
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        summary = await group_state(stub, group_id)
        if summary.state == pb.GROUP_STATE_STABLE and summary.generation > after_generation:
            return summary
        await asyncio.sleep(0.005)
    raise SystemExit(f"group {group_id} did not become stable within {timeout_s} s")


# -- 1. leave with 3 members ----------------------------------------------------------------------


async def bench_leave(bootstrap: str, trials: int, partitions: int = 12, members: int = 3) -> list[float]:
    await create_topic(bootstrap, "leave", partitions)
    everything = frozenset(range(partitions))
    times = []
    async with grpc.aio.insecure_channel(bootstrap, options=channel_options()) as channel:
        stub, broker = pb_grpc.GroupCoordinatorStub(channel), pb_grpc.BrokerStub(channel)
        for trial in range(trials):
            group_id = await find_group(stub, "leave", f"trial-{trial}")
            group = [Member(stub, broker, group_id, "leave") for _ in range(members)]
            progress = asyncio.Event()
            for m in group:
                m.progress = progress
            await asyncio.gather(*(m.join() for m in group))
            summary = await wait_stable(stub, group_id, 0)
            while frozenset().union(*(m.fetched for m in group)) != everything:
                progress.clear()
                await asyncio.wait_for(progress.wait(), TIMEOUT_S)

            leaver, survivors = group[0], group[1:]
            t0 = time.perf_counter()
            await leaver.leave()
            # Done when the survivors own every partition between them and each has fetched all of
            # its own (a survivor that lost a partition to the other counts once it let go of it).
            while not (
                frozenset().union(*(m.owned for m in survivors)) == everything
                and all(m.fetched == m.owned and m.generation > summary.generation for m in survivors)
                and sum(len(m.owned) for m in survivors) == partitions
            ):
                progress.clear()
                await asyncio.wait_for(progress.wait(), TIMEOUT_S)
            times.append(time.perf_counter() - t0)
            for m in survivors:
                await m.leave()
    return times


# -- 2. heartbeat throughput ----------------------------------------------------------------------


@dataclass
class Rate:
    calls_per_s: float
    server_cpu_us_per_call: float  # the server process's CPU time per call
    server_cpu_share: float  # of one core, while measuring


async def heartbeat_rate(server: ChildServer, requests: list[pb.HeartbeatRequest], seconds: float) -> Rate:
    """Calls per second with len(requests) calls in flight (one worker per request)."""
    bootstrap = server.bootstrap
    channels = [grpc.aio.insecure_channel(bootstrap, options=channel_options())
                for _ in range(max(1, len(requests) // 8))]
    stubs = [pb_grpc.GroupCoordinatorStub(c) for c in channels]
    count = 0
    stop_at = 0.0

    async def worker(i: int, request: pb.HeartbeatRequest) -> None:
        nonlocal count
        call = stubs[i % len(stubs)].Heartbeat
        await call(request, timeout=TIMEOUT_S)  # connect outside the clock
        while time.perf_counter() < stop_at:
            await call(request, timeout=TIMEOUT_S)
            count += 1

    try:
        for c in channels:
            await c.channel_ready()
        stop_at = time.perf_counter() + 0.5  # warm-up
        await asyncio.gather(*(worker(i, r) for i, r in enumerate(requests)))
        count = 0
        cpu0 = server.cpu_s()
        t0 = time.perf_counter()
        stop_at = t0 + seconds
        await asyncio.gather(*(worker(i, r) for i, r in enumerate(requests)))
        elapsed = time.perf_counter() - t0
        cpu = server.cpu_s() - cpu0
        return Rate(count / elapsed, cpu / max(count, 1) * 1e6, cpu / elapsed)
    finally:
        for c in channels:
            await c.close()


async def bench_heartbeats(
    server: ChildServer, trivial: ChildServer, in_flight: int, seconds: float, rounds: int
) -> tuple[Rate, Rate]:
    bootstrap = server.bootstrap
    await create_topic(bootstrap, "beats", 12)
    async with grpc.aio.insecure_channel(bootstrap, options=channel_options()) as channel:
        stub = pb_grpc.GroupCoordinatorStub(channel)
        group_id = await find_group(stub, "beats", "hb")
        join = pb.JoinGroupRequest(group_id=group_id, client_id="hb", session_timeout_ms=SESSION_TIMEOUT_MS)
        joined = [await stub.JoinGroup(join, timeout=TIMEOUT_S) for _ in range(in_flight)]
        secrets = {j.member_id: j.member_secret for j in joined}
        generation = await wait_stable_by_acking(stub, group_id, secrets)
        requests = [pb.HeartbeatRequest(group_id=group_id, member_id=m, generation=generation, member_secret=s)
                    for m, s in secrets.items()]
        empty = list(requests)  # the same messages, to a servicer that does nothing with them
        runs: dict[str, list[Rate]] = {"real": [], "trivial": []}
        for _ in range(rounds):  # interleaved, best of each, so drift on a shared machine hits both
            runs["trivial"].append(await heartbeat_rate(trivial, empty, seconds))
            runs["real"].append(await heartbeat_rate(server, requests, seconds))
        real_rate = max(runs["real"], key=lambda r: r.calls_per_s)
        trivial_rate = max(runs["trivial"], key=lambda r: r.calls_per_s)
        answer = await stub.Heartbeat(requests[0], timeout=TIMEOUT_S)
        assert answer.generation == generation and not answer.assignment_changed, answer
    return real_rate, trivial_rate


async def wait_stable_by_acking(stub: pb_grpc.GroupCoordinatorStub, group_id: str, members: dict[str, str]) -> int:
    """members: member id -> its secret."""
    answers = await asyncio.gather(*(
        stub.GetAssignment(pb.GetAssignmentRequest(group_id=group_id, member_id=m, member_secret=s, wait_ms=10_000),
                           timeout=TIMEOUT_S)
        for m, s in members.items()
    ))
    assert not any(a.rebalance_in_progress for a in answers)
    return answers[0].generation


# -- 3. one group of 1,000 members ----------------------------------------------------------------


@dataclass
class BigGroup:
    settle_s: float
    rebalance_s: float
    server_cpu_s: float  # during the rebalance
    members: int


async def bench_big_group(server: ChildServer, members: int) -> BigGroup:
    bootstrap = server.bootstrap
    await create_topic(bootstrap, "big", members)
    channels = [grpc.aio.insecure_channel(bootstrap, options=channel_options()) for _ in range(8)]
    try:
        stubs = [pb_grpc.GroupCoordinatorStub(c) for c in channels]
        brokers = [pb_grpc.BrokerStub(c) for c in channels]
        group_id = await find_group(stubs[0], "big", "big")
        group = [Member(stubs[i % 8], brokers[i % 8], group_id, "big", fetch=False) for i in range(members)]
        t0 = time.perf_counter()
        for i in range(0, members, 100):  # joins in waves, as consumers starting together
            await asyncio.gather(*(m.join() for m in group[i : i + 100]))
        summary = await wait_stable(stubs[0], group_id, 0)
        settle_s = time.perf_counter() - t0

        leaver = group[members // 2]
        cpu0 = server.cpu_s()
        t0 = time.perf_counter()
        await leaver.leave()
        after = await wait_stable(stubs[0], group_id, summary.generation)
        rebalance_s = time.perf_counter() - t0
        cpu_s = server.cpu_s() - cpu0
        assert after.member_count == members - 1, after
        await asyncio.gather(*(m.close() for m in group))
        return BigGroup(settle_s, rebalance_s, cpu_s, after.member_count)
    finally:
        for c in channels:
            await c.close()


# -- main -----------------------------------------------------------------------------------------


async def run(args: argparse.Namespace, server: ChildServer, trivial: ChildServer) -> None:
    bootstrap = server.bootstrap
    print(f"rebalance bench: embedded server in a subprocess at {bootstrap}, 500 ms debounce")

    times = await bench_leave(bootstrap, args.trials)
    print(f"\n1. one of 3 members leaves (12 partitions), {len(times)} trials: until every partition is owned "
          f"and the survivors are fetching")
    print(f"   p50 {percentile(times, 0.5) * 1000:7.1f} ms   p99 {percentile(times, 0.99) * 1000:7.1f} ms   "
          f"min {min(times) * 1000:7.1f} ms   max {max(times) * 1000:7.1f} ms   mean "
          f"{statistics.fmean(times) * 1000:7.1f} ms   (target p99 <= 1000 ms)")

    real, empty = await bench_heartbeats(server, trivial, args.in_flight, args.seconds, args.rounds)
    print(f"\n2. heartbeats, {args.in_flight} in flight, {args.seconds:.0f} s each (best of {args.rounds}, interleaved)")
    for name, r in (("coordinator Heartbeat", real), ("trivial servicer (empty)", empty)):
        print(f"   {name:<26} {r.calls_per_s:>8,.0f} calls/s   server CPU {r.server_cpu_us_per_call:6.0f} us/call "
              f"({r.server_cpu_share:4.0%} of a core; {1e6 / r.server_cpu_us_per_call:,.0f} calls/s at a full core)")
    print(f"   ratio                      {real.calls_per_s / empty.calls_per_s:>8.0%}   (target >= 70%); "
          f"by server CPU per call {empty.server_cpu_us_per_call / real.server_cpu_us_per_call:.0%}")

    big = await bench_big_group(server, args.members)
    print(f"\n3. one group of {args.members} members on {args.members} partitions")
    print(f"   join + first generation stable   {big.settle_s * 1000:8.0f} ms")
    print(f"   one leaves -> stable again       {big.rebalance_s * 1000:8.0f} ms   ({big.members} members, "
          f"500 ms of it is the debounce; server CPU {big.server_cpu_s * 1000:.0f} ms)")


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="heartbeat measurements per server (best kept)")
    parser.add_argument("--members", type=int, default=1000)
    args = parser.parse_args()
    quiet_logs()

    with running_embedded_server("dmq-rebalance-bench-") as server:
        trivial = ChildServer(TRIVIAL_SERVER_SCRIPT)
        try:
            asyncio.run(run(args, server, trivial))
        finally:
            with contextlib.suppress(Exception):
                trivial.stop()


if __name__ == "__main__":
    main()
