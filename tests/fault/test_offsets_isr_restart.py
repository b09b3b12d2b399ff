"""Group commits are stored in the internal offsets log beside each data partition, which shares
the data partition's in-sync set; a commit is acknowledged once every member has it. Issue 28 (the
HA fault test): after a broker restart, commits were refused with "`__offsets+T[0]`: the in-sync
replicas did not all get the write" although the data partition showed every replica in sync.

- A follower SIGKILLed and restarted (while it is down the leader compacts the offsets log past
  its copy): every commit sent once the data partition shows it back in sync is acknowledged.
- A follower that keeps up with the data but never fetches the offsets log (a broker process whose
  fetcher skips them, offsets_stall_broker_proc.py) leaves the in-sync set after
  replica_lag_time_max_ms and commits succeed; before the fix only the data was checked, the
  follower stayed in, and every commit waited out replica_ack_timeout_ms and was refused.

Real processes: a coordinator and three brokers (ProcCluster); commits to the partition's leader.
"""

from __future__ import annotations

import pathlib
import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest
from _isolation_procs import ProcCluster
from _replicated_group import create_topic_and_group, in_sync_group_with_ten_records, wait_partition

from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(180)

TOPIC = "offsisr"
WAIT_S = 60.0  # a bound on each wait for a state, not a timed assertion
COMMITS_AFTER_INSYNC = 10
# Well below the default 15 s, so a commit that waits for a replica that is not fetching the
# offsets log is refused quickly; far above what an honest in-sync set needs on loopback.
ACK_TIMEOUT_MS = 4000


def _wait(metadata: pb_grpc.MetadataStub, ok, what: str) -> pb.PartitionInfo:  # type: ignore[no-untyped-def]
    return wait_partition(metadata, TOPIC, ok, what, WAIT_S, 0.05)


class Committer:
    """Commits increasing offsets to one broker, one at a time, until stopped; keeps every
    outcome as (started, finished, error or None), monotonic seconds."""

    def __init__(self, address: str, group: str) -> None:
        self.address = address
        self.group = group
        self.outcomes: list[tuple[float, float, str | None]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="committer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        offset = 0
        with grpc.insecure_channel(self.address) as channel:
            stub = pb_grpc.BrokerStub(channel)
            while not self._stop.is_set():
                offset += 1
                started = time.monotonic()
                error = None
                try:
                    stub.CommitOffsets(pb.CommitOffsetsRequest(
                        group_id=self.group, generation=-1,
                        offsets=[pb.PartitionOffset(topic=TOPIC, partition=0, offset=offset % 10)],
                    ), timeout=30)
                except grpc.RpcError as e:
                    error = f"{e.code().name}: {e.details()}"  # type: ignore[attr-defined]
                    self._stop.wait(0.05)  # a client's retry backoff, not a readiness wait
                with self._lock:
                    self.outcomes.append((started, time.monotonic(), error))

    def acknowledged_since(self, t: float) -> int:
        with self._lock:
            return sum(1 for s, _, e in self.outcomes if s >= t and e is None)

    def stop(self) -> list[tuple[float, float, str | None]]:
        self._stop.set()
        self._thread.join(40)
        with self._lock:
            return list(self.outcomes)


def test_commits_are_acknowledged_once_the_restarted_follower_is_back_in_sync(tmp_path: pathlib.Path) -> None:
    with ProcCluster(
        tmp_path, 3, broker_session_timeout_ms=1000,
        broker_args=["--replica-lag-time-max-ms", "1000", "--replica-ack-timeout-ms", str(ACK_TIMEOUT_MS)],
    ) as cluster, grpc.insecure_channel(cluster.bootstrap) as channel:
        metadata = pb_grpc.MetadataStub(channel)
        group, info = in_sync_group_with_ten_records(channel, cluster.broker_addresses, TOPIC, "offsisr", WAIT_S, 0.05)
        leader = info.leader_id

        committer = Committer(cluster.broker_addresses[leader], group)
        try:
            start = time.monotonic()
            while committer.acknowledged_since(0.0) < COMMITS_AFTER_INSYNC:
                assert time.monotonic() < start + WAIT_S, "no commits before the fault"
                time.sleep(0.05)  # polling a condition under a deadline
            follower = next(b for b in info.replicas if b != leader)
            cluster.signal_broker(follower, signal.SIGKILL)
            _wait(metadata, lambda i: follower not in i.isr, "the killed follower leaving the in-sync set")
            # While it is down the leader compacts the offsets log past its copy's end (one
            # request of COMPACT_MIN_RECORDS+ entries), so the restarted copy starts over.
            with grpc.insecure_channel(cluster.broker_addresses[leader]) as conn:
                pb_grpc.BrokerStub(conn).CommitOffsets(pb.CommitOffsetsRequest(
                    group_id=group, generation=-1,
                    offsets=[pb.PartitionOffset(topic=TOPIC, partition=0, offset=i % 10) for i in range(1200)]), timeout=30)
            cluster.start_broker(follower)
            back = _wait(metadata, lambda i: len(i.isr) == 3, "the restarted follower back in sync")
            assert back.leader_id == leader, back
            insync_at = time.monotonic()
            deadline = insync_at + WAIT_S
            while committer.acknowledged_since(insync_at) < COMMITS_AFTER_INSYNC:
                assert time.monotonic() < deadline, "commits did not resume after the follower was back in sync"
                time.sleep(0.05)  # polling a condition under a deadline
        finally:
            outcomes = committer.stop()

    # Every commit sent once the data partition showed all three in sync is acknowledged: its
    # in-sync set is also the offsets log's, so it must be honest for the offsets log too.
    refused = [(round(s - insync_at, 2), round(f - s, 2), e) for s, f, e in outcomes if s >= insync_at and e]
    assert not refused, f"commits refused after the follower was back in sync (start s, took s, error): {refused}"


STALL_BROKER = pathlib.Path(__file__).with_name("offsets_stall_broker_proc.py")


def _start_stalled_broker(cluster: ProcCluster, root: pathlib.Path, broker_id: int) -> subprocess.Popen[bytes]:
    """Broker `broker_id` as a process whose fetcher never fetches the offsets logs; its address
    goes into cluster.broker_addresses once its log says it listens."""
    log_path = root / f"broker{broker_id}-stalled.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, str(STALL_BROKER), "broker", "--coordinator", cluster.bootstrap, "--broker-id",
             str(broker_id), "--data-dir", str(root / f"b{broker_id}"), "--log-level", "warning",
             "--replica-lag-time-max-ms", "1000", "--replica-ack-timeout-ms", str(ACK_TIMEOUT_MS)],
            stdout=log, stderr=log)
    ready = f"broker {broker_id} listening on"
    deadline = time.monotonic() + WAIT_S
    while True:
        line = next((x for x in log_path.read_text(errors="replace").splitlines() if ready in x), None)
        if line is not None:
            cluster.broker_addresses[broker_id] = line.rsplit(" ", 1)[-1].strip()
            return proc
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"stalled broker did not start: {log_path.read_text(errors='replace')[-2000:]}")
        time.sleep(0.05)  # polling a condition (the ready line) under a deadline


def test_a_follower_behind_on_the_offsets_log_leaves_the_in_sync_set(tmp_path: pathlib.Path) -> None:
    """A follower that keeps up with the data but not with its offsets log is removed from the
    shared in-sync set after replica_lag_time_max_ms, as one lagging on the data is; commits then
    succeed. Before, only the data was checked: the follower stayed in sync and every commit
    waited out replica_ack_timeout_ms and was refused, for as long as it lagged."""
    with ProcCluster(
        tmp_path, 2, broker_session_timeout_ms=1000,
        broker_args=["--replica-lag-time-max-ms", "1000", "--replica-ack-timeout-ms", str(ACK_TIMEOUT_MS)],
    ) as cluster, grpc.insecure_channel(cluster.bootstrap) as channel:
        stalled = _start_stalled_broker(cluster, tmp_path, 2)
        try:
            metadata = pb_grpc.MetadataStub(channel)
            group = create_topic_and_group(channel, TOPIC, "offsisr", partitions=3)
            deadline = time.monotonic() + WAIT_S
            while True:  # a partition broker 2 follows (the placement is the coordinator's)
                parts = metadata.GetMetadata(pb.GetMetadataRequest(topics=[TOPIC]), timeout=10).topics[0].partitions
                part = next((p for p in parts if p.leader_alive and p.leader_id != 2 and 2 in p.replicas), None)
                if part is not None:
                    break
                assert time.monotonic() < deadline, parts
                time.sleep(0.05)  # polling a condition under a deadline
            outcomes: list[str | None] = []
            with grpc.insecure_channel(cluster.broker_addresses[part.leader_id]) as conn:
                stub = pb_grpc.BrokerStub(conn)
                deadline = time.monotonic() + 3 * ACK_TIMEOUT_MS / 1000
                while not outcomes or outcomes[-1] is not None:
                    assert time.monotonic() < deadline, f"commits still refused: {outcomes}"
                    try:
                        stub.CommitOffsets(pb.CommitOffsetsRequest(
                            group_id=group, generation=-1,
                            offsets=[pb.PartitionOffset(topic=TOPIC, partition=part.partition, offset=0)],
                        ), timeout=30)
                        outcomes.append(None)
                    except grpc.RpcError as e:
                        outcomes.append(f"{e.code().name}: {e.details()}")  # type: ignore[attr-defined]
            info = metadata.GetMetadata(pb.GetMetadataRequest(topics=[TOPIC]), timeout=10).topics[0].partitions[
                part.partition]
            assert 2 not in info.isr, info
        finally:
            stalled.kill()
            stalled.wait(10)
