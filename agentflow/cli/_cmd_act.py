"""``agentflow resume``: approve or deny the pending calls of a paused run, and carry the run on.

Here, the run goes on in this process (its tools run here), holding its lease as
``cli@<host>:<pid>``; through ``--workers``, the decision is a signed claim saved here and a
worker carries the run on, while the command waits for it. A run a live worker holds is
refused (the `RunHeld` line, exit 2). The decision names its operator (``--as``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

from agentflow._display import printable
from agentflow.cli import _errors
from agentflow.cli._acting import Acting, Here, acting
from agentflow.cli._text import echo, paint
from agentflow.exec.run.cursor import RunOutcome

if TYPE_CHECKING:
    from agentflow.cli._workers import Settled, Workers


async def _resume_here(here: Here, run_id: str, approve: bool, note: str | None, operator: str | None) -> RunOutcome:
    async with here.moving():
        return await here.runs.resume(run_id, approve=approve, note=note, operator=operator)


def _landed(
    run_id: str, approve: bool, status: str, step: int | None, pending: Sequence[str], error: str | None, where: str
) -> None:
    """Say where the run landed after the decision; a run that failed after an approval is a problem found."""
    decided = "approved" if approve else "denied"
    echo(f"run {printable(run_id)}: {decided}; now {paint(status)} at step {step}{where}")
    if status == "paused":
        echo("waiting again for: " + printable(", ".join(pending)))
    if approve:
        _errors.raise_if_failed(run_id, status, error)
    elif status == "failed":  # the operator's own denial ended it: what was asked for, not a problem
        echo(f"the flow ended the run on the denial: {printable(error or '')}")


def _resume_through(workers: Workers, run_id: str, approve: bool, note: str | None, operator: str | None) -> None:
    async def act() -> tuple[int, Settled | None]:
        step = await workers.client.resume(run_id, approve=approve, note=note, operator=operator)
        return step, await workers.settle(run_id)

    step, settled = workers.run(act)
    if settled is None:
        decided = "approved" if approve else "denied"
        echo(f"run {printable(run_id)}: {decided}; the decision is stored at step {step}, a worker carries the run on")
        return
    workers.check(settled)
    report = settled.report
    pending = [f"{p.get('tool')} ({p.get('call_id')})" for p in report.pending]
    _landed(run_id, approve, report.status, report.step, pending, report.error, f" (by {settled.saved_by})")


@click.command("resume")
@click.argument("run_id")
@click.option("--approve/--deny", "approve", default=None, help="The decision for every pending call.")
@click.option("--note", help="A note stored with the decision.")
@acting()
def resume(how: Acting, run_id: str, approve: bool | None, note: str | None) -> None:
    """Approve or deny the pending calls of a paused run, and carry the run on (here, or on the workers)."""
    if approve is None:
        raise click.UsageError("say --approve or --deny")
    if how.workers is not None:
        _resume_through(how.workers, run_id, approve, note, how.operator)
        return
    here = how.here()
    result = here.target.run(lambda: _resume_here(here, run_id, approve, note, how.operator))
    pending = [f"{p.tool} ({p.call_id})" for p in result.pending]
    _landed(run_id, approve, str(result.status), result.step, pending, result.error, "")
