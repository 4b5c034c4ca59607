"""The list of benchmarks and what each one is given.

To add a benchmark, drop ``bench/<name>.py`` next to the others and list ``<name>`` in
`BENCHMARKS`. The module defines:

- ``TITLE``: one line, e.g. ``"P3: Celery supersteps/s vs bare chained tasks"``;
- ``async def run(ctx: Context) -> Report``: measures, and returns tables, targets and raw
  data (`bench._report`); parts that need a missing server are skipped with a note;
- optionally ``def plot(report: Report, out_dir: Path) -> list[Path]``: writes PNGs named
  ``bench-*.png`` into `out_dir` (``docs/img``) and returns their paths.

`python -m bench` runs each listed module in its own event loop, prints its report,
writes ``bench/results/<name>.json`` and draws its plots.
"""

from __future__ import annotations

import importlib
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from bench._env import Services

#: Benchmarks in the order `python -m bench` runs them (module names under ``bench/``).
BENCHMARKS: list[str] = [
    "engine",  # P0
    "durability",  # P1 (issue 3 item 7)
    "stores",  # issue 4 item 7: the six store set-ups side by side
    "redis_floor",  # P2
    "unfinished",  # P4
    "loop_storage",  # P5
    "loop_durability",  # P1 for tool loops (issue 17 item 5): durability per stage vs LangGraph's ReAct agent
    "agent_step",  # a pydantic-ai agent step: DurableAgent vs pydantic-ai's DBOS integration (SQLite, PostgreSQL)
    "rss",  # issue 8 item 4: memory stays flat over 1,000 runs
    "celery_steps",  # P3: supersteps/s with 2 workers vs bare chained Celery tasks
    "recovery",  # issue 14: SIGKILL -> the run moving again, default settings (a few minutes)
    "observe",  # issue 18: metrics off and on, per superstep on the memory store
    "prune",  # issue 19: pruning 100,000 finished runs (SQLite file, PostgreSQL, Redis)
    "scale",  # P8 (issue 17): 10,000 runs through 2 Celery workers on one Redis (about 10 minutes)
    "workers_scaling",  # issue 20 item 5: supersteps/s as workers are added, Redis vs RabbitMQ + PostgreSQL
    "store_durability",  # issue 29 item 4: what the Redis store's durability options cost
]


@dataclass
class Context:
    """What every benchmark gets."""

    quick: bool
    """A smoke run: fewer repetitions and smaller sizes (figures are not for the docs)."""
    tmp: Path
    """A fresh directory of its own for files (SQLite databases), removed afterwards."""
    services: Services
    """Which servers answered."""
    tag: str = field(default_factory=lambda: "bench" + secrets.token_hex(4))
    """Unique per benchmark: the Redis key prefix and PostgreSQL table prefix/schema to use (and drop)."""
    key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    """A checkpoint key for stores that need one."""
    cases: tuple[str, ...] = ()
    """``--case`` filters: a benchmark that supports them measures only the cases whose name contains one."""

    def sized(self, full: int, quick: int) -> int:
        return quick if self.quick else full

    def wants(self, case: str) -> bool:
        """Whether `case` is measured in this run (every case when no ``--case`` was given)."""
        return not self.cases or self.named(case)

    def named(self, case: str) -> bool:
        """Whether a ``--case`` names `case`: diagnostic cases run only then, never in a full run."""
        return any(part.lower() in case.lower() for part in self.cases)


def load(name: str) -> ModuleType:
    if name not in BENCHMARKS:
        raise SystemExit(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
    return importlib.import_module(f"bench.{name}")
