"""register(spark) on a plain session: the workers find `dmq`, or register() fails at once.

Each case runs a child process that builds a plain SparkSession (not local_session(): no
PYSPARK_PYTHON of ours) whose Python workers are an interpreter of the test's choosing, calls
register(spark), then reads a topic of this test's server:

- workers with the dependencies (grpcio, pyarrow, ...) but without `dmq`, as on a cluster whose
  nodes have the Spark stack but not DMQ: register() ships `dmq`, the read returns every row
  (before: the read failed in the workers with "No module named 'dmq'");
- workers with a bare interpreter: register() itself fails, naming the missing module and the
  setting to change (before: it returned, and every query failed later in the workers).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from dmq.client import AdminClient, Producer
from dmq.client.cli.runner import ClusterThread

pytestmark = pytest.mark.spark

# One child process for both cases (a JVM start is the slow part): a session per case, each
# with its own worker interpreter (PySpark reads PYSPARK_PYTHON when a context starts).
CHILD = textwrap.dedent(
    """
    import os, sys
    from pyspark.sql import SparkSession
    from dmq.client.spark import register

    bootstrap, topic = sys.argv[1], sys.argv[2]
    for case, worker in zip(("deps", "bare"), sys.argv[3:]):
        os.environ["PYSPARK_PYTHON"] = worker
        spark = (SparkSession.builder.master("local[1]").appName("plain-" + case)
                 .config("spark.ui.enabled", "false")
                 .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        try:
            register(spark)
            df = spark.read.format("dmq").option("bootstrap", bootstrap).option("subscribe", topic).load()
            print(case, "COUNT", df.count(), flush=True)
        except Exception as e:
            print(case, "FAILED", type(e).__name__, " ".join(str(e).split())[-3000:], flush=True)
        spark.stop()
    """
)


def _need_spark() -> None:
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    if shutil.which("java") is None:
        pytest.skip("no java on PATH (Spark needs Java 17)")


def _base_python() -> str:
    base = getattr(sys, "_base_executable", None) or sys.executable
    if sys.prefix == sys.base_prefix:
        pytest.skip("needs a virtualenv: its base interpreter is a Python without the dependencies")
    return base


def _worker(tmp_path: pathlib.Path, name: str, pythonpath: list[str]) -> str:
    """A worker interpreter: the base Python, with only `pythonpath` added (no .pth files run,
    so the editable `dmq` of this virtualenv is not importable)."""
    script = tmp_path / name
    path = os.pathsep.join(pythonpath)
    script.write_text(
        "#!/bin/sh\n"
        + (f'export PYTHONPATH="{path}${{PYTHONPATH:+:$PYTHONPATH}}"\n' if path else "")
        + f'exec "{_base_python()}" "$@"\n'
    )
    script.chmod(0o755)
    return str(script)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory, cluster_factory_module: ClusterThread) -> dict[str, str]:
    """case -> the child's line for it ("COUNT n" or "FAILED <error>")."""
    _need_spark()
    tmp_path = tmp_path_factory.mktemp("register")
    bootstrap = cluster_factory_module.bootstrap
    with AdminClient(bootstrap) as admin:
        admin.create_topic("plain", 2)
    with Producer(bootstrap, linger_ms=0) as p:
        for i in range(5):
            p.send("plain", b"v%d" % i).get(10)
    site_packages = [p for p in sys.path if p.endswith("site-packages")]
    with_deps = _worker(tmp_path, "python-with-deps", site_packages)
    bare = _worker(tmp_path, "bare-python", [])
    premise = subprocess.run(
        [with_deps, "-c", "import grpc, pyarrow\ntry:\n import dmq.client\nexcept ImportError:\n print('no dmq')"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False,
    )
    assert premise.stdout.strip() == "no dmq", premise.stderr  # the deps are there, dmq is not
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_"))}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    done = subprocess.run(
        [sys.executable, "-c", CHILD, bootstrap, "plain", with_deps, bare], capture_output=True, text=True,
        timeout=300, env=env, cwd=tmp_path, check=False,
    )
    out = {}
    for line in done.stdout.splitlines():
        case, _, rest = line.partition(" ")
        if case in ("deps", "bare"):
            out[case] = rest
    assert set(out) == {"deps", "bare"}, done.stdout[-3000:] + done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def cluster_factory_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterThread]:
    from dmq.client.cli.runner import ClusterOptions

    thread = ClusterThread(ClusterOptions(data_dir=tmp_path_factory.mktemp("cluster")))
    thread.start()
    yield thread
    thread.stop()


def test_workers_without_dmq_get_it_from_register(outcomes: dict[str, str]) -> None:
    assert outcomes["deps"] == "COUNT 5"


def test_workers_without_the_dependencies_fail_register_at_once(outcomes: dict[str, str]) -> None:
    line = outcomes["bare"]
    assert line.startswith("FAILED WorkerSetupError"), line
    assert "No module named" in line
    assert "spark.pyspark.python" in line and "python_worker_conf()" in line
