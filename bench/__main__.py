"""``python -m bench [--quick] [--only NAME ...]``: run the benchmark suite.

Prints each benchmark's tables and targets, writes ``bench/results/<name>.json`` (plus
``summary.json`` and ``summary.md``, the tables in Markdown for docs/benchmarks.md), and
draws the plots into ``docs/img/bench-*.png``. A ``--quick`` run writes everything under
``bench/results/quick/`` instead, so a smoke run never replaces what the docs show; a run
of some cases only (``--case PART``, in the benchmarks that support it) writes under
``bench/results/partial/``.

Each benchmark runs in a fresh Python process of its own (``--one NAME``), so none pays for
the objects another left behind: CPython's full garbage collections walk every object a
process holds, and one benchmark's heap would slow the next one's allocations.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from bench._env import machine, probe_services, versions
from bench._report import Report, read_json, targets_table, write_json
from bench._suite import BENCHMARKS, Context, load

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
#: Where a ``--quick`` run writes, so a smoke run never replaces a full run's results or plots.
QUICK = RESULTS / "quick"
#: Where a run of some cases only (``--case``) writes, for the same reason.
PARTIAL = RESULTS / "partial"


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a fast smoke run (small sizes, few repetitions)")
    parser.add_argument(
        "--only", action="append", default=[], metavar="NAME", help="run only this benchmark (repeatable, or a,b)"
    )
    parser.add_argument(
        "--case",
        action="append",
        default=[],
        metavar="PART",
        help="only the cases whose name contains PART, in benchmarks that support it (stores); repeatable",
    )
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument("--no-plots", action="store_true", help="do not draw the PNGs")
    parser.add_argument(
        "--replot", action="store_true", help="only redraw the PNGs from bench/results/<name>.json (no measuring)"
    )
    parser.add_argument("--one", metavar="NAME", help=argparse.SUPPRESS)  # internal: run one benchmark here
    return parser.parse_args(argv)


def _out(quick: bool, cases: list[str]) -> Path:
    return QUICK if quick else PARTIAL if cases else RESULTS


def _run_one(name: str, quick: bool, services: Any, env: dict[str, Any], cases: list[str]) -> Report | None:
    tmp = Path(tempfile.mkdtemp(prefix=f"agentflow-bench-{name}-"))
    ctx = Context(quick=quick, tmp=tmp, services=services, cases=tuple(cases))
    started = time.perf_counter()
    try:
        report: Report = asyncio.run(load(name).run(ctx))
        report.name = name
    except Exception:
        print(f"== {name}: FAILED\n{traceback.format_exc()}", flush=True)
        return None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report.data["wall_s"] = time.perf_counter() - started
    print(report.text(), flush=True)
    print(f"({name} took {report.data['wall_s']:.1f} s)\n", flush=True)
    write_json(report, env, _out(quick, cases) / f"{name}.json")
    return report


def _isolated(name: str, quick: bool, cases: list[str]) -> Report | None:
    """Run one benchmark in a fresh process (``--one``) and read its report back from its JSON."""
    path = _out(quick, cases) / f"{name}.json"
    path.unlink(missing_ok=True)
    flags = [*(["--quick"] if quick else []), *(f"--case={case}" for case in cases)]
    proc = subprocess.run([sys.executable, "-m", "bench", "--one", name, *flags], cwd=ROOT)
    if proc.returncode != 0 or not path.exists():
        return None
    report = read_json(path)
    report.name = name
    return report


def _plot(reports: list[Report], out_dir: Path) -> list[Path]:
    drawn: list[Path] = []
    for report in reports:
        plot = getattr(load(report.name), "plot", None)
        if plot is None:
            continue
        try:
            drawn += plot(report, out_dir)
        except Exception:
            print(f"plot of {report.name} failed:\n{traceback.format_exc()}", flush=True)
    return drawn


def _replot(chosen: list[str]) -> int:
    """Redraw the plots of the last full run from its JSON files (into docs/img)."""
    reports = []
    for name in chosen:
        path = RESULTS / f"{name}.json"
        if path.exists():
            saved = json.loads(path.read_text())
            reports.append(Report(name, saved["title"], data=saved["data"]))
    for path in _plot(reports, ROOT / "docs" / "img"):
        print(f"plot: {path.relative_to(ROOT)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if args.list:
        for name in BENCHMARKS:
            print(f"{name:14} {load(name).TITLE}")
        return 0
    chosen = [n for item in args.only for n in item.split(",") if n] or BENCHMARKS
    if args.replot:
        return _replot(chosen)
    services = asyncio.run(probe_services())
    env = {"machine": machine(Path(tempfile.gettempdir())), "versions": versions(services), "quick": args.quick}
    if args.one:
        return 0 if _run_one(args.one, args.quick, services, env, args.case) is not None else 1
    print("machine: " + json.dumps(env["machine"]), "versions: " + json.dumps(env["versions"]), sep="\n")
    for what, why in (("Redis", services.redis_why), ("PostgreSQL", services.pg_why)):
        if why:
            print(f"{what}: {why}; the parts that need it are skipped")
    print(flush=True)
    reports = [r for r in (_isolated(name, args.quick, args.case) for name in chosen) if r is not None]
    env["machine"]["load_average_at_end"] = os.getloadavg()
    targets = [t for r in reports for t in r.targets]
    if targets:
        print(targets_table(targets).text(), flush=True)
    out = _out(args.quick, args.case)
    out.mkdir(parents=True, exist_ok=True)
    summary = {
        "env": env,
        "benchmarks": [r.name for r in reports],
        "targets": [t.__dict__ | {"met": t.met} for t in targets],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    md = "\n\n".join([r.markdown() for r in reports] + ([targets_table(targets).markdown()] if targets else []))
    (out / "summary.md").write_text(md + "\n")
    if not args.no_plots:
        out_dir = out / "img" if out != RESULTS else ROOT / "docs" / "img"
        for path in _plot(reports, out_dir):
            print(f"plot: {path.relative_to(ROOT)}")
    failed = [n for n in chosen if n not in {r.name for r in reports}]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
