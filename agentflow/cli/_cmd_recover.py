"""``agentflow recover``: carry on runs whose worker died, named one by one or every unfinished run of a flow.

``recover RUN_ID...`` acts on the runs named and on no other. ``recover --flow FLOW`` lists
the flow's unfinished runs first, then asks before it acts (``--yes`` does not ask; with no
terminal to ask on, it refuses without ``--yes``). Here, each run is recovered in this
process and its tools run here; through ``--workers``, each run's recovery is enqueued for
a worker (`FlowClient.recover`) and the command waits for the runs to settle. Either way a
run a live worker holds is reported ``held`` and left alone (no failure), and the summary
says what became of each run.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import click

from agentflow._app import FlowApp
from agentflow._display import printable, short, when
from agentflow._errors import (
    AgentflowError,
    CheckpointConflict,
    CheckpointNotFound,
    CheckpointStoreCorrupt,
    FlowError,
    IdentityMismatch,
    RecoveryNeedsDecision,
    RunHeld,
    VersionNotDeployed,
)
from agentflow._hints import decide_hint
from agentflow.cli import _errors
from agentflow.cli._acting import Acting, Here, acting
from agentflow.cli._cmd_runs import list_row
from agentflow.cli._text import echo, table
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.run.cursor import RunOutcome
from agentflow.exec.run.lease import held_by
from agentflow.exec.run.read import read_run
from agentflow.exec.seal import Sealer

if TYPE_CHECKING:
    from agentflow.cli._workers import Settled, Workers

#: Outcomes that leave a run in good hands (a held run is live on its worker; an enqueued one is a worker's).
FINE = ("done", "paused", "held", "enqueued")
#: Each run's ``(outcome, detail)``, in the order the runs were named or listed.
Outcomes = dict[str, tuple[str, str]]


def outcome(result: RunOutcome | BaseException) -> tuple[str, str]:
    """``(outcome, detail)`` of one run recovered here, for the summary table."""
    if isinstance(result, RecoveryNeedsDecision):
        return "needs a decision", "in doubt: " + "; ".join(f"{tool} ({why})" for tool, why in result.calls)
    if isinstance(result, IdentityMismatch):
        return "needs its principal", str(result)
    if isinstance(result, RunHeld):
        return "held", f"held by {result.owner} until {when(result.expires_at)}: live on that worker, left alone"
    if isinstance(result, VersionNotDeployed):
        return "needs migration", str(result)
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


def settled_outcome(settled: Settled) -> tuple[str, str]:
    """``(outcome, detail)`` of one run a worker recovered, as the read model shows it once settled."""
    report = settled.report
    if report.corrupt:
        return "CORRUPT", report.problems[0]
    if settled.timed_out:
        return "still running", f"at step {report.step} when the wait ended; the workers carry it on"
    if report.awaiting:
        return "needs a decision", "in doubt: " + "; ".join(f"{tool} ({why})" for tool, why in report.awaiting)
    if report.status == "failed":
        return "failed", report.error or ""
    if report.status == "paused":
        return "paused", "waiting for approval: " + ", ".join(str(p.get("tool")) for p in report.pending)
    detail = f"by {settled.saved_by}"
    if report.recoveries:
        last = report.recoveries[-1]
        detail += f": replayed {len(last.replayed)} call(s), reran {len(last.rerun)}"
    return report.status, detail


async def _recover_here(
    here: Here, run_ids: Sequence[str], flow_name: str | None, rerun: bool, operator: str | None
) -> Outcomes:
    label = f"recovering {len(run_ids)} run(s)" + (f" of {printable(flow_name)}" if flow_name else "")
    # A run a live worker holds is left alone (a lease taken later is refused by recover, the same way).
    held = await held_by(here.target.store, run_ids)
    outcomes = {run_id: outcome(RunHeld(run_id, lease.owner, lease.expires_at)) for run_id, lease in held.items()}
    # On a terminal the bar names the run under way; in a log (no bar drawn), a line per run and per change says it.
    lines = contextlib.nullcontext() if here.progress.terminal else here.moving()
    with click.progressbar(run_ids, label=label, file=sys.stderr, item_show_func=_shown) as bar:
        async with lines:
            for run_id in bar:
                if run_id in outcomes:
                    continue
                try:
                    outcomes[run_id] = await _recover_one(here, run_id, rerun, operator)
                except AgentflowError as exc:  # reported per run: one difficult run must not stop the others
                    outcomes[run_id] = outcome(exc)
    return {run_id: outcomes[run_id] for run_id in run_ids}


def _shown(run_id: str | None) -> str | None:
    """The run the bar is at, escaped (the bar writes it as it is)."""
    return None if run_id is None else printable(run_id)


async def _recover_one(here: Here, run_id: str, rerun: bool, operator: str | None) -> tuple[str, str]:
    # A flow run, a tool loop or an agent run: its column is trusted once checked.
    return outcome(await here.runs.recover(run_id, rerun_in_doubt=rerun, operator=operator))


async def _recover_through(workers: Workers, run_ids: Sequence[str], rerun: bool, operator: str | None) -> Outcomes:
    outcomes: Outcomes = {}
    moved: list[str] = []
    for run_id in run_ids:
        try:
            step = await workers.client.recover(run_id, rerun_in_doubt=rerun, operator=operator)
        except AgentflowError as exc:  # held (left alone), ended, corrupt: reported per run
            outcomes[run_id] = outcome(exc)
            continue
        if workers.wait:
            moved.append(run_id)
        elif step is None:
            outcomes[run_id] = ("paused", "waiting for approval: resume it (nothing was enqueued)")
        else:
            cause = "a signed rerun of its calls in doubt" if rerun else "a recovery"
            outcomes[run_id] = ("enqueued", f"{cause} from step {step}: a worker carries it on")
    for run_id, settled in zip(moved, await asyncio.gather(*(workers.settle(r) for r in moved)), strict=True):
        assert settled is not None
        outcomes[run_id] = settled_outcome(settled)
    return {run_id: outcomes[run_id] for run_id in run_ids}


def _can_ask() -> bool:
    """Whether a person can answer the question (stdin is a terminal)."""
    return sys.stdin.isatty()


async def _flow_runs(store: CheckpointStore, sealer: Sealer, flows: FlowApp, flow_name: str, yes: bool) -> list[str]:
    """The unfinished runs of the flow, listed, once the operator said to go ahead (none: nothing to do)."""
    try:
        flow = flows.flow(flow_name)
    except FlowError as exc:
        raise _errors.CliError(str(exc)) from None
    run_ids = list(await store.list_unfinished(flow.name))
    if not run_ids:
        echo(f"no unfinished runs of flow {flow_name!r}")
        return []
    reports = []
    for run_id in run_ids:
        try:
            reports.append(await read_run(store, sealer, run_id))
        except CheckpointNotFound:
            continue  # deleted since it was listed
    echo(table(["run", "flow", "status", "step", "updated", "marks"], [list_row(r) for r in reports], colour=2))
    count = f"{len(reports)} unfinished run(s) of {printable(flow_name)}"
    if yes:
        return [r.run_id for r in reports]
    if not _can_ask():
        raise _errors.CliError(f"recover --flow acts on the {count} listed: say --yes to go ahead (no terminal to ask)")
    if not await asyncio.to_thread(click.confirm, f"Recover the {count} listed?", default=False, err=True):
        echo("nothing was recovered")
        return []
    return [r.run_id for r in reports]


async def _named_runs(store: CheckpointStore, flows: FlowApp, run_ids: Sequence[str]) -> list[str]:
    """The runs named, each once, once each is known to be stored (a typo acts on none)."""
    named = list(dict.fromkeys(run_ids))
    for run_id in named:
        try:
            await store.latest(run_id)
        except CheckpointNotFound:
            hint = f" (for the unfinished runs of flow {run_id!r}: --flow {run_id})" if run_id in flows.flows else ""
            raise _errors.CliError(f"no run {run_id!r} in this store{hint}") from None
    return named


def _summary(outcomes: Outcomes, workers: str | None) -> None:
    rows = [[run_id, what, short(detail, 100)] for run_id, (what, detail) in outcomes.items()]
    echo(table(["run", "outcome", "detail"], rows, colour=1))
    for run_id, (what, _) in outcomes.items():
        if what == "needs a decision":
            hint = printable(decide_hint(run_id, workers=workers))
            echo(
                f"run {printable(run_id)}: check its calls in doubt at their systems (agentflow runs show), then {hint}"
            )
    held = sum(1 for what, _ in outcomes.values() if what == "held")
    if held:
        echo(f"{held} run(s) are live on their workers and were left alone")
    enqueued = sum(1 for what, _ in outcomes.values() if what == "enqueued")
    if enqueued:
        echo(f"{enqueued} run(s) enqueued for the workers (agentflow runs show RUN_ID follows each)")
    stuck = [run_id for run_id, (what, _) in outcomes.items() if what not in FINE]
    if stuck:
        raise _errors.ProblemsFound(f"{len(stuck)} of {len(outcomes)} run(s) were not recovered")


@click.command("recover")
@click.argument("run_ids", nargs=-1, metavar="[RUN_ID]...")
@click.option("--flow", "flow_name", metavar="FLOW", help="Every unfinished run of FLOW: listed, then asks.")
@click.option("--yes", "-y", is_flag=True, help="With --flow: act on the runs listed without asking.")
@click.option("--rerun-in-doubt", is_flag=True, help="Run calls in doubt again (check them at their system first).")
@acting()
def recover(how: Acting, run_ids: tuple[str, ...], flow_name: str | None, yes: bool, rerun_in_doubt: bool) -> None:
    """Recover runs whose worker died: each RUN_ID, or with --flow every unfinished run of FLOW.

    Runs a live worker holds are left alone. Here the tools run in this process; with
    --workers the recoveries are enqueued for the workers, and the command waits for them.
    """
    if bool(run_ids) == bool(flow_name):
        raise click.UsageError("name the runs to recover (RUN_ID...), or --flow FLOW for every unfinished run of FLOW")
    act: Callable[[list[str]], Awaitable[Outcomes]]
    run: Callable[[Callable[[], Awaitable[Outcomes | None]]], Outcomes | None]
    if how.workers is not None:
        workers = how.workers
        store, sealer, flows = workers.store, workers.sealer, workers.client.flow_app
        run = workers.run

        def act(ids: list[str]) -> Awaitable[Outcomes]:
            return _recover_through(workers, ids, rerun_in_doubt, how.operator)

    else:
        here = how.here()
        store, sealer, flows = here.target.store, here.target.sealer, here.app
        run = here.target.run

        def act(ids: list[str]) -> Awaitable[Outcomes]:
            return _recover_here(here, ids, flow_name, rerun_in_doubt, how.operator)

    async def job() -> Outcomes | None:
        if flow_name:
            chosen = await _flow_runs(store, sealer, flows, flow_name, yes)
        else:
            chosen = await _named_runs(store, flows, run_ids)
        return await act(chosen) if chosen else None

    outcomes = run(job)
    if outcomes:
        _summary(outcomes, how.workers_path)
