"""A streaming driver for the exactly-once test, run as its own process so the test can SIGKILL it.

    python exactly_once_driver.py BOOTSTRAP SOURCE TARGET CHECKPOINT MODE

copies topic SOURCE to topic TARGET (key and value) with the dmq sink, from the checkpoint at
CHECKPOINT. MODE `stream`: micro-batches of at most ROWS_PER_TRIGGER records until killed (small,
so a kill lands mid-batch after a few batches); `available-now`: Trigger.AvailableNow in batches
of at most ROWS_PER_TRIGGER_AVAILABLE_NOW (fewer, cheaper batches: what is in SOURCE when it
starts, then exit 0; a batch left unfinished by a kill is re-run first, with its planned offsets).
Prints "STARTED" once the query runs.
"""

from __future__ import annotations

import sys

from dmq.client.spark import local_session

ROWS_PER_TRIGGER = 4_000
ROWS_PER_TRIGGER_AVAILABLE_NOW = 25_000


def main(bootstrap: str, source: str, target: str, checkpoint: str, mode: str) -> None:
    spark = local_session(
        "dmq-exactly-once",
        conf={"spark.sql.shuffle.partitions": "2", "spark.sql.adaptive.enabled": "false",
              "spark.sql.streaming.noDataMicroBatches.enabled": "false"},
        log_level="ERROR",
    )
    try:
        df = (spark.readStream.format("dmq").option("bootstrap", bootstrap).option("subscribe", source)
              .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", ROWS_PER_TRIGGER_AVAILABLE_NOW if mode == "available-now" else ROWS_PER_TRIGGER)
              .load())
        writer = (df.select("key", "value").writeStream.format("dmq").option("bootstrap", bootstrap)
                  .option("topic", target).option("checkpointLocation", checkpoint))
        if mode == "available-now":
            writer = writer.trigger(availableNow=True)
        query = writer.start()
        print("STARTED", flush=True)
        query.awaitTermination()
    finally:
        spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
