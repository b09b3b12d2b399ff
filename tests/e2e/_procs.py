"""Child processes for the e2e tests: spawn, read their JSON-line events, wait on them."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

HERE = pathlib.Path(__file__).parent
Event = dict[str, Any]


class Proc:
    """A child Python script whose stdout is JSON lines; events are kept in arrival order."""

    def __init__(self, name: str, script: str, args: list[str]) -> None:
        self.name = name
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.popen = subprocess.Popen(
            [sys.executable, str(HERE / script), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.events: list[Event] = []
        self.stderr: list[str] = []
        self._cond = threading.Condition()
        self._readers = [
            threading.Thread(target=self._read_stdout, name=f"{name}-stdout", daemon=True),
            threading.Thread(target=self._read_stderr, name=f"{name}-stderr", daemon=True),
        ]
        for t in self._readers:
            t.start()

    def __repr__(self) -> str:
        return f"<Proc {self.name} pid={self.popen.pid} rc={self.popen.poll()} events={len(self.events)}>"

    def _read_stdout(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                event = {"ev": "junk", "line": line}
            event["_at"] = time.time()
            with self._cond:
                self.events.append(event)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def _read_stderr(self) -> None:
        assert self.popen.stderr is not None
        for line in self.popen.stderr:
            self.stderr.append(line)

    def wait_for(self, predicate: Callable[[Event], bool], timeout_s: float, what: str = "event") -> Event:
        deadline = time.monotonic() + timeout_s
        seen = 0
        with self._cond:
            while True:
                for event in self.events[seen:]:
                    if predicate(event):
                        return event
                seen = len(self.events)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self.popen.poll() is not None and seen == len(self.events)):
                    raise AssertionError(
                        f"{self.name}: no {what} within {timeout_s}s (rc={self.popen.poll()}); "
                        f"last events {self.events[-5:]}; stderr tail {''.join(self.stderr[-20:])}"
                    )
                self._cond.wait(min(remaining, 0.5))

    def send(self, command: str) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(command + "\n")
        self.popen.stdin.flush()

    def of(self, kind: str) -> list[Event]:
        with self._cond:
            return [e for e in self.events if e.get("ev") == kind]

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(10)
        self._release()

    def stop(self, timeout_s: float = 15.0) -> None:
        """Close politely, kill if it does not exit in time."""
        if self.popen.poll() is None:
            try:
                self.send("close")
                self.popen.wait(timeout_s)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()
        self._release()

    def _release(self) -> None:
        """Join the readers (the child is gone: they reach EOF), then close our ends of the pipes."""
        for t in self._readers:
            t.join(5)
        readers_done = not any(t.is_alive() for t in self._readers)
        for pipe in (self.popen.stdin, self.popen.stdout, self.popen.stderr):
            # a pipe a reader still iterates stays open: closing it under the reader would fail it
            if pipe is not None and (pipe is self.popen.stdin or readers_done):
                with contextlib.suppress(OSError):  # stdin's flush on close: the child is gone
                    pipe.close()


class ConsumerProc(Proc):
    def __init__(self, name: str, bootstrap: str, topic: str, group: str, *, commit: str = "auto",
                 config: dict[str, Any] | None = None) -> None:
        super().__init__(name, "consumer_proc.py", [
            "--bootstrap", bootstrap, "--topic", topic, "--group", group, "--commit", commit,
            "--config", json.dumps(config or {}),
        ])

    def consumed(self) -> list[tuple[int, int, str]]:
        return [(p, o, v) for e in self.of("records") for p, o, v in e["items"]]

    def owned(self) -> set[int]:
        """Partitions owned according to the listener events so far."""
        owned: set[int] = set()
        for e in self.events:
            if e.get("ev") == "assigned":
                owned |= set(e["partitions"])
            elif e.get("ev") in ("revoked", "lost"):
                owned -= set(e["partitions"])
        return owned


class ProducerProc(Proc):
    def __init__(self, bootstrap: str, topic: str, partitions: int, count: int, rate: float, start: int = 0) -> None:
        super().__init__("producer", "producer_proc.py", [
            "--bootstrap", bootstrap, "--topic", topic, "--partitions", str(partitions),
            "--count", str(count), "--rate", str(rate), "--start", str(start),
        ])
