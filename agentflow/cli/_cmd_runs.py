"""``agentflow runs list`` and ``agentflow runs show``: what the store holds, checked row by row."""

from __future__ import annotations

import click

from agentflow._display import short, when
from agentflow.cli import _errors
from agentflow.cli._show import corrupt_text, run_text
from agentflow.cli._target import open_target, store_options
from agentflow.cli._text import echo, table
from agentflow.exec._run_read import ALL_RUNS, read_run, read_runs
from agentflow.exec._run_view import CORRUPT, LIVE, STATUSES, RunReport


@click.group("runs")
def runs() -> None:
    """List the runs of a store, or show one run."""


def list_row(report: RunReport) -> list[str]:
    """One line of the listing; a corrupt run shows its reason and nothing read from it (`table` escapes each cell)."""
    if report.corrupt:
        return [report.run_id, "-", CORRUPT, "-", "-", "CORRUPT: " + short(report.problems[0], 100)]
    marks = ", ".join(f"{LIVE} on {report.running_on}" if m == LIVE else m for m in report.marks)
    return [report.run_id, report.flow, report.status, str(report.step), when(report.saved_at), marks]


@runs.command("list")
@store_options
@click.option("--flow", help="Only the runs of this flow.")
@click.option("--status", type=click.Choice(STATUSES), help="Only runs with this status.")
@click.option("--limit", default=200, show_default=True, help="At most this many runs, newest first.")
def list_runs(store_url: str, key_env: str, flow: str | None, status: str | None, limit: int) -> None:
    """List runs: id, flow, status, step, last update and marks (recovered, live, in doubt, paused, CORRUPT)."""
    target = open_target(store_url, key_env)
    reports = target.run(lambda: read_runs(target.store, target.sealer, flow, min(max(limit, 0), ALL_RUNS)))
    wrong = target.wrong_key(reports)
    if wrong:
        raise _errors.CliError(wrong)
    shown = [rep for rep in reports if rep.has_status(status)]
    if not shown:
        echo("no runs" + (" match" if flow or status else " in this store"))
        return
    headers = ["run", "flow", "status", "step", "updated", "marks"]
    echo(table(headers, [list_row(rep) for rep in shown], colour=2))
    echo(f"{len(shown)} run(s)")


@runs.command("show")
@store_options
@click.argument("run_id")
def show_run(store_url: str, key_env: str, run_id: str) -> None:
    """Show one run: checkpoints, segments, calls and their states, recoveries, approvals, state."""
    target = open_target(store_url, key_env)
    report = target.run(lambda: read_run(target.store, target.sealer, run_id))
    wrong = target.wrong_key([report])
    if wrong:
        raise _errors.CliError(wrong)
    if report.corrupt:
        echo(corrupt_text(report))
        raise _errors.ProblemsFound(f"run {run_id!r} has rows that fail their check")
    echo(run_text(report))
