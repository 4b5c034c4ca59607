"""Shrinking a failure: the fewest faults of the failing episode that still break an invariant.

The episode is replayed from its seed with faults suppressed (drawn, so the other draws stay
where they were, but not applied), one at a time from the last to the first: a fault whose
suppression still fails stays suppressed. What is left is the short story of the failure:
the faults it needs, and the schedule from the first of them to the broken invariant.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from agentflow.sim._setups import SetUp
from agentflow.sim._simulation import Config, Failure, run_simulation


def shrink(setup: Callable[[], SetUp], failure: Failure, config: Config, budget: int = 60) -> str:
    """Shrink `failure` (at most `budget` replays) and describe what is left."""
    best = failure
    suppressed = set(failure.suppressed)
    replays = 0
    for number, _, _ in reversed(failure.faults):
        if replays >= budget:
            break
        replays += 1
        trial = replace(config, steps=1, suppress=frozenset(suppressed | {number}))
        again = run_simulation(setup(), failure.seed, trial, only_episode=failure.seed).failure
        if again is not None:
            suppressed.add(number)
            best = again
    lines = [
        f"shrunk in {replays} replays: {len(best.faults)} of {len(failure.faults)} faults are needed, "
        f"{best.steps} steps (from {failure.steps})",
        *(f"   fault {n}: {kind} at {point}" for n, kind, point in best.faults),
        str(best),
    ]
    return "\n".join(lines)
