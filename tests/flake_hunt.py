"""Flake hunt: run tests in a random order, each several times, and say what failed and how to
replay it (issue 33).

    .venv/bin/python tests/flake_hunt.py                          # tests/integration and tests/fault, 3 rounds
    .venv/bin/python tests/flake_hunt.py --rounds 5 --count 3 tests/integration/test_kafka_api.py

Each round is one pytest process with pytest-randomly on (a new order and `random` seed, printed)
and pytest-repeat's --count; the rounds run one after another, never side by side (the machine's
cores are shared, and a failure the hunt's own load causes proves nothing). A test that fails in
one order and passes in another depends on another test's state; one that fails in some runs of
the same order depends on timing. Either is a defect of the test (or of the code) to fix at its
cause: the hunt never retries. Exit status 1 when any round failed.
"""

from __future__ import annotations

import argparse
import pathlib
import random
import re
import subprocess
import sys
import time

DEFAULT_PATHS = ["tests/integration", "tests/fault"]
_FAILED = re.compile(r"^(FAILED|ERROR) (\S+)", re.MULTILINE)


def replay_command(seed: int, count: int, paths: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "-p", "randomly", f"--randomly-seed={seed}", f"--count={count}", *paths]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", default=DEFAULT_PATHS, help="test files or folders (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="pytest runs, each in a new random order")
    parser.add_argument("--count", type=int, default=1, help="runs of each test within a round (pytest-repeat)")
    parser.add_argument("--seed", type=int, default=None, help="the first round's order seed (the next ones add 1)")
    parser.add_argument("--log-dir", type=pathlib.Path, default=pathlib.Path("build/flake-hunt"),
                        help="each round's full output goes to ROUND-SEED.log here")
    args = parser.parse_args(argv)
    first_seed = random.randrange(2**31) if args.seed is None else args.seed
    args.log_dir.mkdir(parents=True, exist_ok=True)
    failures: list[tuple[int, str]] = []
    for round_no in range(args.rounds):
        seed = first_seed + round_no
        cmd = replay_command(seed, args.count, args.paths) + ["-q", "-p", "no:cacheprovider", "-rfE"]
        log = args.log_dir / f"{round_no + 1}-{seed}.log"
        started = time.monotonic()
        with open(log, "w") as out:
            rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode
        found = sorted(set(m.group(2) for m in _FAILED.finditer(log.read_text(errors="replace"))))
        print(f"round {round_no + 1}/{args.rounds} seed {seed}: exit {rc}, {len(found)} failed, "
              f"{time.monotonic() - started:.0f} s, log {log}", flush=True)
        for test in found:
            print(f"  {test}", flush=True)
            failures.append((seed, test))
        if rc not in (0, 1):  # 2-5: interrupted, internal or usage error, nothing collected
            print(f"  pytest itself failed (exit {rc}): see {log}", flush=True)
            failures.append((seed, f"<pytest exit {rc}>"))
    if failures:
        print("\nreplay a failure in its order with:")
        for seed in sorted({s for s, _ in failures}):
            print("  " + " ".join(replay_command(seed, args.count, args.paths)))
        return 1
    print(f"\n{args.rounds} rounds, no failure")
    return 0


if __name__ == "__main__":
    sys.exit(main())
