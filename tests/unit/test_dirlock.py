"""The data-directory lock: exclusive, names its holder, released on release() and on SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from dmq.proto.server.dirlock import LOCK_FILE, DataDirLock, DataDirLocked

pytestmark = pytest.mark.processes  # left out of `make check`

HOLD = textwrap.dedent("""
    import sys, time
    from dmq.proto.server.dirlock import DataDirLock
    DataDirLock(sys.argv[1]).acquire()
    print("held", flush=True)
    time.sleep(60)
""")


def test_second_lock_in_this_process_is_refused_until_released(tmp_path):
    first = DataDirLock(tmp_path / "d")
    first.acquire()
    assert (tmp_path / "d" / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    with pytest.raises(DataDirLocked, match=r"is in use by this process \(pid \d+"):
        DataDirLock(tmp_path / "d").acquire()
    first.release()
    assert repr(first).endswith("held=False>")
    second = DataDirLock(tmp_path / "d")
    second.acquire()
    second.acquire()  # idempotent
    second.release()
    second.release()


def test_lock_held_by_another_process_names_it_and_dies_with_it(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(DataDirLocked) as refused:
            DataDirLock(tmp_path).acquire()
        message = str(refused.value)
        assert refused.value.holder_pid == holder.pid
        assert f"in use by pid {holder.pid} ({sys.executable} -c " in message and "\n" not in message
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        lock = DataDirLock(tmp_path)  # the kernel dropped the dead holder's lock: no stale file blocks
        lock.acquire()
        lock.release()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)
        holder.stdout.close()  # the pipe's file is ours to close (else a ResourceWarning)
