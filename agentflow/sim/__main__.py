"""``python -m agentflow.sim``: run the simulation on one or more store set-ups and report (see README.md)."""

from __future__ import annotations

import argparse
import logging
import sys

from agentflow.sim._report import describe
from agentflow.sim._setups import SETUPS
from agentflow.sim._shrink import shrink
from agentflow.sim._simulation import Config, Faults, run_simulation


def main(argv: list[str] | None = None) -> int:
    """Run the simulation as asked on the command line; 1 when an invariant broke."""
    parser = argparse.ArgumentParser(prog="python -m agentflow.sim", description=__doc__)
    parser.add_argument(
        "--setup",
        action="append",
        choices=sorted(SETUPS),
        help="store set-up (repeat; default: memory, sqlite and fakeredis, and with --lost-writes memory and "
        "memory-waiting)",
    )
    parser.add_argument("--steps", type=int, default=1_000_000, help="scheduling steps per set-up")
    parser.add_argument(
        "--seed", type=int, default=1, help="the simulation's seed (each episode's seed derives from it)"
    )
    parser.add_argument("--episode", type=int, help="replay the one episode with this seed (what a failure prints)")
    parser.add_argument("--suppress", default="", help="with --episode: faults (numbers, comma-separated) not applied")
    parser.add_argument(
        "--lost-writes",
        type=float,
        default=0.0,
        help="chance per step of a failover that loses writes (the memory set-ups only)",
    )
    parser.add_argument("--no-shrink", action="store_true", help="report a failure as found, without shrinking it")
    parser.add_argument("--verbose", action="store_true", help="let the library log (it is quiet by default)")
    args = parser.parse_args(argv)
    if not args.verbose:
        logging.disable(logging.CRITICAL)  # the library logs every lost lease and refused write: thousands
    status = 0
    default = ("memory", "memory-waiting") if args.lost_writes else ("fakeredis", "memory", "sqlite")
    for name in args.setup or default:
        suppress = frozenset(int(n) for n in args.suppress.split(",") if n.strip())
        config = Config(steps=args.steps, suppress=suppress, faults=Faults(lost_writes=args.lost_writes))
        report = run_simulation(SETUPS[name](), args.seed, config, only_episode=args.episode)
        print(describe(report), flush=True)
        if report.failure is not None:
            status = 1
            if not args.no_shrink:
                print(shrink(SETUPS[name], report.failure, config), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
