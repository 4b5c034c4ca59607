"""Find again the episode seeds of `test_regression_seeds.FOUND` after a change moved the schedules.

A seed pins one schedule of today's code; a change that adds a store operation or a task
to a superstep (a renewal, a marker read) replays a different story, and the seed no
longer finds its bug with the fix reverted. This runs the simulation with each fix
reverted, simulation seed after simulation seed, until an episode breaks the invariant the
entry names, checks that the same episode holds with the fix in, and prints the new seed::

    .venv/bin/python tests/sim/find_seeds.py [name ...] [--steps-per-seed N] [--seeds K] [--first S]

Copy the printed seeds into `FOUND` (the comments there say how each was found).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from test_regression_seeds import FOUND, config_of, replay  # the script's folder is first on sys.path

from agentflow.sim import SETUPS, run_simulation


def find(name: str, steps_per_seed: int, seeds: int, first: int = 1) -> int | None:
    """The first episode seed that finds entry `name`'s bug with its fix reverted and holds with it in."""
    _, setup, _, faults, revert, breaks, _ = next(entry for entry in FOUND if entry[0] == name)
    config = config_of(faults, steps_per_seed)
    for seed in range(first, first + seeds):
        began = time.perf_counter()
        with revert():
            report = run_simulation(SETUPS[setup](), seed, config)
        failure = report.failure
        took = time.perf_counter() - began
        if failure is None or breaks not in failure.invariant:
            print(f"{name}: simulation seed {seed}: nothing after {report.stats.steps} steps ({took:.1f} s)")
            continue
        if replay(setup, failure.seed, faults).failure is not None:
            print(f"{name}: episode {failure.seed} fails with the fix in too: not this bug; going on")
            continue
        print(f"{name}: simulation seed {seed} finds it at episode seed {failure.seed} after {failure.steps} "
              f"steps ({took:.1f} s)")  # fmt: skip
        return failure.seed
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=[entry[0] for entry in FOUND])
    parser.add_argument("--steps-per-seed", type=int, default=1_000_000)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--first", type=int, default=1, help="the first simulation seed to try")
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)
    missing = [name for name in args.names if find(name, args.steps_per_seed, args.seeds, args.first) is None]
    for name in missing:
        print(f"{name}: not found; try more seeds or steps")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
