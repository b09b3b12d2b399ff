"""Running a seeded simulation (the queue lease and event claim ones): the seed printed, and on a
failure named with the step and the simulated time, so DMQ_SIM_SEED=<seed> replays it."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from typing import Protocol, TypeVar


class Simulation(Protocol):
    now_ms: int

    def step(self) -> None: ...

    def drain(self) -> None: ...


S = TypeVar("S", bound=Simulation)


def simulate(name: str, round_: int, make: Callable[[random.Random], S], steps: int) -> tuple[int, S]:
    """`steps` random steps of a new simulation, then its drain; the seed and the simulation."""
    seed = int(os.environ.get("DMQ_SIM_SEED", random.randrange(1 << 30))) + round_
    print(f"{name} seed={seed}")
    sim = make(random.Random(seed))
    for i in range(steps):
        try:
            sim.step()
        except AssertionError as e:
            raise AssertionError(f"seed={seed} step={i} now={sim.now_ms} ms: {e}") from None
    try:
        sim.drain()
    except AssertionError as e:
        raise AssertionError(f"seed={seed} draining: {e}") from None
    return seed, sim
