"""PySpark source and sink for DMQ topics: `spark.read.format("dmq")`, `readStream`, `write`.

    from dmq.client.spark import local_session
    spark = local_session("my-job")          # or: register(existing_spark_session)
    df = (spark.read.format("dmq")
          .option("bootstrap", "localhost:9092")
          .option("subscribe", "orders")
          .load())                             # key, value, topic, partition, offset, timestamp, timestampType

Python workers. Spark runs the source's read() and the sink's write() in separate Python worker
processes, which must import `dmq` and have pyarrow; they run the interpreter named by
PYSPARK_PYTHON (or the `spark.pyspark.python` setting). `local_session()` points both at the
current interpreter. On a cluster, install dmq (`pip install dmq[spark]`) in one environment
present on every node and set `spark.pyspark.python` (and `spark.pyspark.driver.python`) to its
`python`, e.g. `spark-submit --conf spark.pyspark.python=/opt/dmq/venv/bin/python ...`; the data
source must also be registered in each session with `register(spark)`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dmq.client.spark.options import OptionError

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

__all__ = ["register", "local_session", "python_worker_conf", "OptionError", "DMQDataSource"]


def __getattr__(name: str) -> Any:
    # Importing the source pulls in pyspark; keep `import dmq.client.spark` itself light.
    if name == "DMQDataSource":
        from dmq.client.spark.source import DMQDataSource

        return DMQDataSource
    raise AttributeError(name)


def register(spark: SparkSession) -> None:
    """Make `format("dmq")` available in this session (once per session; repeat calls are harmless)."""
    from dmq.client.spark.source import DMQDataSource

    spark.dataSource.register(DMQDataSource)


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
