"""keep_large_buffers(): multi-megabyte buffers are reused from the heap, not page-faulted anew."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dmq.client._malloc_tuning import keep_large_buffers

pytestmark = pytest.mark.processes  # left out of `make check`

# A child process has two threads allocate and free 1-15 MiB buffers of varying sizes, every page
# written (as the copies of a Fetch answer are), and reports its minor page faults.
CHILD = """
import resource, sys, threading
from dmq.client._malloc_tuning import keep_large_buffers
if sys.argv[1] == "tuned":
    assert keep_large_buffers()
blob = b"x" * (16 << 20)
def work():
    for i in range(40):
        a = bytearray(blob[: (1 + i % 4) << 20])
        b = bytearray(blob[: (8 + i % 8) << 20])
        del a, b
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
threads = [threading.Thread(target=work) for _ in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join(60)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, timeout=60, check=True)
    return int(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_large_buffers_stop_page_faulting_once_tuned():
    default, tuned = faults("default"), faults("tuned")
    # untuned: buffers above glibc's threshold are fresh mmap()s, every page faulted in (~240,000
    # faults here); tuned: freed heap memory is reused (~19,000)
    assert default > 50_000, default
    assert tuned < default / 4, (tuned, default)


def test_idempotent():
    first = keep_large_buffers()
    assert keep_large_buffers() is first


# The allocator is process-wide: a broker hosted in someone else's process (a test's LocalCluster,
# an application's) leaves it alone; the `dmq server` runner, a process owner, sets it.
OWNER_CHILD = """
import asyncio, json, os, pathlib, signal, sys
from dmq.client import _malloc_tuning as malloc_tuning
from dmq.client.cli.runner import ClusterOptions, ClusterThread, run_embedded

data = pathlib.Path(sys.argv[1])
with ClusterThread(ClusterOptions(data_dir=data / "library")):
    hosted = malloc_tuning._applied
seen = {}

def ready(cluster):
    seen["runner"] = malloc_tuning._applied
    os.kill(os.getpid(), signal.SIGTERM)  # the runner stops cleanly on its signal

asyncio.run(run_embedded(ClusterOptions(data_dir=data / "owner"), ready))
print(json.dumps({"hosted": hosted, "runner": seen["runner"]}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_only_the_server_runner_tunes_the_allocator(tmp_path):
    import json

    out = subprocess.run(
        [sys.executable, "-c", OWNER_CHILD, str(tmp_path)], capture_output=True, text=True, timeout=60, check=True
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"hosted": None, "runner": True}, out.stderr[-2000:]
