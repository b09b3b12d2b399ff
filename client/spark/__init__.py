"""PySpark source and sink for DMQ topics: `spark.read.format("dmq")`, `readStream`, `write`.

    from dmq.client.spark import local_session
    spark = local_session("my-job")          # or: register(existing_spark_session)
    df = (spark.read.format("dmq")
          .option("bootstrap", "localhost:9092")
          .option("subscribe", "orders")
          .load())                             # key, value, topic, partition, offset, timestamp, timestampType

Python workers. Spark runs the source's read() and the sink's write() in separate Python worker
processes; they run the interpreter named by PYSPARK_PYTHON (or the `spark.pyspark.python`
setting). `register(spark)` ships this process's `dmq` packages to them and checks, with one tiny
job, that they can import the rest (grpcio, protobuf, pyarrow...), failing at once with the fix
when they cannot. `local_session()` runs the workers with the current interpreter. On a cluster,
install `dmq-queue[spark]` into one environment present on every node and set
`spark.pyspark.python` (and `spark.pyspark.driver.python`) to its `python`, e.g.
`spark-submit --conf spark.pyspark.python=/opt/dmq/venv/bin/python ...`.
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
import threading
import zipfile
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dmq.client.errors import DMQError
from dmq.client.spark.options import OptionError

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

__all__ = ["register", "local_session", "python_worker_conf", "OptionError", "DMQDataSource", "WorkerSetupError"]


def __getattr__(name: str) -> Any:
    # Importing the source pulls in pyspark; keep `import dmq.client.spark` itself light.
    if name == "DMQDataSource":
        from dmq.client.spark.source import DMQDataSource

        return DMQDataSource
    raise AttributeError(name)


class WorkerSetupError(DMQError):
    """Spark's Python workers cannot run the DMQ source; the message says what to change."""


# What the source's readers and writers import in the workers.
WORKER_MODULES = ("dmq.client.spark.reader", "dmq.client.spark.sink", "pyarrow", "grpc")
# The packages shipped to the workers (the `dmq` namespace's folders).
_SHIPPED = ("proto", "client", "broker", "coordinator")
_zip_path: str | None = None
_zip_lock = threading.Lock()

# Run in a Spark Python worker: which of the modules it cannot import. Compiled into its own
# namespace (not a module of dmq) so cloudpickle ships it by value: a function of dmq pickled by
# reference would itself need `dmq` in the worker, the very thing it checks.
_PROBE_SOURCE = """
def probe(_rows):
    import importlib, sys
    missing = []
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception as e:
            missing.append((name, f"{type(e).__name__}: {e}"))
    yield (sys.executable, "%d.%d" % sys.version_info[:2], missing)
"""


def register(spark: SparkSession, *, check: bool = True) -> None:
    """Make `format("dmq")` available in this session (repeat calls are harmless).

    Spark's Python workers must import `dmq`: unless they run this very interpreter on this
    machine, register() ships this process's `dmq` packages to them (a zip given to
    SparkContext.addPyFile, put on the workers' sys.path). Its third-party
    dependencies (grpcio, protobuf, pyarrow, ...) cannot be shipped that way, so with ``check``
    (the default) register() runs one tiny Spark job that imports what the source needs in a
    worker and raises WorkerSetupError at once, naming the missing module and the fix, instead
    of every later query failing in the workers.
    """
    from dmq.client.spark.source import DMQDataSource

    sc = spark.sparkContext
    # Workers that are this interpreter on this machine (local_session()) import `dmq` as this
    # process does, from compiled files; a zip would only make each worker compile it again.
    if not _workers_are_this_interpreter(sc):
        path = _dmq_zip()
        if os.path.basename(path) not in set(getattr(sc, "_python_includes", None) or ()):
            sc.addPyFile(path)
        if check:
            _check_workers(sc)
    spark.dataSource.register(DMQDataSource)


def _dmq_zip() -> str:
    """A zip of the `dmq` packages this process imports (built once per process)."""
    global _zip_path
    with _zip_lock:
        if _zip_path is not None and os.path.exists(_zip_path):
            return _zip_path
        target = os.path.join(tempfile.mkdtemp(prefix="dmq-spark-"), f"dmq-{os.getpid()}.zip")
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
            # zipimport (before Python 3.13) finds no namespace packages: the zip's dmq is a
            # regular package, holding every folder of the namespace.
            z.writestr("dmq/__init__.py", "")
            for name in _SHIPPED:
                package = importlib.import_module(f"dmq.{name}")
                for root in package.__path__:
                    for folder, dirs, files in os.walk(root):
                        dirs[:] = [d for d in dirs if d != "__pycache__"]
                        for f in files:
                            if f.endswith((".py", ".pyi")) or f == "py.typed":
                                full = os.path.join(folder, f)
                                z.write(full, os.path.join("dmq", name, os.path.relpath(full, root)))
        _zip_path = target
        return target


def _workers_are_this_interpreter(sc: Any) -> bool:
    """A local session whose workers run this very interpreter (local_session()'s) imports what
    this process imports: no probe job needed. Paths are compared unresolved: a virtualenv's
    python is a symlink to a base interpreter that lacks the virtualenv's packages."""
    python: str | None = getattr(sc, "pythonExec", None)
    if not python:
        return False
    return str(sc.master).startswith("local") and os.path.abspath(python) == os.path.abspath(sys.executable)


def _check_workers(sc: Any) -> None:
    namespace: dict[str, Any] = {"__name__": "dmq_spark_worker_probe", "MODULES": WORKER_MODULES}
    exec(compile(_PROBE_SOURCE, "<dmq worker probe>", "exec"), namespace)  # noqa: S102 - constant source
    try:
        python, version, missing = sc.parallelize([0], 1).mapPartitions(namespace["probe"]).collect()[0]
    except Exception as e:  # noqa: BLE001 - the worker could not even start
        raise WorkerSetupError(
            f"Spark's Python workers ({sc.pythonExec!r}) could not run: {str(e).strip().splitlines()[-1:]}. "
            f"{_FIX}"
        ) from e
    if missing:
        listed = "; ".join(f"{name} ({error})" for name, error in missing)
        raise WorkerSetupError(
            f"Spark's Python workers run {python} (Python {version}), which cannot import what the DMQ source "
            f"needs: {listed}. {_FIX}"
        )


_FIX = (
    "Run the workers with an interpreter that has the dmq-queue[spark] dependencies: for a local session "
    "set spark.pyspark.python (or PYSPARK_PYTHON before the session starts) to this interpreter, "
    "e.g. SparkSession.builder.config(map=dmq.client.spark.python_worker_conf()), or use "
    "dmq.client.spark.local_session(); on a cluster install dmq-queue[spark] into one environment on every "
    "node and point spark.pyspark.python at its python."
)


def python_worker_conf(python: str | None = None) -> dict[str, str]:
    """Spark settings that run Python workers with `python` (default: this interpreter)."""
    python = python or sys.executable
    return {"spark.pyspark.python": python, "spark.pyspark.driver.python": python}


def local_session(
    app_name: str = "dmq",
    *,
    master: str = "local[2]",
    conf: Mapping[str, str] | None = None,
    log_level: str = "WARN",
) -> SparkSession:
    """A local SparkSession whose Python workers run this interpreter, with `dmq` registered.

    Small-job defaults: no web UI, 2 shuffle partitions. `conf` overrides them.
    """
    # The environment variables must be set before the JVM starts: it reads them at launch.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    if master.startswith("local"):
        # A local session talks to itself on loopback only: without this Spark resolves the
        # host name and may bind its driver and block manager to an external interface.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    local_network = (
        {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
        if master.startswith("local")
        else {}
    )
    settings = {
        **local_network,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        **python_worker_conf(),
    }
    settings.update(conf or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    register(spark)
    return spark
