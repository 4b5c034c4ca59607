"""Run `make test`'s stages timed and write tests/DURATIONS.md: where the suite's minutes go.

Usage (what ``make durations`` runs)::

    python scripts/durations.py [OUT]

Each stage of `make test` runs as ``make <stage>`` (lint, typecheck, docs, pytest), on its
wall clock, with the type checkers' and linters' caches removed first, as in a fresh clone;
pytest writes a JUnit report (each test's setup, call and teardown summed). The record
gives the stages, the test time per test folder (the groups), and the slowest tests, with
the date and the commit measured. Test time is summed over both pytest processes, so a
folder's share is of the work, not of the wall clock. A failing stage stops the run and
writes nothing.
"""

from __future__ import annotations

import datetime
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

SLOWEST = 30


@dataclass(frozen=True)
class Case:
    """One test as the report gives it: its id, its folder, its seconds, and whether it ran."""

    test_id: str
    group: str
    seconds: float
    outcome: str


def cases(junit: Path) -> list[Case]:
    """Every test case of a pytest JUnit report."""
    found = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "")  # tests.celery.test_workers (or .Class inside it)
        parts = module.split(".")
        group = "/".join(parts[:2]) if len(parts) > 2 else parts[0] or "?"
        outcome = "skipped" if case.find("skipped") is not None else "failed" if (
            case.find("failure") is not None or case.find("error") is not None
        ) else "passed"  # fmt: skip
        found.append(Case(f"{module}::{case.get('name')}", group, float(case.get("time", "0")), outcome))
    return found


def record(stages: list[tuple[str, float]], found: list[Case], commit: str, day: str) -> str:
    """The record's Markdown."""
    total = sum(seconds for _, seconds in stages)
    test_time = sum(c.seconds for c in found)
    lines = [
        "# Where `make test` spends its time",
        "",
        f"Measured on {day} at commit `{commit}` by `make durations` (2 cores). Rewritten by each run of it.",
        "",
        "## Stages (wall clock)",
        "",
        "| stage | seconds |",
        "|---|---:|",
        *(f"| {name} | {seconds:.0f} |" for name, seconds in stages),
        f"| **total** | **{total:.0f}** |",
        "",
        f"## Test time per folder (summed over the pytest processes: {test_time:.0f} s, {len(found)} tests)",
        "",
        "| folder | tests | seconds | share |",
        "|---|---:|---:|---:|",
    ]
    per: dict[str, list[Case]] = defaultdict(list)
    for case in found:
        per[case.group].append(case)
    for group, members in sorted(per.items(), key=lambda kv: -sum(c.seconds for c in kv[1])):
        seconds = sum(c.seconds for c in members)
        lines.append(f"| {group} | {len(members)} | {seconds:.1f} | {seconds / max(test_time, 1e-9):.0%} |")
    grouped: dict[str, list[Case]] = defaultdict(list)
    for case in found:
        suffix = re.search(r"@(\w+)$", case.test_id)  # pytest-xdist's loadgroup suffix: one process, one at a time
        if suffix:
            grouped[suffix.group(1)].append(case)
    for name, members in sorted(grouped.items()):
        seconds = sum(c.seconds for c in members)
        lines.append(
            f"\nThe xdist group `{name}` ({len(members)} tests) runs on one process, one test at a time: "
            f"{seconds:.0f} s of that process's wall clock."
        )
    counts: dict[str, int] = defaultdict(int)
    for case in found:
        counts[case.outcome] += 1
    lines += [
        "",
        "Outcomes: " + ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())) + ".",
        "",
        f"## The {SLOWEST} slowest tests",
        "",
        "| seconds | test |",
        "|---:|---|",
        *(f"| {c.seconds:.1f} | `{c.test_id}` |" for c in sorted(found, key=lambda c: -c.seconds)[:SLOWEST]),
        "",
    ]
    return "\n".join(lines)


def timed_stages(junit: Path) -> list[tuple[str, float]] | None:
    """Run each stage of `make test`; its wall clock, or None when one failed."""
    for cache in (".mypy_cache", ".ruff_cache"):
        shutil.rmtree(cache, ignore_errors=True)
    stages = []
    for stage in ("lint", "typecheck", "docs", "pytest"):
        args = ["make", "--no-print-directory", stage]
        if stage == "pytest":
            args.append(f"PYTEST_ARGS=--junitxml={junit} {os.environ.get('PYTEST_ARGS', '')}".strip())
        start = time.monotonic()
        if subprocess.run(args, check=False).returncode != 0:
            print(f"durations: make {stage} failed; no record written", file=sys.stderr)
            return None
        stages.append((stage, time.monotonic() - start))
    return stages


def main(argv: list[str]) -> int:
    """Measure, then write the record (to OUT, tests/DURATIONS.md by default)."""
    if len(argv) > 1:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[0] if argv else "tests/DURATIONS.md")
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        stages = timed_stages(junit)
        if stages is None:
            return 1
        found = cases(junit)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    if dirty.stdout.strip():
        commit += " with uncommitted changes"
    day = datetime.date.today().isoformat()
    out.write_text(record(stages, found, commit or "unknown", day))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
