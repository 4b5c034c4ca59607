"""Hunting the planted bugs: each mutant planted, the simulation run on it, the steps until an invariant broke.

`hunt` plants one mutant (`_kit.Mutant.plant`) on one store set-up, runs the simulation from
one seed until an invariant breaks or the step budget is spent (or the wall-clock limit: a
hunt never holds the machine longer than it was given), and says what caught the bug.
`table` puts the hunts of many mutants and seeds in the table docs/simulation.md shows.

A mutant is *found* from a seed when an invariant broke within the budget; the steps to
detection count every step of every episode up to the failure, so they compare across
changes of the simulation (an episode's length included).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from unittest import mock

from agentflow.sim._setups import SETUPS
from agentflow.sim._simulation import Config, run_simulation
from agentflow.sim._world import World
from agentflow.sim.mutants._kit import Mutant

#: What caught a bug, by a phrase of the invariant's message (first match).
CAUGHT_BY = (
    ("the store took", "store rules"),
    ("with no signed grant", "granted rerun"),
    ("claimed the run from", "unclaimed"),
    ("times with", "effect twice"),
    ("did not hold the run", "lease held"),
    ("no started record", "started first"),
    ("after the run was cancelled", "cancel first"),
    ("verify reports", "verify"),
    ("did not end", "runs end"),
    ("ended done with", "end state"),
    ("raised", "actor raised"),
)


@dataclass(frozen=True)
class Hunt:
    """One mutant hunted on one set-up from one seed."""

    mutant: str
    setup: str
    seed: int
    steps: int
    """Steps run: to the broken invariant when found, else the whole budget (or what the time limit let run)."""
    caught_by: str | None
    """What caught it (`CAUGHT_BY`), None when it was not found."""
    invariant: str
    seconds: float

    @property
    def found(self) -> bool:
        return self.caught_by is not None

    def __str__(self) -> str:
        if self.caught_by is None:
            return f"{self.mutant:<20} {self.setup:<10} seed {self.seed}: NOT FOUND in {self.steps:,} steps"
        return (
            f"{self.mutant:<20} {self.setup:<10} seed {self.seed}: {self.steps:>9,} steps  "
            f"{self.caught_by:<13} ({self.seconds:.1f} s)"
        )


def caught_by(invariant: str) -> str:
    """The short name of the invariant a failure message names."""
    return next((name for phrase, name in CAUGHT_BY if phrase in invariant), "other")


def hunt(
    mutant: Mutant, setup: str, seed: int, steps: int, seconds: float | None = None, *, plain: bool = False
) -> Hunt:
    """Plant `mutant` on `setup`, run the simulation from `seed` until it is found, `steps` ran or `seconds` passed.

    `plain`: the simulation as it was before its reach was raised, for the measure of before and
    after (no per-episode draws, `Config.reach` None, and no check of the history of writes).
    """
    began = time.perf_counter()
    config = Config(steps=steps, reach=None) if plain else Config(steps=steps)
    unjudged = mock.patch.object(World, "_judge", lambda self, broken: None) if plain else nullcontext()
    with mutant.plant(setup), unjudged:
        report = run_simulation(SETUPS[setup](), seed, config, until=None if seconds is None else began + seconds)
    took = time.perf_counter() - began
    failure = report.failure
    if failure is None:
        return Hunt(mutant.name, setup, seed, report.stats.steps, None, "", took)
    return Hunt(mutant.name, setup, seed, report.stats.steps, caught_by(failure.invariant), failure.invariant, took)


def hunts(
    mutants: Iterable[Mutant],
    seeds: Sequence[int],
    steps: int,
    seconds: float | None = None,
    setups: Sequence[str] | None = None,
    *,
    plain: bool = False,
) -> Iterable[Hunt]:
    """Every mutant on each of its set-ups (those among `setups`, if given), from each seed, one after another."""
    for mutant in mutants:
        for setup in mutant.setups():
            if setups and setup not in setups:
                continue
            for seed in seeds:
                yield hunt(mutant, setup, seed, steps, seconds, plain=plain)


def table(found: Sequence[Hunt], seeds: Sequence[int]) -> str:
    """A Markdown table: one row per mutant and set-up, the steps to detection per seed (— when not found)."""
    rows: dict[tuple[str, str], dict[int, Hunt]] = {}
    for one in found:
        rows.setdefault((one.mutant, one.setup), {})[one.seed] = one
    head = "| mutant | set-up | " + " | ".join(f"seed {s}" for s in seeds) + " | caught by |"
    lines = [head, "| --- | --- | " + " | ".join("---:" for _ in seeds) + " | --- |"]
    for (mutant, setup), by_seed in rows.items():
        cells = []
        for seed in seeds:
            hunted = by_seed.get(seed)
            cells.append("" if hunted is None else f"{hunted.steps:,}" if hunted.found else "—")
        caught = sorted({h.caught_by for h in by_seed.values() if h.caught_by is not None})
        lines.append(f"| {mutant} | {setup} | " + " | ".join(cells) + f" | {', '.join(caught) or '—'} |")
    return "\n".join(lines)
