"""``agentflow recover`` and ``agentflow resume``: act on stored runs with the app's flows and tools.

Both run the tools in this process, exactly as a worker would, holding each run's lease
while they act on it (as ``cli@<host>:<pid>``); a run a live worker holds is left alone.
Each decision they sign names its operator: ``--as NAME``, else ``$AGENTFLOW_OPERATOR``,
else the login name.
"""

from __future__ import annotations

import getpass
import sys
from collections.abc import Callable
from typing import Any, Final, TypeVar

import click

from agentflow._app import FlowApp
from agentflow._display import printable, short, when
from agentflow._errors import (
    AgentflowError,
    CheckpointConflict,
    CheckpointStoreCorrupt,
    FlowError,
    IdentityMismatch,
    RecoveryNeedsDecision,
    RunHeld,
)
from agentflow._run_types import RunKind
from agentflow.cli import _errors
from agentflow.cli._apps import import_app
from agentflow.cli._target import Target, open_target, store_options
from agentflow.cli._text import echo, paint, table
from agentflow.exec._run_lease import held_by, process_owner
from agentflow.flow._graph import Flow
from agentflow.flow._result import RunResult
from agentflow.flow._runner import FlowRunner

F = TypeVar("F", bound=Callable[..., object])

#: Outcomes that leave a run in good hands (a held run is live on its worker).
FINE = ("done", "paused", "held")
#: Where ``--as`` is read from when it is not given.
OPERATOR_ENV: Final = "AGENTFLOW_OPERATOR"
#: The longest operator name taken.
MAX_OPERATOR: Final = 200


def default_operator() -> str:
    """``--as`` when not given: the login name (``$AGENTFLOW_OPERATOR`` is read by click first)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name (a container without one): the runner's own name is used
        return ""


def _check_operator(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    name = value.strip()
    if not name and value:
        raise click.BadParameter("give a name (it is signed into each decision)")
    if len(name) > MAX_OPERATOR or not name.isprintable():
        raise click.BadParameter(f"a name of at most {MAX_OPERATOR} printable characters, please")
    return name


def operator_option(fn: F) -> F:
    """Add ``--as NAME``: who decides, signed into the decisions the command stores."""
    return click.option(
        "--as",
        "operator",
        metavar="NAME",
        envvar=OPERATOR_ENV,
        default=default_operator,
        show_default=f"${OPERATOR_ENV}, else your login name",
        callback=_check_operator,
        help=f"Who decides: signed into each decision this command stores (env: {OPERATOR_ENV}).",
    )(fn)


def _runner(app: FlowApp, target: Target) -> FlowRunner:
    """The app's runner over the target, holding runs as this command (``cli@<host>:<pid>``)."""
    return app.runner(target.store, target.keys, owner=process_owner("cli"))


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
    if isinstance(result, RunHeld):
        return "held", f"held by {result.owner} until {when(result.expires_at)}: live on that worker, left alone"
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


async def _recover_each(
    runner: FlowRunner, flow: Flow[Any], rerun: bool, operator: str | None
) -> dict[str, tuple[str, str]]:
    assert runner.checkpoints is not None
    run_ids = list(await runner.checkpoints.list_unfinished(flow.name))
    outcomes: dict[str, tuple[str, str]] = {}
    if not run_ids:
        return outcomes
    # A run a live worker holds is left alone (a lease taken later is refused by recover, the same way).
    for run_id, lease in (await held_by(runner.checkpoints, run_ids)).items():
        outcomes[run_id] = outcome(RunHeld(run_id, lease.owner, lease.expires_at))
    label = f"recovering {len(run_ids)} run(s) of {printable(flow.name)}"
    with click.progressbar(run_ids, label=label, file=sys.stderr) as bar:
        for run_id in bar:
            if run_id in outcomes:
                continue
            try:
                result = await runner.recover(flow, run_id, rerun_in_doubt=rerun, operator=operator)
                outcomes[run_id] = outcome(result)
            except AgentflowError as exc:  # reported per run: one difficult run must not stop the others
                outcomes[run_id] = outcome(exc)
    return {run_id: outcomes[run_id] for run_id in run_ids}


@click.command("recover")
@store_options
@click.argument("flow_name", metavar="FLOW")
@click.option("--app", "app_path", required=True, metavar="MODULE:ATTR", help="The FlowApp with the flow and tools.")
@click.option("--rerun-in-doubt", is_flag=True, help="Run calls in doubt again (check them at their system first).")
@operator_option
def recover(store_url: str, key_env: str, flow_name: str, app_path: str, rerun_in_doubt: bool, operator: str) -> None:
    """Recover every unfinished run of FLOW, as a worker does on start-up (runs live on a worker are left alone)."""
    app, flow = _flow(app_path, flow_name)
    target = open_target(store_url, key_env)
    runner = _runner(app, target)
    outcomes = target.run(lambda: _recover_each(runner, flow, rerun_in_doubt, operator or None))
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
    held = sum(1 for what, _ in outcomes.values() if what == "held")
    if held:
        echo(f"{held} run(s) are live on their workers and were left alone")
    stuck = [run_id for run_id, (what, _) in outcomes.items() if what not in FINE]
    if stuck:
        raise _errors.ProblemsFound(f"{len(stuck)} of {len(outcomes)} run(s) were not recovered")


async def _resume(
    runner: FlowRunner, app: FlowApp, run_id: str, approve: bool, note: str | None, operator: str | None
) -> RunResult[Any]:
    assert runner.checkpoints is not None and runner.sealer is not None
    row = await runner.checkpoints.latest(run_id)
    runner.sealer.open_checkpoint(row, run_id)  # the flow name is trusted only once the row checks
    if RunKind.of(row.flow) is RunKind.LOOP:
        raise _errors.CliError(f"run {run_id!r} is a tool loop; resume it with run_tool_loop and the same run_id")
    try:
        flow = app.flow(row.flow)
    except FlowError as exc:
        raise _errors.CliError(str(exc)) from None
    result: RunResult[Any] = await runner.resume(flow, run_id, approve=approve, note=note, operator=operator)
    return result


@click.command("resume")
@store_options
@click.argument("run_id")
@click.option("--app", "app_path", required=True, metavar="MODULE:ATTR", help="The FlowApp with the run's flow.")
@click.option("--approve/--deny", "approve", default=None, help="The decision for every pending call.")
@click.option("--note", help="A note stored with the decision.")
@operator_option
def resume(
    store_url: str, key_env: str, run_id: str, app_path: str, approve: bool | None, note: str | None, operator: str
) -> None:
    """Approve or deny the pending calls of a paused run, and carry the run on."""
    if approve is None:
        raise click.UsageError("say --approve or --deny")
    app = import_app(app_path)
    target = open_target(store_url, key_env)
    runner = _runner(app, target)
    result = target.run(lambda: _resume(runner, app, run_id, approve, note, operator or None))
    decided = "approved" if approve else "denied"
    echo(f"run {printable(run_id)}: {decided}; now {paint(str(result.status))} at step {result.step}")
    if result.status == "paused":
        echo("waiting again for: " + printable(", ".join(f"{p.tool} ({p.call_id})" for p in result.pending)))
    if result.status == "failed" and approve:
        raise _errors.ProblemsFound(f"run {run_id!r} failed: {result.error}")
    if result.status == "failed":
        echo(f"the flow ended the run on the denial: {printable(result.error or '')}")
