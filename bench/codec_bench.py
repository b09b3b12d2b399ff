"""Record-batch codec throughput: encode, decode + iterate, per codec, against per-record struct loops.

    .venv/bin/python bench/codec_bench.py [--records 10000] [--value-bytes 100] [--seconds 1.0]

Prints records/s and MB/s (of value bytes) per operation, and the ratio to a bare per-record
``struct.pack`` encode loop / ``struct.unpack_from`` decode loop over the same fields (timestamp,
key, value; decode builds the same Record tuples) measured in the same run, since this machine is
noisy: compare ratios from one run, not figures from different days.
"""

from __future__ import annotations

import argparse
import os
import struct
import time
from typing import Callable

from dmq.proto import records
from dmq.proto.records import Codec, Record


def best_rate(fn: Callable[[], object], n_records: int, seconds: float) -> float:
    """Records/s of the fastest of repeated runs of fn within about `seconds`."""
    fn()  # warm up
    best = float("inf")
    deadline = time.perf_counter() + seconds
    runs = 0
    while runs < 3 or time.perf_counter() < deadline:
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        runs += 1
    return n_records / best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=10_000, help="records per batch")
    p.add_argument("--value-bytes", type=int, default=100)
    p.add_argument("--seconds", type=float, default=1.0, help="time spent per measurement")
    args = p.parse_args()
    n, size = args.records, args.value_bytes

    # half random, half repeated: compresses like typical JSON-ish payloads rather than all-zeros
    values = [os.urandom(size // 2) + b"x" * (size - size // 2) for _ in range(n)]
    keys = [b"key-%d" % (i % 100) for i in range(n)]
    ts = 1_700_000_000_000
    value_mb = n * size / 1e6

    # Reference: the per-record layout a plain Python codec would use, carrying the same fields
    # (timestamp, key, value) and, on decode, building the same Record tuples.
    rec = struct.Struct("<qii")

    def struct_encode() -> bytes:
        out = []
        pack = rec.pack
        for i, (k, v) in enumerate(zip(keys, values)):
            out.append(pack(ts + i, len(k), len(v)))
            out.append(k)
            out.append(v)
        return b"".join(out)

    naive = struct_encode()

    def struct_decode() -> int:
        pos = 0
        unpack = rec.unpack_from
        size_ = rec.size
        buf = naive
        offset = 0
        for _ in range(n):
            t, klen, vlen = unpack(buf, pos)
            pos += size_
            key = buf[pos : pos + klen]
            pos += klen
            Record(offset, t, key, buf[pos : pos + vlen], ())
            pos += vlen
            offset += 1
        return offset

    enc_ref = best_rate(struct_encode, n, args.seconds)
    dec_ref = best_rate(struct_decode, n, args.seconds)
    print(f"{n} records/batch, {size}-byte values, best of runs over {args.seconds:.1f} s each")
    print(f"{'reference: struct.pack loop, with keys':42s} {enc_ref:>12,.0f} rec/s {enc_ref * size / 1e6:8.1f} MB/s")
    print(f"{'reference: unpack_from loop -> Record':42s} {dec_ref:>12,.0f} rec/s {dec_ref * size / 1e6:8.1f} MB/s")

    for codec in Codec:
        for with_keys in (False, True):
            kw = {"keys": keys} if with_keys else {}
            batch = records.encode(values, timestamp_ms=ts, codec=codec, **kw)
            label = f"{codec.name.lower()}{' +keys' if with_keys else ''}"
            enc = best_rate(lambda c=codec, k=kw: records.encode(values, timestamp_ms=ts, codec=c, **k), n, args.seconds)
            dec = best_rate(lambda b=batch: records.decode(b), n, args.seconds)
            it = best_rate(lambda b=batch: sum(1 for _ in records.decode(b)), n, args.seconds)
            print(
                f"{'encode ' + label:42s} {enc:>12,.0f} rec/s {enc * size / 1e6:8.1f} MB/s"
                f"  x{enc / enc_ref:.2f} vs struct.pack   batch {len(batch) / 1e6:.2f} MB"
            )
            print(f"{'decode (lazy, no records) ' + label:42s} {dec:>12,.0f} rec/s {dec * size / 1e6:8.1f} MB/s")
            print(
                f"{'decode + iterate ' + label:42s} {it:>12,.0f} rec/s {it * size / 1e6:8.1f} MB/s"
                f"  x{it / dec_ref:.2f} vs struct.unpack_from"
            )
    print(f"(value payload per batch {value_mb:.2f} MB; MB/s counts value bytes only)")


if __name__ == "__main__":
    main()
