"""Shared fixtures: real coordinator and broker servers on loopback port 0, fresh data per test.

The servers run on their own event loop in a background thread (ClusterThread), so the
synchronous client library can be used from the test's thread, and async tests can also talk
to them over gRPC without sharing a loop.
"""

from __future__ import annotations

import errno
import os
import pathlib
import subprocess
import uuid
from collections.abc import Callable, Iterator, Mapping

import pytest

# Before grpc is imported (the import below loads it): grpcio >= 1.80 with fork support on runs
# its fork handlers in a child of subprocess.Popen, whose poller thread then finds its epoll fd
# closed by close_fds and aborts the child before exec (grpc/grpc#43055). Seen in a full run: a
# `dmq server` started by a test died at once with SIGABRT, "epoll_wait error: Bad file descriptor".
# The suite forks children while its in-process servers' channels are live, so it turns that off.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from dmq.client import AdminClient  # noqa: E402
from dmq.client.cli.runner import ClusterOptions, ClusterThread  # noqa: E402
from tests.etcd_server import EtcdServer, running_etcd  # noqa: E402

# `dmq server` serves /metrics on port 9464 by default. The suite starts many `dmq server`
# processes (and other engineers' suites may run beside it): they inherit this and serve none,
# so no two fight over the port. A test that wants the endpoint passes --metrics-port.
os.environ["DMQ_METRICS_PORT"] = "0"


@pytest.fixture
def cluster_factory(tmp_path: pathlib.Path) -> Iterator[Callable[..., ClusterThread]]:
    """Start clusters with custom options; every one started is stopped after the test.
    topics={name: partitions}: created once the cluster is up."""
    started: list[ClusterThread] = []

    def make(topics: Mapping[str, int] | None = None, **kwargs: object) -> ClusterThread:
        data_dir = kwargs.pop("data_dir", None) or tmp_path / f"cluster-{len(started)}"
        thread = ClusterThread(ClusterOptions(data_dir=data_dir, **kwargs))  # type: ignore[arg-type]
        thread.start()
        started.append(thread)
        if topics:
            with AdminClient(thread.bootstrap) as admin:
                for name, partitions in topics.items():
                    admin.create_topic(name, partitions)
        return thread

    yield make
    for thread in reversed(started):
        thread.stop()


@pytest.fixture
def cluster(cluster_factory: Callable[..., ClusterThread]) -> ClusterThread:
    """The embedded shape: a coordinator and one broker sharing one port."""
    return cluster_factory()


@pytest.fixture
def cluster3(cluster_factory: Callable[..., ClusterThread]) -> ClusterThread:
    """A coordinator and three brokers, each on its own port."""
    return cluster_factory(brokers=3, shared_port=False)


@pytest.fixture
def tmpfs(tmp_path: pathlib.Path) -> Iterator[Callable[[str], pathlib.Path]]:
    """Mount small tmpfs file systems (`tmpfs("6m")`) for disk-full tests; unmounted after the
    test. Skips with the reason where this machine cannot mount one (not root, no permission)."""
    mounts: list[pathlib.Path] = []

    def mount(size: str) -> pathlib.Path:
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root: disk-full test skipped")
        path = tmp_path / f"tmpfs-{len(mounts)}"
        path.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip() or proc.returncode}): disk-full test skipped")
        mounts.append(path)
        return path

    yield mount
    for path in mounts:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill_filesystem(path: pathlib.Path, leave_bytes: int = 0) -> None:
    """Write the file `path` until its file system has at most `leave_bytes` free (0: ENOSPC)."""
    st = os.statvfs(path.parent)
    size = max(0, st.f_bavail * st.f_frsize - leave_bytes) if leave_bytes else None
    chunk = bytes(64 * 1024)
    # Unbuffered: a buffered file keeps the bytes a short write left over and raises ENOSPC
    # again when it is closed, outside the try below (it did, whenever the free space was not a
    # multiple of the chunk).
    with open(path, "wb", buffering=0) as f:
        try:
            while size is None or size > 0:
                written = f.write(chunk if size is None else chunk[: min(size, len(chunk))]) or 0
                if size is not None:
                    size -= written
        except OSError as e:
            assert e.errno == errno.ENOSPC, e


@pytest.fixture
def fill_disk() -> Callable[..., None]:
    """fill_filesystem, for tests in any folder."""
    return fill_filesystem


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """One real etcd for the session (tests/etcd_server.py); tests share it only through etcd_url's
    fresh key prefixes, so none sees another's keys."""
    with running_etcd(tmp_path_factory.mktemp("etcd")) as server:
        yield server


@pytest.fixture
def etcd_url(etcd_server: EtcdServer) -> str:
    """etcd://127.0.0.1:<port>/<a prefix no other test uses>."""
    return etcd_server.url(f"test-{uuid.uuid4().hex}")


# Under pytest-xdist, these folders' tests are handed out first: they hold the longest tests
# (process faults, the twenty-fault run, `dmq` subprocesses), which would otherwise start last and
# leave the other workers idle at the end.
_FIRST_UNDER_XDIST = ("tests/fault/", "tests/e2e/", "tests/cli/")

# The fault tests that run clusters of processes under timing bounds (a takeover within the lease
# TTL + 1 s, produce again within a broker session + 3 s): one worker runs them one after another,
# as the Spark tests. Two of them at once on 2 cores starved each other's coordinators: a full
# run had the twenty-fault test and the coordinator HA test side by side at load 10-16, and the
# HA test's coordinators lost their leases to ~1 s stalls of their own event loops.
_SERIAL_CLUSTER_FAULTS = frozenset({
    "tests/fault/test_coordinator_ha.py",
    "tests/fault/test_replication_faults.py",
    "tests/fault/test_restart_commit_storm.py",
    "tests/fault/test_coordinator_restart_groups.py",
    "tests/fault/test_coordinator_pause.py",
    "tests/fault/test_offsets_isr_restart.py",
})


# Every test in these folders starts processes (servers, the CLI, Spark's JVM, children it kills):
# `make check` leaves them out with `-m "not processes"`. Elsewhere a module that starts one says so
# itself with `pytestmark = pytest.mark.processes` (tests/unit/test_check_tier.py holds it to that).
_PROCESS_FOLDERS = ("tests/fault/", "tests/e2e/", "tests/spark/", "tests/cli/")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist with --dist loadgroup (`make test`): tests are handed to the workers one
    by one, longest folders first; the Spark tests form one group, so one worker runs them all
    with one SparkSession (~10 s and a JVM each), and the cluster fault tests another. A module
    fixture starts once in each worker that runs a test of its module; each worker has its own,
    so no state is shared between workers."""
    for item in items:
        if item.nodeid.startswith(_PROCESS_FOLDERS):
            item.add_marker(pytest.mark.processes)
    if getattr(config.option, "dist", "no") != "loadgroup":
        return

    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return next((i for i, first in enumerate(_FIRST_UNDER_XDIST) if path.startswith(first)), len(_FIRST_UNDER_XDIST))

    items.sort(key=rank)  # stable: file order within each rank
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        if item.nodeid.startswith("tests/spark/"):
            item.add_marker(pytest.mark.xdist_group("spark"))
        elif item.nodeid.split("::", 1)[0] in _SERIAL_CLUSTER_FAULTS:
            item.add_marker(pytest.mark.xdist_group("cluster-faults"))
