"""`dmq consume` stops on SIGINT / SIGTERM at any moment, within a bound.

Seen in CI: a `dmq consume --group` sent SIGINT never exited. The signal raised KeyboardInterrupt
where it landed; landing in threading.Condition.__exit__ (Python code) before the release, it left
the lock of the consumer's wake-up Event (or of a fetch Future) held for good. The fetch thread
setting that Event then blocked, and the interpreter's exit, which joins that thread, never ended
(py-spy: MainThread in _python_exit -> Thread.join; the fetch thread in Event.set ->
Condition.__enter__). The first test puts the signal at exactly that instruction.
"""

from __future__ import annotations

import signal
import subprocess
import sys

from tests.cli.conftest import WAIT_S, Dmq, wait_for

# Runs the real CLI; once it has printed ARM_AFTER records, it raises SIGINT in the main thread
# while that thread is inside threading.Condition.__exit__ of the consumer's wake-up Event
# (Event.clear() in DMQConsumer.poll), with the Condition's lock still held.
SIGINT_IN_CONDITION_EXIT = r"""
import signal, sys, threading

ARM_AFTER = int(sys.argv.pop(1))
EXIT_CODE = threading.Condition.__exit__.__code__
state = {"printed": 0, "fired": False}


def at_first_line(frame, event, arg):
    if event == "line" and not state["fired"]:
        state["fired"] = True
        sys.settrace(None)
        sys.stderr.write("hook: SIGINT inside Condition.__exit__ of Event.clear in poll\n")
        signal.raise_signal(signal.SIGINT)  # a real signal: the process's own handler decides
    return None


def on_call(frame, event, arg):
    code = frame.f_code
    if code.co_name == "emit" and code.co_filename.endswith("messages.py"):
        state["printed"] += len(frame.f_locals.get("records") or ())
    elif (code is EXIT_CODE and not state["fired"] and state["printed"] >= ARM_AFTER
          and frame.f_back is not None and frame.f_back.f_code.co_name == "clear"
          and frame.f_back.f_back is not None and frame.f_back.f_back.f_code.co_name == "poll"):
        return at_first_line
    return None


sys.settrace(on_call)
from dmq.client.cli import main

sys.argv = ["dmq", *sys.argv[1:]]
main()
"""


def _stop(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """Wait for the process; one that did not end is killed (its pipes closed) and fails the test."""
    try:
        return proc.communicate(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"the consumer did not exit within {WAIT_S}s of SIGINT; stderr: {err[-2000:]}") from None


def _committed_all(dmq: Dmq, group: str) -> bool:
    described = dmq("groups", "describe", group, "-o", "json")  # not found until the consumer joins
    return described.returncode == 0 and described.json()["total_lag"] == 0


def _produce(dmq: Dmq, topic: str) -> None:
    dmq.ok("topics", "create", topic, "-p", "2")
    dmq.ok("produce", topic, "--key-separator", ":", input="".join(f"k{i}:v{i}\n" for i in range(4)))


def test_sigint_inside_a_condition_exit_still_stops_the_group_consumer(dmq: Dmq) -> None:
    _produce(dmq, "sig-cond")
    consumer = subprocess.Popen(
        [sys.executable, "-c", SIGINT_IN_CONDITION_EXIT, "4", "--bootstrap", dmq.bootstrap,
         "consume", "sig-cond", "--group", "hook", "--from-beginning"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = _stop(consumer)  # the hook sends the signal itself
    assert "hook: SIGINT inside Condition.__exit__" in err, err
    assert consumer.returncode == 0, err
    assert sorted(out.split()) == ["v0", "v1", "v2", "v3"]
    group = "G_sig-cond_hook"
    wait_for(lambda: dmq.json("groups", "describe", group)["members"] == [], "the member to leave")
    assert dmq.json("groups", "describe", group)["total_lag"] == 0  # it committed what it printed


def test_sigint_stops_a_consumer_started_with_sigint_ignored(dmq: Dmq, dmq_exe: str) -> None:
    """A shell starts a background job (`dmq consume ... &`) with SIGINT ignored; `kill -INT` must
    still stop it, as it stops `dmq produce` and the servers."""
    _produce(dmq, "sig-ign")
    consumer = subprocess.Popen(
        [dmq_exe, "--bootstrap", dmq.bootstrap, "consume", "sig-ign", "--group", "bg", "--from-beginning"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        wait_for(lambda: _committed_all(dmq, "G_sig-ign_bg"), "the consumer to commit")
    finally:
        consumer.send_signal(signal.SIGINT)
        out, err = _stop(consumer)
    assert consumer.returncode == 0, err
    assert sorted(out.split()) == ["v0", "v1", "v2", "v3"]


# The stop watchdog alone, in a process whose main thread never looks at the stop request.
WATCHDOG = r"""
import os, signal, sys, time
from dmq.client.cli import messages

messages.CONSUME_STOP_DEADLINE_S = float(sys.argv[1])
stop = messages._StopSignals()
stop.install()
for _ in range(int(sys.argv[2])):
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)
print("requested" if stop.requested else "not requested", flush=True)
time.sleep(60)  # stuck: only the watchdog ends the process
"""


def test_a_stuck_consume_is_ended_by_the_watchdog_or_a_second_signal() -> None:
    stuck = subprocess.run([sys.executable, "-c", WATCHDOG, "0.5", "1"], capture_output=True, text=True,
                           timeout=WAIT_S)
    assert stuck.returncode == 1 and stuck.stdout == "requested\n"
    assert "did not stop within 0.5s of the signal" in stuck.stderr
    twice = subprocess.run([sys.executable, "-c", WATCHDOG, "60", "2"], capture_output=True, text=True,
                           timeout=WAIT_S)
    assert twice.returncode == 130, twice
    assert "second signal; exiting without the final commit" in twice.stderr
