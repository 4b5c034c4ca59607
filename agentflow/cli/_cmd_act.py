"""``agentflow recover`` and ``agentflow resume``: act on stored runs with the app's flows and tools.

Both run the tools in this process, exactly as a worker would.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from agentflow._app import FlowApp
from agentflow._display import printable, short
from agentflow._errors import (
    AgentflowError,
    CheckpointConflict,
    CheckpointStoreCorrupt,
    FlowError,
    IdentityMismatch,
    RecoveryNeedsDecision,
)
from agentflow._run_types import RunKind
from agentflow.cli import _errors
from agentflow.cli._apps import import_app
from agentflow.cli._target import open_target, store_options
from agentflow.cli._text import echo, paint, table
from agentflow.flow._graph import Flow
from agentflow.flow._result import RunResult
from agentflow.flow._runner import FlowRunner

#: Outcomes that leave a run in good hands.
FINE = ("done", "paused")


def _flow(app_path: str, name: str) -> tuple[FlowApp, Flow[Any]]:
    app = import_app(app_path)
    try:
        return app, app.flow(name)
    except FlowError as exc:
        raise _errors.CliError(str(exc)) from None


def outcome(result: RunResult[Any] | BaseException) -> tuple[str, str]:
    """``(outcome, detail)`` of one recovered run, for the summary table."""
    if isinstance(result, RecoveryNeedsDecision):
        return "needs a decision", "in doubt: " + "; ".join(f"{tool} ({why})" for tool, why in result.calls)
    if isinstance(result, IdentityMismatch):
        return "needs its principal", str(result)
    if isinstance(result, CheckpointConflict):
        return "skipped", str(result)
    if isinstance(result, CheckpointStoreCorrupt):
        return "CORRUPT", str(result)
    if isinstance(result, BaseException):
        return "error", f"{type(result).__name__}: {result}"
    if result.status == "failed":
        return "failed", result.error or ""
    if result.status == "paused":
        return "paused", "waiting for approval: " + ", ".join(p.tool for p in result.pending)
    return str(result.status), f"replayed {len(result.replayed)} call(s), reran {len(result.rerun)}"


async def _recover_each(runner: FlowRunner, flow: Flow[Any], rerun: bool) -> dict[str, tuple[str, str]]:
    assert runner.checkpoints is not None
    run_ids = list(await runner.checkpoints.list_unfinished(flow.name))
    outcomes: dict[str, tuple[str, str]] = {}
    if not run_ids:
        return outcomes
    label = f"recovering {len(run_ids)} run(s) of {printable(flow.name)}"
    with click.progressbar(run_ids, label=label, file=sys.stderr) as bar:
        for run_id in bar:
            try:
                outcomes[run_id] = outcome(await runner.recover(flow, run_id, rerun_in_doubt=rerun))
            except AgentflowError as exc:  # reported per run: one difficult run must not stop the others
                outcomes[run_id] = outcome(exc)
    return outcomes


@click.command("recover")
@store_options
@click.argument("flow_name", metavar="FLOW")
@click.option("--app", "app_path", required=True, metavar="MODULE:ATTR", help="The FlowApp with the flow and tools.")
@click.option("--rerun-in-doubt", is_flag=True, help="Run calls in doubt again (check them at their system first).")
def recover(store_url: str, key_env: str, flow_name: str, app_path: str, rerun_in_doubt: bool) -> None:
    """Recover every unfinished run of FLOW, as a worker does on start-up."""
    app, flow = _flow(app_path, flow_name)
    target = open_target(store_url, key_env)
    runner = app.runner(target.store, target.keys)
    outcomes = target.run(lambda: _recover_each(runner, flow, rerun_in_doubt))
    if not outcomes:
        echo(f"no unfinished runs of flow {flow_name!r}")
        return
    rows = [[run_id, what, short(detail, 100)] for run_id, (what, detail) in outcomes.items()]
    echo(table(["run", "outcome", "detail"], rows, colour=1))
    if any(what == "needs a decision" for what, _ in outcomes.values()):
        echo(
            f"check the calls in doubt at their system, then: agentflow recover {printable(flow_name)} "
            "--rerun-in-doubt ..."
        )
    stuck = [run_id for run_id, (what, _) in outcomes.items() if what not in FINE]
    if stuck:
        raise _errors.ProblemsFound(f"{len(stuck)} of {len(outcomes)} run(s) were not recovered")


async def _resume(runner: FlowRunner, app: FlowApp, run_id: str, approve: bool, note: str | None) -> RunResult[Any]:
    assert runner.checkpoints is not None and runner.sealer is not None
    row = await runner.checkpoints.latest(run_id)
    runner.sealer.open_checkpoint(row, run_id)  # the flow name is trusted only once the row checks
    if RunKind.of(row.flow) is RunKind.LOOP:
        raise _errors.CliError(f"run {run_id!r} is a tool loop; resume it with run_tool_loop and the same run_id")
    try:
        flow = app.flow(row.flow)
    except FlowError as exc:
        raise _errors.CliError(str(exc)) from None
    result: RunResult[Any] = await runner.resume(flow, run_id, approve=approve, note=note)
    return result


@click.command("resume")
@store_options
@click.argument("run_id")
@click.option("--app", "app_path", required=True, metavar="MODULE:ATTR", help="The FlowApp with the run's flow.")
@click.option("--approve/--deny", "approve", default=None, help="The decision for every pending call.")
@click.option("--note", help="A note stored with the decision.")
def resume(store_url: str, key_env: str, run_id: str, app_path: str, approve: bool | None, note: str | None) -> None:
    """Approve or deny the pending calls of a paused run, and carry the run on."""
    if approve is None:
        raise click.UsageError("say --approve or --deny")
    app = import_app(app_path)
    target = open_target(store_url, key_env)
    runner = app.runner(target.store, target.keys)
    result = target.run(lambda: _resume(runner, app, run_id, approve, note))
    decided = "approved" if approve else "denied"
    echo(f"run {printable(run_id)}: {decided}; now {paint(str(result.status))} at step {result.step}")
    if result.status == "paused":
        echo("waiting again for: " + printable(", ".join(f"{p.tool} ({p.call_id})" for p in result.pending)))
    if result.status == "failed" and approve:
        raise _errors.ProblemsFound(f"run {run_id!r} failed: {result.error}")
    if result.status == "failed":
        echo(f"the flow ended the run on the denial: {printable(result.error or '')}")
