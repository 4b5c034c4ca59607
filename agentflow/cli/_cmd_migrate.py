"""``agentflow migrate``: move an unfinished run onto another version of its flow.

For a run whose version is no longer deployed (``runs list --app`` marks it ``needs
migration``), or one an operator moves on purpose. The move is a signed ``migrate`` claim
naming the operator (``--as``) and both versions, saved under the run's lease; the state is
mapped by ``--state MODULE:FUNCTION`` (a function of the old state's JSON form that returns
the new state) and validated against the target version. Here, the claim is saved and, with
``--run``, the run goes on in this process; else the next recovery (a worker's sweep, or
``agentflow recover``) carries it on. Through ``--workers``, a message sends a worker of the
target version to carry it on, and the command waits for the run to settle.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import click

from agentflow._app import import_attribute
from agentflow._display import printable
from agentflow._errors import FlowError
from agentflow.cli import _errors
from agentflow.cli._acting import Acting, acting
from agentflow.cli._apps import search_cwd
from agentflow.cli._text import echo, paint

StateMap = Callable[[dict[str, Any]], Any]


def _state_function(path: str | None) -> StateMap | None:
    """The function ``--state`` names (None when not given)."""
    if path is None:
        return None
    search_cwd()
    try:
        found, module, attr = import_attribute(path, "--state", "my_company.migrations:tickets_1_to_2")
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if not callable(found):
        raise click.BadParameter(f"{attr!r} in {module!r} is not a function of the old state")
    fn: StateMap = found
    return fn


@click.command("migrate")
@click.argument("run_id")
@click.option("--to", "to_version", metavar="VERSION", help="The version to move to (default: the newest).")
@click.option("--at", "at_node", metavar="NODE", help="The node to go on from (default: where the run was).")
@click.option("--state", "state_path", metavar="MODULE:FUNCTION", help="Maps the old state (JSON) to the new one.")
@click.option("--run", "run_here", is_flag=True, help="Carry the run on here (else only the move is saved).")
@acting()
def migrate(
    how: Acting, run_id: str, to_version: str | None, at_node: str | None, state_path: str | None, run_here: bool
) -> None:
    """Move RUN_ID, unfinished, onto another version of its flow (signed; the old checkpoints stay)."""
    state = _state_function(state_path)
    if how.workers is not None:
        if run_here:
            raise click.UsageError("--run carries the run on in this process; with --workers a worker does")
        workers = how.workers

        async def through() -> tuple[int, Any]:
            try:
                step = await workers.client.migrate(
                    run_id, to_version=to_version, state=state, at=at_node, operator=how.operator
                )
            except FlowError as exc:
                raise _errors.CliError(str(exc)) from None
            return step, await workers.settle(run_id)

        step, settled = workers.run(through)
        if settled is None:
            echo(f"run {printable(run_id)}: migrated at step {step}; a worker carries it on")
            return
        workers.check(settled)
        report = settled.report
        echo(
            f"run {printable(run_id)}: migrated to version {printable(report.version or '?')}; now "
            f"{paint(report.status)} at step {report.step} (by {settled.saved_by})"
        )
        _errors.raise_if_failed(run_id, report.status, report.error)
        return
    here = how.here()

    async def act() -> tuple[str, str, int | None, str | None]:
        try:
            async with here.moving() if run_here else contextlib.nullcontext():  # without --run: the claim only
                result = await here.runs.migrate(  # a tool loop or an agent run refuses: it has no versions
                    run_id,
                    to_version=to_version,
                    state=state,
                    at=at_node,
                    operator=how.operator,
                    max_supersteps=None if run_here else 0,
                )
        except FlowError as exc:
            raise _errors.CliError(str(exc)) from None
        return result.version or "?", str(result.status), result.step, result.error

    version, status, at_step, error = here.target.run(act)
    goes_on = "" if run_here else "; the next recovery carries it on (agentflow recover, or a worker's sweep)"
    now = f"{paint(status)} at step {at_step}"
    echo(f"run {printable(run_id)}: migrated to version {printable(version)}, {now}{goes_on}")
    _errors.raise_if_failed(run_id, status, error)
