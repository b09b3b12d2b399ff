"""Child process of test_log_crash.py: opens (recovering) a partition log and appends with
append_durable (acks=all) from several concurrent idempotent producers until it is SIGKILLed.

Usage: python log_crash_child.py <log_dir> <seed> <run>

stdout, one flushed line per event:
    OPEN <log_end_offset>
    ACK <base_offset> <last_offset> <crc> <producer_id> <base_sequence> <record_count>
An ACK line is printed only after append_durable returned, i.e. after the batch was fsynced.
"""

from __future__ import annotations

import asyncio
import random
import sys

from dmq.broker.log import LogConfig, PartitionLog
from dmq.proto import records

CONFIG = LogConfig(segment_bytes=256 * 1024, index_interval_bytes=1024)
APPENDERS = 4


async def main(directory: str, seed: int, run: int) -> None:
    rng = random.Random(seed)
    plog = PartitionLog(directory, "crash", 0, CONFIG)
    print(f"OPEN {plog.log_end_offset}", flush=True)

    async def appender(k: int) -> None:
        producer_id = run * 100 + k
        seq = 0
        while True:
            count = rng.randrange(1, 40)
            size = rng.randrange(1, 3000)
            raw = records.encode(
                [rng.randbytes(size) for _ in range(count)],
                producer_id=producer_id,
                producer_epoch=0,
                base_sequence=seq,
            )
            info = await plog.append_durable(raw)
            crc = records.read_header(raw).crc
            print(f"ACK {info.base_offset} {info.last_offset} {crc} {producer_id} {seq} {count}", flush=True)
            seq += count

    await asyncio.gather(*(appender(k) for k in range(APPENDERS)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
