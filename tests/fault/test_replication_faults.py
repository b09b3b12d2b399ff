"""Twenty broker faults in a seeded random order against a replicated topic (issue 15).

Real processes: a coordinator, three brokers, two idempotent acks=all producers and a consumer
group (one member, committing after every poll, closed and started again after every fault) —
all running throughout. The faults: SIGKILL the leader of a partition; SIGSTOP a broker for 10 s;
restart a broker with its data; kill the same broker twice in a row. After each, the test waits
until every partition is fully in sync again.

Afterwards: every acknowledged record is in the log exactly once, at the offset it was
acknowledged with, in send order per partition; the group read every acknowledged record, in order
per partition within each member; each new member started at or after the group's last
acknowledged commit and never past what the group had read; and the three replicas' logs
are byte-identical up to the high watermark. The seed is printed (and DMQ_FAULT_SEED replays it).
"""

from __future__ import annotations

import os
import pathlib
import random
import signal
import sys
import time
from collections import defaultdict

import grpc
import pytest
from _isolation_procs import ProcCluster

from dmq.broker.log import LogConfig, LogManager
from dmq.client import SimpleConsumer
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import records

sys.path.insert(0, str(pathlib.Path(__file__).parent.parent / "e2e"))
from _procs import ConsumerProc, Proc  # noqa: E402

pytestmark = pytest.mark.timeout(900)

TOPIC = "faults"
PARTITIONS = 3
FAULTS = 20
STOP_S = 10.0
HEAL_TIMEOUT_S = 90.0
KINDS = ("kill-leader", "stop-10s", "restart", "kill-twice")


class Cluster:
    def __init__(self, procs: ProcCluster) -> None:
        self.procs = procs
        self.channel = grpc.insecure_channel(procs.bootstrap)
        self.metadata = pb_grpc.MetadataStub(self.channel)

    def partitions(self) -> list[pb.PartitionInfo]:
        return list(self.metadata.GetMetadata(pb.GetMetadataRequest(topics=[TOPIC]), timeout=10).topics[0].partitions)

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + HEAL_TIMEOUT_S
        while True:
            try:
                infos = self.partitions()
                if all(len(i.isr) == 3 and i.leader_alive for i in infos):
                    return
            except grpc.RpcError:
                infos = []
            assert time.monotonic() < deadline, f"not healed within {HEAL_TIMEOUT_S} s: {infos}"
            time.sleep(0.2)

    def kill(self, broker: int) -> None:
        proc = self.procs.brokers[broker]
        proc.kill()
        proc.wait(10)

    def restart(self, broker: int) -> None:
        self.procs.start_broker(broker)


def _fault(cluster: Cluster, kind: str, rng: random.Random) -> str:
    if kind == "kill-leader":
        info = rng.choice(cluster.partitions())
        cluster.kill(info.leader_id)
        time.sleep(rng.uniform(0.5, 3.0))
        cluster.restart(info.leader_id)
        return f"SIGKILL leader {info.leader_id} of partition {info.partition}"
    broker = rng.randrange(3)
    if kind == "stop-10s":
        cluster.procs.signal_broker(broker, signal.SIGSTOP)
        time.sleep(STOP_S)
        cluster.procs.signal_broker(broker, signal.SIGCONT)
        return f"SIGSTOP broker {broker} for {STOP_S:.0f} s"
    if kind == "restart":
        proc = cluster.procs.brokers[broker]
        proc.terminate()
        proc.wait(30)
        cluster.restart(broker)
        return f"restart broker {broker}"
    cluster.kill(broker)
    cluster.restart(broker)
    cluster.kill(broker)
    time.sleep(rng.uniform(0.5, 2.0))
    cluster.restart(broker)
    return f"SIGKILL broker {broker} twice in a row"


def _stored(bootstrap: str, partition: int, end: int) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    with SimpleConsumer(bootstrap) as consumer:
        for batch in consumer.consume_batches(TOPIC, partition, 0, end_offset=end, max_wait_ms=1000):
            for record in batch:
                if record.offset < end:
                    out.append((record.offset, record.value.decode()))
    return out


def _replica_bytes(data_dir: pathlib.Path, partition: int, end: int) -> bytes:
    logs = LogManager(data_dir / "logs", LogConfig())
    logs.open_existing()
    try:
        plog = logs.get(TOPIC, partition)
        chunks, offset = [], plog.log_start_offset
        while offset < end:
            raw = plog.read(offset, 1 << 20, max_offset=end)
            assert raw, f"{data_dir} partition {partition}: log ends at {offset} < high watermark {end}"
            chunks.append(raw)
            batches = records.decode_batches(raw)
            offset = batches[-1].header.base_offset + batches[-1].header.record_count
        return b"".join(chunks)
    finally:
        logs.close()


def test_twenty_faults_lose_no_acknowledged_record(tmp_path: pathlib.Path) -> None:
    seed = int(os.environ.get("DMQ_FAULT_SEED", random.randrange(2**32)))
    print(f"replication fault test seed: {seed} (DMQ_FAULT_SEED={seed} replays the order)", flush=True)
    rng = random.Random(seed)
    with ProcCluster(
        tmp_path, 3, broker_session_timeout_ms=1000, broker_args=["--replica-lag-time-max-ms", "2000"]
    ) as procs:
        cluster = Cluster(procs)
        config = pb.TopicConfig(replication_factor=3, min_insync_replicas=2)
        cluster.metadata.CreateTopic(pb.CreateTopicRequest(name=TOPIC, partitions=PARTITIONS, config=config), timeout=30)
        cluster.wait_healthy()
        producers = [
            Proc(f"producer{k}", "acked_producer_proc.py",
                 ["--bootstrap", procs.bootstrap, "--topic", TOPIC, "--partitions", str(PARTITIONS),
                  "--rate", "100", "--name", f"p{k}"])
            for k in range(2)
        ]
        members: list[ConsumerProc] = []
        try:
            for n in range(FAULTS):
                member = ConsumerProc(f"member{n}", procs.bootstrap, TOPIC, "g", commit="sync")
                members.append(member)
                member.wait_for(lambda e: e.get("ev") == "ready", 60, "ready")
                kind = rng.choice(KINDS)
                what = _fault(cluster, kind, rng)
                cluster.wait_healthy()
                print(f"fault {n + 1:2}/{FAULTS}: {what}; healed", flush=True)
                member.stop(30)
            for producer in producers:
                producer.send("close")
            for producer in producers:
                producer.wait_for(lambda e: e.get("ev") == "closed", 150, "closed")
            acked = {e["v"]: (e["p"], e["o"]) for p in producers for e in p.of("acked")}
            last = ConsumerProc("member-last", procs.bootstrap, TOPIC, "g", commit="sync")
            members.append(last)
            read_by_group = lambda: {v for m in members for _, _, v in m.consumed()}  # noqa: E731
            deadline = time.monotonic() + 120
            while not set(acked) <= read_by_group():
                assert time.monotonic() < deadline, f"the group never read {len(set(acked) - read_by_group())} acked records"
                time.sleep(0.5)
            last.stop(30)
        finally:
            for proc in [*producers, *members]:
                proc.kill()

        assert len(acked) > 1000, f"only {len(acked)} records acknowledged: the producers stalled"
        # every acknowledged record stored exactly once, where it was acknowledged, in send order
        with SimpleConsumer(procs.bootstrap) as consumer:
            ends = {p: consumer.offsets(TOPIC, p)[1] for p in range(PARTITIONS)}
        stored = {p: _stored(procs.bootstrap, p, ends[p]) for p in range(PARTITIONS)}
        positions = {v: (p, o) for p, items in stored.items() for o, v in items}
        for p, items in stored.items():
            values = [v for _, v in items]
            assert len(values) == len(set(values)), f"partition {p}: a record stored twice"
            for name in ("p0", "p1"):
                seq = [int(v.split("-")[1]) for v in values if v.startswith(name + "-")]
                assert seq == sorted(seq), f"partition {p}: {name}'s records out of send order"
        lost = {v: at for v, at in acked.items() if positions.get(v) != at}
        assert not lost, f"{len(lost)} acknowledged records lost or moved, e.g. {list(lost.items())[:5]}"

        # each member started where the group's acknowledged commits said: not below the last
        # one (a lost commit), not past what the members before it had read (a skipped record)
        committed: dict[int, int] = {}
        read_up_to: dict[int, int] = defaultdict(lambda: -1)
        for member in members:
            firsts: dict[int, int] = {}
            for p, o, _ in member.consumed():
                firsts.setdefault(p, o)
            for p, first in firsts.items():
                assert first >= committed.get(p, 0), (
                    f"{member.name} started partition {p} at {first}, below the acknowledged commit {committed.get(p)}"
                )
                assert first <= max(read_up_to[p] + 1, committed.get(p, 0)), (
                    f"{member.name} started partition {p} at {first}, past what the group had read ({read_up_to[p]})"
                )
            for e in member.of("commit"):
                for p, o in e["offsets"].items():
                    committed[int(p)] = max(committed.get(int(p), 0), o)
            for p, o, _ in member.consumed():
                read_up_to[p] = max(read_up_to[p], o)
        for m in members:
            by_partition: dict[int, list[int]] = defaultdict(list)
            for p, o, _ in m.consumed():
                by_partition[p].append(o)
            for p, offsets in by_partition.items():
                assert offsets == sorted(set(offsets)), f"{m.name} read partition {p} out of order"

        high_watermarks = ends
    # the cluster is stopped: the replicas' logs, byte for byte up to the high watermark
    for p in range(PARTITIONS):
        copies = {b: _replica_bytes(tmp_path / f"b{b}", p, high_watermarks[p]) for b in range(3)}
        assert copies[0] == copies[1] == copies[2], f"partition {p}: replicas differ below the high watermark"
