"""The console's own guards, through the real `dmq console` process over a real `dmq server`:

  - at most PAGES_PENDING_MAX pages in flight: with the cluster stopped (SIGSTOP), pages hold their
    slots until the cluster answers, and the next request is answered 503 at once, not queued;
    once the cluster answers again (SIGCONT) the held pages finish and the console serves again;
  - a --host that is not loopback logs a warning that the console has no login of its own; the
    default (loopback) does not.
"""

from __future__ import annotations

import concurrent.futures
import pathlib
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from dmq.client.cli.console._app import PAGES_PENDING_MAX
from tests.cli._console import ConsoleProcess
from tests.cli.conftest import ServerProcess

# Long enough that no held page gives up (and frees its slot) while the test fills the slots,
# whatever the machine's load; the pages end as soon as the server runs again.
CLUSTER_TIMEOUT_S = 120
PROBE_TIMEOUT_S = 2.0
WAIT_S = 60.0
NO_LOGIN_WARNING = "the console has no login of its own"


@pytest.fixture
def own_server(tmp_path: pathlib.Path) -> Iterator[ServerProcess]:
    """A server of this test's own: it is stopped with SIGSTOP."""
    srv = ServerProcess(tmp_path / "data", tmp_path / "server.log")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.proc.send_signal(signal.SIGCONT)  # stop() needs it running to end cleanly
        srv.stop()


def _get(url: str, timeout_s: float) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode()


def test_pages_past_the_pending_limit_are_answered_busy_at_once(own_server: ServerProcess) -> None:
    console = ConsoleProcess(own_server.bootstrap, argv=[
        "--bootstrap", own_server.bootstrap, "--timeout", str(CLUSTER_TIMEOUT_S), "console", "--port", "0",
        "--log-level", "warning"])
    topics = console.url + "topics"
    pool = concurrent.futures.ThreadPoolExecutor(PAGES_PENDING_MAX)
    try:
        assert _get(topics, WAIT_S)[0] == 200
        own_server.proc.send_signal(signal.SIGSTOP)
        try:
            held = [pool.submit(_get, topics, CLUSTER_TIMEOUT_S + WAIT_S) for _ in range(PAGES_PENDING_MAX)]
            # Probe until the console says it is busy. A probe that gets no answer in time was
            # taken as a page (the held ones were not all in yet) and holds a slot too: counted.
            probes_held = 0
            deadline = time.monotonic() + WAIT_S
            while True:
                assert time.monotonic() < deadline, f"no 503 in {WAIT_S}s; {probes_held} probes held"
                try:
                    status, body = _get(topics, PROBE_TIMEOUT_S)
                except (TimeoutError, urllib.error.URLError):
                    probes_held += 1
                    continue
                break
            # Answered within PROBE_TIMEOUT_S while the cluster cannot answer: refused at once.
            assert status == 503, (status, body)
            assert f"{PAGES_PENDING_MAX} pages are being served" in body
            # The held pages still wait on the stopped cluster, but for those refused as a probe
            # held their slot (counted below).
            early = [f.result()[0] for f in held if f.done()]
            assert set(early) <= {503}, early
        finally:
            own_server.proc.send_signal(signal.SIGCONT)
            pool.shutdown(wait=True)
        statuses = [f.result()[0] for f in held]
        # Every held request was served once the cluster answered, but for those whose slots
        # probes took before they came in.
        assert statuses.count(503) <= probes_held, (statuses, probes_held)
        assert set(statuses) <= {200, 503}, statuses
        assert _get(topics, WAIT_S)[0] == 200  # the slots were given back
    finally:
        assert console.stop() == 0, console.stderr


@pytest.mark.parametrize(("host", "warned"), [("0.0.0.0", True), ("127.0.0.1", False)])
def test_a_host_beyond_loopback_is_warned_about(server: ServerProcess, host: str, warned: bool) -> None:
    console = ConsoleProcess(server.bootstrap, "--host", host)
    try:
        assert _get(console.url + "topics", WAIT_S)[0] == 200
    finally:
        assert console.stop() == 0, console.stderr
    assert (NO_LOGIN_WARNING in console.stderr) is warned, console.stderr
    if warned:
        assert host in console.stderr  # the warning names the address
