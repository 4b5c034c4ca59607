"""``python -m bench.commits REV [REV ...] [--rounds N] [--runs N]``: the ticket flow's run time, commit against commit.

What a change to the write path costs cannot be measured in one process (one process holds
one version of agentflow), nor by two loops run minutes apart on a shared machine. So each
revision is unpacked (``git archive``) into a directory of its own, and each round runs one
child process per revision, the order rotating from round to round. A child runs the
3-superstep ticket flow (`bench._flows`) on a memory store, with its events recorded into
the store (``Events(record=True)``, as the workers run) and without, the two interleaved
call by call (`bench._timing.interleave`); it reports each case's median per run. The
figures are the medians over the rounds, per run and per superstep, and the recording's
cost (recorded minus not, block by block) with its spread over the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CASES = ("events recorded", "not recorded")


async def _child(runs: int, blocks: int) -> dict[str, list[float]]:
    """Time the flow here (the agentflow on ``sys.path``): each case's per-block medians, in seconds per run."""
    from agentflow import Events, Executor, FlowRunner
    from agentflow.exec.checkpoints import MemoryCheckpointStore
    from bench import _flows
    from bench._timing import Plan, interleave

    ids = itertools.count()

    def case(record: bool) -> Any:
        runner = FlowRunner(
            Executor(_flows.registry, events=Events(record=record)), checkpoints=MemoryCheckpointStore()
        )
        return lambda: runner.run(_flows.flow, dict(_flows.ORDER), run_id=f"r{next(ids)}")

    series = await interleave(
        {CASES[0]: case(True), CASES[1]: case(False)}, Plan(warmup=50, blocks=blocks, per_block=runs)
    )
    return {name: list(found.values) for name, found in series.items()}


def _unpack(rev: str, into: Path) -> Path:
    """The tree of `rev` (agentflow and bench) in a directory of its own."""
    out = into / rev.replace("/", "_")
    out.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "agentflow", "bench"], check=True, capture_output=True
    )
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    return out


def _measure(tree: Path, runs: int, blocks: int) -> dict[str, list[float]]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(runs), str(blocks)],  # this file; agentflow and bench of `tree`
        cwd=tree,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    found: dict[str, list[float]] = json.loads(done.stdout.splitlines()[-1])
    return found


def _ms(value: float) -> str:
    return f"{value * 1e3:.2f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.commits", description=__doc__.splitlines()[0])
    parser.add_argument("revs", nargs="*", help="git revisions to compare (the working tree is not one)")
    parser.add_argument("--rounds", type=int, default=6, help="child processes per revision, order rotating")
    parser.add_argument("--runs", type=int, default=100, help="runs per case and block in a child")
    parser.add_argument("--blocks", type=int, default=3, help="blocks per child")
    parser.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)  # internal: measure here
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(asyncio.run(_child(*args.child))))
        return
    if not args.revs:
        parser.error("name at least one revision")
    with tempfile.TemporaryDirectory(prefix="bench-commits-") as tmp:
        trees = {rev: _unpack(rev, Path(tmp)) for rev in args.revs}
        found: dict[str, list[dict[str, list[float]]]] = {rev: [] for rev in args.revs}
        for n in range(args.rounds):
            order = args.revs[n % len(args.revs) :] + args.revs[: n % len(args.revs)]
            for rev in order:
                found[rev].append(_measure(trees[rev], args.runs, args.blocks))
    print(f"ticket flow, memory store: median of {args.rounds} rounds (ms; per superstep = per run / 3)")
    print(f"{'revision':<12} {'recorded/run':>13} {'/superstep':>11} {'not recorded/run':>17} {'recording costs':>22}")
    for rev, rounds in found.items():
        on = [statistics.median(r[CASES[0]]) for r in rounds]
        off = [statistics.median(r[CASES[1]]) for r in rounds]
        cost = [a - b for a, b in zip(on, off, strict=True)]
        print(
            f"{rev:<12} {_ms(statistics.median(on)):>13} {_ms(statistics.median(on) / 3):>11}"
            f" {_ms(statistics.median(off)):>17}"
            f" {_ms(statistics.median(cost)):>8} ({_ms(min(cost))}..{_ms(max(cost))})"
        )


if __name__ == "__main__":
    main()
