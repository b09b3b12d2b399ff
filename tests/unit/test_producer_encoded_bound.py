"""The bound the producer's batch caps rest on (dmq.client._accumulator.encoded_size_bound),
checked against the real codec, worst cases included: incompressible values, and tiny values
where the bitmap and offsets arrays dominate. Seeded; the seed is in every failure."""

from __future__ import annotations

import os
import random

from dmq.client._accumulator import RECORD_OVERHEAD_BYTES, accounted_cap, encoded_size_bound
from dmq.proto import records

LIMIT = 64 * 1024


def test_the_encoded_size_bound_holds_for_every_codec() -> None:
    """encoded_size_bound is what the caps rest on: check it against the real codec, worst cases
    included (incompressible values, tiny values where the bitmap and arrays dominate)."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    for codec in (records.Codec.NONE, records.Codec.ZSTD, records.Codec.LZ4):
        for _ in range(60):
            n = rng.choice([1, 2, 7, 8, 9, 100, 1_000, 5_000])
            size = rng.choice([0, 1, 5, 64, 3_000])
            values = [os.urandom(rng.randrange(0, size + 1)) for _ in range(n)]
            accounted = sum(len(v) + 12 for v in values)
            payload = records.encode(values, codec=codec)
            assert len(payload) <= encoded_size_bound(accounted, codec != records.Codec.NONE), (seed, codec, n, size)
    for limit in (64, 100, 1_000, LIMIT, 1024 * 1024, records.DEFAULT_MAX_BATCH_BYTES):
        for compressed in (False, True):
            cap = accounted_cap(limit, compressed)
            if cap == 0:  # not even one empty record fits (64 is the smallest max_message_bytes)
                assert encoded_size_bound(RECORD_OVERHEAD_BYTES, compressed) > limit
                continue
            assert encoded_size_bound(cap, compressed) <= limit < encoded_size_bound(cap + 1, compressed)
