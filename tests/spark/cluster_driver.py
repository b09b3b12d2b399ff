"""A Spark driver for the standalone-cluster tests, run as its own process (a process holds one
SparkContext; the test process already holds its local one).

    python cluster_driver.py SPARK_URL BOOTSTRAP TOPIC SOURCE TARGET

reads TOPIC, then copies SOURCE to TARGET with the sink, in one application (a JVM start costs
tens of seconds on a loaded machine), and prints a JSON summary: what was read (per partition:
rows, first and last offset; rows in all, distinct values, the sum of the values' CRC32) and
where Spark ran the tasks after each step (its REST API's executor list).
"""

from __future__ import annotations

import json
import sys
import urllib.request

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from dmq.client.spark import python_worker_conf, register


def tasks_by_executor(spark: SparkSession) -> dict[str, int]:
    sc = spark.sparkContext
    with urllib.request.urlopen(f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}/allexecutors", timeout=30) as r:
        return {e["id"]: int(e["totalTasks"]) for e in json.load(r)}


def main(master: str, bootstrap: str, topic: str, source: str, target: str) -> None:
    builder = SparkSession.builder.master(master).appName("dmq-cluster-test")
    for key, value in {
        **python_worker_conf(),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.port": "0",
        "spark.executor.memory": "512m",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.adaptive.enabled": "false",
    }.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        register(spark)
        df = spark.read.format("dmq").option("bootstrap", bootstrap).option("subscribe", topic).load()
        # one pass over the data: values carry their partition, so distinct values add up
        stats = df.groupBy("partition").agg(
            F.count("*").alias("rows"), F.min("offset").alias("first"), F.max("offset").alias("last"),
            F.countDistinct("value").alias("distinct_values"), F.sum(F.crc32("value")).alias("crc_sum"),
        ).collect()
        summary = {
            "partitions": {str(r["partition"]): [r["rows"], r["first"], r["last"]] for r in stats},
            "rows": sum(r["rows"] for r in stats),
            "distinct_values": sum(r["distinct_values"] for r in stats),
            "crc_sum": sum(int(r["crc_sum"]) for r in stats),
        }
        summary["tasks_after_read"] = tasks_by_executor(spark)
        copy = spark.read.format("dmq").option("bootstrap", bootstrap).option("subscribe", source).load()
        copy.select("key", "value").write.format("dmq").mode("append").option("bootstrap", bootstrap) \
            .option("topic", target).save()
        summary["tasks_after_copy"] = tasks_by_executor(spark)
        print("SUMMARY " + json.dumps(summary), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
