"""Issue 13: commits and topic creation on a full disk, with a real `dmq server` whose data
directory is a small tmpfs. A full disk answered INTERNAL to CommitOffsets and CreateTopic; now both
are RESOURCE_EXHAUSTED with the disk-full reason (the client raises DiskFullError, the CLI prints
one line), nothing stored is damaged, and once space is freed the same requests succeed and the
committed offset reads back, also after a restart."""

from __future__ import annotations

import subprocess
import time

import pytest
from _storage_server import Server, create_topic, dmq_executable, fetch_all, produce

from dmq.client import OffsetAndMetadata

pytestmark = pytest.mark.timeout(90)

TOPIC = "commits"


@pytest.fixture
def small_tmpfs(tmpfs):  # type: ignore[no-untyped-def]
    return tmpfs("6m")


def consumer_for(bootstrap: str):  # type: ignore[no-untyped-def]
    from dmq.client import ConsumerConfig, DMQConsumer

    return DMQConsumer(ConsumerConfig(metadata_service_url=bootstrap, group_id="g", enable_auto_commit=False,
                                      request_timeout_ms=5_000))


def poll_until(consumer, count: int) -> list[bytes]:  # type: ignore[no-untyped-def]
    got: list[bytes] = []
    deadline = time.monotonic() + 20
    while len(got) < count and time.monotonic() < deadline:
        got += [r.value for r in consumer.poll(500)]
    return got


def test_commit_on_a_full_disk_is_disk_full_and_works_again_once_space_is_freed(small_tmpfs, tmp_path, fill_disk):
    from dmq.client import TopicPartition
    from dmq.client import errors as client_errors

    srv = Server(small_tmpfs / "data", tmp_path / "server.log")
    filler = small_tmpfs / "filler"
    tp = TopicPartition(TOPIC, 0)
    values = [b"rec-%02d" % i for i in range(10)]
    try:
        srv.wait_ready()
        create_topic(srv, TOPIC)
        for v in values:
            assert produce(srv, TOPIC, [v])[1] is None
        with consumer_for(srv.bootstrap) as consumer:
            consumer.subscribe(TOPIC)
            assert poll_until(consumer, 10) == values  # the member owns the partition
            assert consumer.assignment() == {tp}
            consumer.commit_sync({tp: 4})
            fill_disk(filler)
            # A commit is a record of the partition's internal log: one with 4,000 characters of
            # metadata needs a new page of the full tmpfs (a tiny one may still fit a page's tail).
            with pytest.raises(client_errors.DiskFullError) as info:
                consumer.commit_sync({tp: OffsetAndMetadata(10, "m" * 4000)}, timeout=3)
            assert info.value.code == "RESOURCE_EXHAUSTED"
            assert "disk full on broker" in str(info.value)
            # the failed commit changed nothing
            assert consumer.committed(tp) == OffsetAndMetadata(4)
            # the coordinator's writes on the same disk: a one-line reason from the CLI, exit 1
            cli = subprocess.run([*dmq_executable(), "--bootstrap", srv.bootstrap, "topics", "create", "other"],
                                 capture_output=True, text=True, timeout=60)
            assert cli.returncode == 1, cli.stdout + cli.stderr
            lines = [line for line in (cli.stdout + cli.stderr).splitlines() if line.strip()]
            assert len(lines) == 1 and "disk full" in lines[0], lines
            # space freed: the same commit succeeds and reads back
            filler.unlink()
            consumer.commit_sync({tp: 10}, timeout=10)
            assert consumer.committed(tp) == OffsetAndMetadata(10)
        cli = subprocess.run([*dmq_executable(), "--bootstrap", srv.bootstrap, "topics", "create", "other"],
                             capture_output=True, text=True, timeout=60)
        assert cli.returncode == 0, cli.stdout + cli.stderr
    finally:
        srv.stop()
    assert srv.proc.returncode == 0, srv.log_tail()
    # nothing corrupt: after a restart the log and the committed offset are intact
    srv = Server(small_tmpfs / "data", tmp_path / "server2.log")
    try:
        srv.wait_ready()
        got, last = fetch_all(srv, TOPIC)
        assert [v for _, v in got] == values and last.error == 0
        with consumer_for(srv.bootstrap) as consumer:
            assert consumer.committed(tp) == OffsetAndMetadata(10)
    finally:
        srv.stop()
