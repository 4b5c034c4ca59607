"""``agentflow runs list`` and ``agentflow runs show``: what the store holds, checked row by row.

A run that fails its check never hides the others: ``runs list`` lists it, marked CORRUPT
with the reason (for a run signed with another key, the key id its rows carry), and says
on stderr how many failed; it exits non-zero for them only with ``--strict``.
"""

from __future__ import annotations

from collections.abc import Callable

import click

from agentflow._app import FlowApp
from agentflow._display import short, when
from agentflow._run_types import DEFAULT_VERSION
from agentflow.cli import _errors
from agentflow.cli._keys import key_ids
from agentflow.cli._reading import open_reading, reading_options
from agentflow.cli._show import (
    NEEDS_MIGRATION,
    check_summary,
    corrupt_text,
    needs_migration,
    other_keys_text,
    quarantine_text,
    run_text,
)
from agentflow.cli._text import echo, table
from agentflow.exec.run.markers import Markers
from agentflow.exec.run.quarantine import QUARANTINED, marks
from agentflow.exec.run.read import ALL_RUNS, read_run, read_runs, signed_with_other_keys
from agentflow.exec.run.view import CORRUPT, LIVE, STATUSES, RunReport


@click.group("runs")
def runs() -> None:
    """List the runs of a store, show one run, or prune finished ones."""


def list_row(report: RunReport, app: FlowApp | None = None) -> list[str]:
    """One line of the listing; a corrupt run shows its reason and nothing read from it (`table` escapes each cell).

    A flow run on a version other than the default shows it after the flow's name; given the
    deployment's `app`, a run on a version the app lacks is marked ``needs migration``.
    """
    if report.corrupt:
        if report.other_keys:
            why = f"signed with key id {', '.join(report.other_keys)}, which the keys given do not hold"
        else:
            why = short(report.problems[0], 100)
        return [report.run_id, "-", CORRUPT, "-", "-", "CORRUPT: " + why]
    marks = [f"{LIVE} on {report.running_on}" if m == LIVE else m for m in report.marks]
    if needs_migration(report, app):
        marks.append(NEEDS_MIGRATION)
    flow = report.flow if report.version in (None, DEFAULT_VERSION) else f"{report.flow} v{report.version}"
    return [report.run_id, flow, report.status, str(report.step), when(report.saved_at), ", ".join(marks)]


def _app_option(fn: Callable[..., None]) -> Callable[..., None]:
    return click.option(
        "--app",
        "app_path",
        metavar="MODULE:ATTR",
        help="The deployment's FlowApp: runs on a flow version it lacks are marked needs migration "
        "(with --workers: the deployment's own).",
    )(fn)


@runs.command("list")
@reading_options
@_app_option
@click.option("--flow", help="Only the runs of this flow.")
@click.option("--status", type=click.Choice(STATUSES), help="Only runs with this status.")
@click.option("--limit", default=200, show_default=True, help="At most this many runs, newest first.")
@click.option("--all", "every", is_flag=True, help="Every run of the store (no --limit).")
@click.option("--strict", is_flag=True, help="Exit 1 when a run fails its check (by default: listed, marked, exit 0).")
def list_runs(
    store_url: str | None,
    key_env: str,
    workers_path: str | None,
    app_path: str | None,
    flow: str | None,
    status: str | None,
    limit: int,
    every: bool,
    strict: bool,
) -> None:
    """List runs: id, flow, status, step, last update and marks (recovered, live, in doubt, paused, CORRUPT).

    A run whose rows fail their check is listed too, marked CORRUPT with the reason, and a
    line on stderr counts them; the exit code is 0 unless --strict is given.
    """
    reading = open_reading(store_url, key_env, workers_path, app_path)
    target, app = reading.target, reading.app
    cap = ALL_RUNS if every else min(max(limit, 0), ALL_RUNS)
    reports = target.run(lambda: read_runs(target.store, target.sealer, flow, min(cap + 1, ALL_RUNS)))
    more = len(reports) > cap  # one run past the cap was read only to tell whether there are more
    reports = reports[:cap]
    shown = [rep for rep in reports if rep.has_status(status)]
    if not shown:
        echo("no runs" + (" match" if flow or status else " in this store"))
    else:
        headers = ["run", "flow", "status", "step", "updated", "marks"]
        echo(table(headers, [list_row(rep, app) for rep in shown], colour=2))
        echo(f"{len(shown)} run(s)")
    if more:
        echo(f"more runs exist than the newest {cap} read: --limit {cap * 2} reads more, --all reads every run")
    summary = check_summary(reports, target.key_env, key_ids(target.keys))
    if summary is None:
        return
    problem = _errors.ProblemsFound(f"{summary} (agentflow verify RUN_ID names every row that fails)")
    if strict:
        raise problem
    problem.show()


@runs.command("show")
@reading_options
@_app_option
@click.argument("run_id")
def show_run(store_url: str | None, key_env: str, workers_path: str | None, app_path: str | None, run_id: str) -> None:
    """Show one run: checkpoints, segments, calls and their states, recoveries, approvals, state."""
    reading = open_reading(store_url, key_env, workers_path, app_path)
    target, app = reading.target, reading.app

    async def read() -> tuple[RunReport, dict[str, str]]:
        report = await read_run(target.store, target.sealer, run_id)
        held = await marks(Markers(target.store, target.sealer), [run_id] if report.corrupt else [], QUARANTINED)
        return report, {rid: quarantine_text(rid, mark) for rid, mark in held.items()}

    report, quarantined = target.run(read)
    wrong = other_keys_text([report], target.key_env, key_ids(target.keys))
    if wrong is not None and signed_with_other_keys([report]):
        raise _errors.CliError(f"{wrong}: give the key the workers sign with")
    if report.corrupt:
        echo("\n".join([corrupt_text(report), *(f"\n{line}" for line in quarantined.values())]))
        raise _errors.ProblemsFound(f"run {run_id!r} has rows that fail their check")
    echo(run_text(report, app, reading.workers))
