"""A real standalone Spark cluster for tests: one master and two workers, each its own process.

Started from the pyspark package's own launcher (bin/spark-class), on loopback, every port chosen
by the OS (port 0): the master's RPC and web UI ports are read from its log, and readiness is the
master's web UI JSON reporting both workers alive, within a deadline. Each process is started in
its own session (process group) and, at stop(), that group is killed by the PID we started, so a
JVM's children (executors, Python workers) go with it.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field

import pyspark

START_DEADLINE_S = 180  # JVM start on a loaded 2-core machine: a master alone took ~10 s

_MASTER_RE = re.compile(r"Starting Spark master at (spark://\S+)")
_UI_RE = re.compile(r"Successfully started service 'MasterUI' on port (\d+)")


@dataclass
class StandaloneCluster:
    root: pathlib.Path
    master_url: str = ""
    ui_url: str = ""
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def spark_home(self) -> str:
        return os.path.dirname(pyspark.__file__)

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "SPARK_HOME": self.spark_home,
            "SPARK_LOCAL_IP": "127.0.0.1",  # bind UIs and RPC to loopback, not the host's address
            # the master's REST submission server listens on a fixed port (6066): not needed here
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            "SPARK_LOG_DIR": str(self.root / "logs"),
        })
        return env

    def _launch(self, name: str, *args: str) -> pathlib.Path:
        log = self.root / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [os.path.join(self.spark_home, "bin", "spark-class"), *args],
                stdout=out, stderr=subprocess.STDOUT, env=self._env(), start_new_session=True,
            )
        self.processes.append(proc)
        return log

    def _wait_for(self, what: str, check: object, deadline: float) -> None:
        while time.monotonic() < deadline:
            for proc in self.processes:
                if proc.poll() is not None:
                    raise RuntimeError(f"a Spark process exited ({proc.args[1:]}, code {proc.returncode}) "
                                       f"while waiting for {what}; logs in {self.root}")
            if check():  # type: ignore[operator]
                return
            time.sleep(0.2)
        raise TimeoutError(f"no {what} within {START_DEADLINE_S} s; logs in {self.root}")

    def start(self, workers: int = 2) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + START_DEADLINE_S
        log = self._launch("master", "org.apache.spark.deploy.master.Master",
                           "--host", "127.0.0.1", "--port", "0", "--webui-port", "0")

        def master_ready() -> bool:
            text = log.read_text(errors="replace")
            url, ui = _MASTER_RE.search(text), _UI_RE.search(text)
            if url and ui:
                self.master_url, self.ui_url = url.group(1), f"http://127.0.0.1:{ui.group(1)}"
                return True
            return False

        self._wait_for("master", master_ready, deadline)
        for i in range(workers):
            self._launch(f"worker{i}", "org.apache.spark.deploy.worker.Worker",
                         "--host", "127.0.0.1", "--port", "0", "--webui-port", "0", "--cores", "1",
                         "--memory", "1g", "--work-dir", str(self.root / f"work{i}"), self.master_url)
        self._wait_for(f"{workers} alive workers", lambda: self.state().get("aliveworkers") == workers, deadline)

    def state(self) -> dict[str, object]:
        try:
            with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=5) as answer:
                data: dict[str, object] = json.load(answer)
                return data
        except OSError:
            return {}

    def stop(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # the group we made for it: the JVM and its children
            proc.wait(timeout=30)
        self.processes.clear()
