"""Issue 13: the storage layer of a real `dmq server` under exhausted descriptors, a full disk and
damaged files. Before the fix an EMFILE or ENOSPC took the partition offline until a restart
(every later produce: INTERNAL "log ... is offline ... restart the broker"), a full disk answered
INTERNAL, damaged batches were served silently after a clean shutdown, and recovery after a
SIGKILL cut valid batches behind a damaged one."""

from __future__ import annotations

import json
import os
import pathlib
import resource
import signal
import subprocess
import time
import uuid
from collections.abc import Iterable

import grpc
import pytest
from _storage_server import Server, create_topic, dmq_executable, fetch_all, produce, reason

from dmq.proto import dmq_pb2 as pb
from dmq.proto import error_details, records

pytestmark = pytest.mark.timeout(90)

NOFILE = 256
# Below the descriptors a started server already holds (stdio, epoll, its lock, logs, SQLite, sockets).
EXHAUSTED_NOFILE = 12


def lowest_free_fd(pid: int) -> int:
    used = {int(fd) for fd in os.listdir(f"/proc/{pid}/fd")}
    return next(fd for fd in range(len(used) + 1) if fd not in used)


def produce_until_refused(
    srv: Server, topic: str, values: Iterable[bytes], acked: list[bytes]
) -> tuple[grpc.RpcError | None, bytes | None]:
    """Produce values one call each (acks=all), appending each acknowledged one to acked, until one
    is refused: that error and value (None, None when every one was taken)."""
    for value in values:
        _, err = produce(srv, topic, [value])
        if err is not None:
            return err, value
        acked.append(value)
    return None, None


def test_out_of_descriptors_is_retriable_and_the_partition_serves_again_without_restart(tmp_path):
    srv = Server(tmp_path / "data", tmp_path / "server.log", nofile=NOFILE, extra=("--segment-bytes", "4096"))
    lowered = False
    try:
        srv.wait_ready()
        create_topic(srv, "fds")
        acked: list[bytes] = []
        for i in range(3):
            base, err = produce(srv, "fds", [b"before-%d" % i])
            assert err is None
            acked.append(b"before-%d" % i)
        # Exhaust the server's descriptors. Idle TCP connections no longer can: the server keeps half of
        # its descriptors away from connections (dmq.proto.server.grpc_options), which tests/fault/
        # test_connection_flood.py checks. So lower the running server's own RLIMIT_NOFILE below every
        # descriptor number it could take (prlimit(2), as `ulimit -n` would have): its open files and
        # connections stay usable, every new open() fails with EMFILE, even after the handle cache
        # closes its idle descriptors.
        limits_before = resource.prlimit(srv.proc.pid, resource.RLIMIT_NOFILE)
        resource.prlimit(srv.proc.pid, resource.RLIMIT_NOFILE, (EXHAUSTED_NOFILE, limits_before[1]))
        lowered = True
        assert lowest_free_fd(srv.proc.pid) > EXHAUSTED_NOFILE
        # acks=all produces until one needs a new file (segments roll every 4 KiB): a retriable
        # error naming the cause, never INTERNAL, never "restart the broker"
        failed, failed_value = produce_until_refused(
            srv, "fds", (b"during-%d" % i + bytes(600) for i in range(40)), acked)
        assert failed is not None, "no produce needed a new descriptor"
        assert failed.code() == grpc.StatusCode.UNAVAILABLE, (failed.code(), failed.details())
        assert reason(failed) == error_details.STORAGE_UNAVAILABLE
        assert "EMFILE" in failed.details() and "restart" not in failed.details()
    finally:
        if lowered:
            resource.prlimit(srv.proc.pid, resource.RLIMIT_NOFILE, limits_before)
    try:
        # Once the descriptors are free again the same partition takes produces, no restart.
        deadline = time.monotonic() + 15
        while True:
            base, err = produce(srv, "fds", [b"after"])
            if err is None:
                acked.append(b"after")
                break
            assert err.code() == grpc.StatusCode.UNAVAILABLE, (err.code(), err.details())
            assert time.monotonic() < deadline, f"still failing: {err.details()}"
            time.sleep(0.2)
        for i in range(5):
            base, err = produce(srv, "fds", [b"later-%d" % i + bytes(600)])
            assert err is None, err.details()
            acked.append(b"later-%d" % i + bytes(600))
        got, last = fetch_all(srv, "fds")
        assert last.error == pb.NONE
        # every acknowledged record, in order, contiguous offsets; the failed one is not there
        assert [v for _, v in got] == acked
        assert [o for o, _ in got] == list(range(len(acked)))
        assert failed_value not in [v for _, v in got]
    finally:
        srv.stop()
    assert srv.proc.returncode == 0, srv.log_tail()


@pytest.fixture
def small_tmpfs(tmpfs):  # type: ignore[no-untyped-def]
    return tmpfs("6m")


def test_full_disk_is_resource_exhausted_retried_by_the_producer_and_loses_nothing(small_tmpfs, tmp_path, fill_disk):
    from dmq.client import Producer

    srv = Server(small_tmpfs / "data", tmp_path / "server.log")
    filler = small_tmpfs / "filler"
    try:
        srv.wait_ready()
        create_topic(srv, "full")
        acked: list[bytes] = []
        fill_disk(filler, 256 * 1024)
        full, _ = produce_until_refused(srv, "full", (b"v%04d" % i + os.urandom(16 * 1024) for i in range(200)), acked)
        assert full is not None, "the disk never filled"
        assert full.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (full.code(), full.details())
        assert reason(full) == error_details.DISK_FULL
        assert "disk full on broker" in full.details()
        # still full: a retry fails the same way (not INTERNAL, not offline)
        base, err = produce(srv, "full", [b"x" * 100_000])
        assert err is not None and reason(err) == error_details.DISK_FULL
        # the producer retries a disk-full answer within its delivery timeout
        with Producer(srv.bootstrap, delivery_timeout_ms=20_000, linger_ms=0, request_timeout_ms=5_000,
                      retry_backoff_max_ms=200) as producer:
            future = producer.send("full", b"p" * 100_000, partition=0)
            time.sleep(1.5)
            assert not future.done(), "the producer gave up on a full disk"
            filler.unlink()  # space is back
            meta = future.get(timeout=20)
            assert meta.offset == len(acked)
        acked.append(b"p" * 100_000)
        for i in range(3):
            base, err = produce(srv, "full", [b"after-%d" % i])
            assert err is None, err.details()
            acked.append(b"after-%d" % i)
        got, last = fetch_all(srv, "full")
        assert last.error == pb.NONE
        assert [v for _, v in got] == acked
        assert [o for o, _ in got] == list(range(len(acked)))
    finally:
        srv.stop()
    assert srv.proc.returncode == 0, srv.log_tail()


def dmq_cli(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*dmq_executable(), "--bootstrap", bootstrap, *args], capture_output=True, text=True,
                          timeout=60)


def segment_files(data_dir: pathlib.Path, topic: str, partition: int) -> list[pathlib.Path]:
    found = sorted(data_dir.rglob(f"{topic}-{partition}/*.log"))
    assert found, f"no segments of {topic}-{partition} under {data_dir}"
    return found


def batch_positions(path: pathlib.Path) -> list[int]:
    data = path.read_bytes()
    out, pos = [], 0
    while pos < len(data):
        out.append(pos)
        pos += records.read_header(data, pos).total_size
    return out


@pytest.mark.parametrize("stop", ["clean", "sigkill"])
def test_damaged_middle_batch_and_index_are_found_reported_and_valid_data_kept(tmp_path, stop):
    data = tmp_path / "data"
    topic = "dmg" + uuid.uuid4().hex[:6]
    srv = Server(data, tmp_path / "server.log")
    values = [b"rec-%03d" % i + bytes(300) for i in range(60)]
    try:
        srv.wait_ready()
        create_topic(srv, topic, partitions=2)
        for p in (0, 1):
            for v in values:
                base, err = produce(srv, topic, [v], partition=p)
                assert err is None
    finally:
        srv.stop(signal.SIGTERM if stop == "clean" else signal.SIGKILL)
    # partition 0: flip a byte inside batch 20's body; partition 1: a plausible but wrong index
    (seg0,) = segment_files(data, topic, 0)
    pos = batch_positions(seg0)[20] + 100
    with open(seg0, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x01]))
    (seg1,) = segment_files(data, topic, 1)
    index1 = seg1.with_suffix(".index")
    if stop == "sigkill":
        # recovery rebuilds the index of the active segment from the log anyway
        index1.write_bytes(b"")
    else:
        raw = bytearray(index1.read_bytes())
        assert len(raw) >= 16
        for i in range(0, len(raw), 8):
            p = int.from_bytes(raw[i + 4 : i + 8], "little")
            raw[i + 4 : i + 8] = (p + 5).to_bytes(4, "little")
        index1.write_bytes(bytes(raw))

    srv = Server(data, tmp_path / "server.log")
    try:
        srv.wait_ready()
        # everything before the damage is served; the damaged batch never is: the consumer gets an
        # error naming partition and offset; valid data after it is kept and served
        got, last = fetch_all(srv, topic, 0)
        assert [v for _, v in got] == values[:20]
        assert last.error == pb.CORRUPT_DATA
        assert f"{topic}[0]" in last.error_message and "offsets 20..20" in last.error_message
        after, last = fetch_all(srv, topic, 0, start=21)
        assert [v for _, v in after] == values[21:] and last.error == pb.NONE
        # partition 1 (damaged index): every record, right
        got1, last1 = fetch_all(srv, topic, 1)
        assert [v for _, v in got1] == values and last1.error == pb.NONE
        # the other partition of the same broker was never disturbed; partition 0 refuses appends
        base, err = produce(srv, topic, [b"more"], partition=1)
        assert err is None
        base, err = produce(srv, topic, [b"more"], partition=0)
        assert err is not None and err.code() == grpc.StatusCode.DATA_LOSS and "offsets 20..20" in err.details()
        # visible to the operator: describe, verify (exit 1), the server's log
        describe = dmq_cli(srv.bootstrap, "topics", "describe", topic, "-o", "json")
        assert describe.returncode == 0, describe.stderr
        parts = {p["partition"]: p for p in json.loads(describe.stdout)["partitions"]}
        assert parts[0]["status"] == "corrupt" and "offsets 20..20" in parts[0]["status_detail"]
        assert parts[1]["status"] == "ok"
        verify = dmq_cli(srv.bootstrap, "topics", "verify", topic, "-o", "json")
        assert verify.returncode == 1, verify.stdout + verify.stderr
        report = {p["partition"]: p for p in json.loads(verify.stdout)["partitions"]}
        assert not report[0]["ok"] and "offsets 20..20" in report[0]["problems"][0]
        assert report[1]["ok"] and report[1]["batches_checked"] == 61
        assert report[0]["batches_checked"] == 59
        human = dmq_cli(srv.bootstrap, "topics", "verify", topic)
        assert human.returncode == 1 and "CORRUPT" in human.stdout and "offsets 20..20" in human.stdout
        events = []
        for line in srv.log_tail(1_000_000).splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
        corrupt = [e for e in events if e.get("event", "").startswith("corrupt batch in the log")]
        assert corrupt and all(e["topic"] == topic and e["partition"] == 0 for e in corrupt)
        assert corrupt[0]["first_offset"] == 20
        if stop == "clean":
            consume_around_the_damage(srv.bootstrap, topic, values)
    finally:
        srv.stop()


def consume_around_the_damage(bootstrap: str, topic: str, values: list[bytes]) -> None:
    """A group consumer gets every record of the healthy partition and of the damaged one up to
    the damage, then an error naming partition and offset; seeking past it, the rest."""
    from dmq.client import ConsumerConfig, DMQConsumer, TopicPartition
    from dmq.client.errors import CorruptRecordError

    got: dict[int, list[bytes]] = {0: [], 1: []}
    corrupt_errors: list[str] = []
    with DMQConsumer(ConsumerConfig(metadata_service_url=bootstrap, group_id="g")) as consumer:
        consumer.subscribe(topic)
        deadline = time.monotonic() + 30
        while (len(got[1]) < 61 or len(got[0]) < 59) and time.monotonic() < deadline:
            try:
                for rec in consumer.poll(500):
                    got[rec.partition].append(rec.value)
            except CorruptRecordError as e:
                corrupt_errors.append(str(e))
                consumer.seek(TopicPartition(topic, 0), 21)  # the operator's way past the damage
    assert got[1] == [*values, b"more"]
    assert got[0] == values[:20] + values[21:]
    assert corrupt_errors and f"{topic}[0]" in corrupt_errors[0] and "offsets 20..20" in corrupt_errors[0]

