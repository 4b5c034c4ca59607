"""``python -m agentflow.sim.mutants``: hunt each planted bug from several seeds, print the steps to detection."""

from __future__ import annotations

import argparse
import logging
import sys

from agentflow.sim.mutants._hunt import hunts, table
from agentflow.sim.mutants._kit import MUTANTS


def main(argv: list[str] | None = None) -> int:
    """Hunt the mutants as asked; 1 when one of them was not found from every seed."""
    names = [m.name for m in MUTANTS]
    parser = argparse.ArgumentParser(prog="python -m agentflow.sim.mutants", description=__doc__)
    parser.add_argument("--mutant", action="append", choices=names, help="a mutant to hunt (repeat; default: all)")
    parser.add_argument("--setup", action="append", help="hunt store mutants on these set-ups only (repeat)")
    parser.add_argument("--seeds", type=int, default=5, help="simulation seeds 1..N")
    parser.add_argument("--steps", type=int, default=300_000, help="the step budget of each hunt")
    parser.add_argument("--seconds", type=float, default=600.0, help="the wall-clock limit of each hunt")
    parser.add_argument(
        "--plain", action="store_true", help="the simulation before its reach was raised (to measure before and after)"
    )
    args = parser.parse_args(argv)
    logging.disable(logging.CRITICAL)  # the library logs every lost lease and refused write
    chosen = [m for m in MUTANTS if args.mutant is None or m.name in args.mutant]
    seeds = list(range(1, args.seeds + 1))
    done = []
    for one in hunts(chosen, seeds, args.steps, args.seconds, setups=args.setup, plain=args.plain):
        print(one, flush=True)
        done.append(one)
    print(table(done, seeds), flush=True)
    return 0 if all(h.found for h in done) else 1


if __name__ == "__main__":
    sys.exit(main())
