"""``agentflow decide``, ``retry``, ``cancel`` and ``fork``: an operator's actions on one run.

Each holds the run's lease while it acts (a run a live worker holds is refused, naming
the holder; ``cancel`` asks the holder instead) and signs what it decides with the
operator's name (``--as``). Here, ``decide`` stores the word on each call in doubt for
the next recovery (a worker, or ``agentflow recover``) to spend; ``retry`` runs the run on
in this process; ``fork`` saves the new run's step 0 and, unless ``--run``, leaves it for a
worker. Through ``--workers``, what is decided is saved the same way and a message sends a
worker to act on it (``decide``, ``retry``, ``fork``); the command waits for the run to
settle and says where it landed. A run that ends failed after ``retry``, or after ``decide``
through the workers, exits 1 (`_errors.raise_if_failed`, the rule an approving ``resume``
follows too). ``cancel`` ends a run nobody holds at once, and leaves
a live worker a signed request it honours before its next call (through ``--workers``,
the command waits for it).
"""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING, Any

import click

from agentflow._display import printable
from agentflow._errors import UnstorableValue
from agentflow.cli import _errors
from agentflow.cli._acting import Acting, Here, acting
from agentflow.cli._text import echo, paint
from agentflow.exec.run.control import DidNotHappen, Happened, InDoubtDecision, Rerun
from agentflow.exec.seal import loads_storable

if TYPE_CHECKING:
    from agentflow.cli._workers import Settled, Workers


def parse_word(text: str) -> tuple[str, InDoubtDecision]:
    """One ``--call`` value: ``CALL_ID=rerun``, ``CALL_ID=happened:JSON`` or ``CALL_ID=not[:REASON]``.

    Raises:
        click.BadParameter: the value does not have one of those forms, or its JSON does not parse.
    """
    call_id, sep, word = text.partition("=")
    if not sep or not call_id:
        raise click.BadParameter(f"{text!r}: write CALL_ID=rerun, CALL_ID=happened:JSON or CALL_ID=not:REASON")
    kind, _, rest = word.partition(":")
    if kind == "rerun" and not rest:
        return call_id, Rerun()
    if kind == "happened":
        try:
            return call_id, Happened(loads_storable(rest, f"the result of call {call_id}"))
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"{text!r}: the result after happened: must be JSON ({exc})") from None
        except UnstorableValue as exc:
            raise click.BadParameter(str(exc)) from None
    if kind == "not":
        return call_id, DidNotHappen(rest)
    raise click.BadParameter(f"{text!r}: say rerun, happened:JSON or not:REASON after the =")


def _where(settled: Settled) -> str:
    """Where a run the workers moved landed: its status and step, and which worker moved it last."""
    report = settled.report
    return f"now {paint(report.status)} at step {report.step} (by {settled.saved_by})"


async def _cancel_here(here: Here, run_id: str, reason: str, operator: str | None) -> str:
    return str((await here.runs.cancel(run_id, reason=reason, operator=operator)).status)


@click.command("cancel")
@click.argument("run_id")
@click.option("--reason", required=True, help="Why the run is cancelled (signed into it).")
@acting()
def cancel(how: Acting, run_id: str, reason: str) -> None:
    """Cancel a run: it ends cancelled and is never recovered (a live worker's run, before its next call)."""
    said = f"run {printable(run_id)}: {paint('cancelled')} ({printable(reason)})"
    if how.workers is not None:
        workers = how.workers

        async def act() -> tuple[str, Settled | None]:
            status = await workers.client.cancel(run_id, reason=reason, operator=how.operator)
            return status, None if status == "cancelled" else await workers.settle(run_id)

        status, settled = workers.run(act)
        if settled is not None:
            workers.check(settled)
            if settled.report.status != "cancelled":  # the run ended before its worker looked for the request
                raise _errors.ProblemsFound(f"run {run_id!r} was not cancelled: it ended {settled.report.status} first")
            echo(f"{said} by the worker that held it: {_where(settled)}")
            return
    else:
        here = how.here()
        status = here.target.run(lambda: _cancel_here(here, run_id, reason, how.operator))
    if status == "cancelled":
        echo(said)
        return
    # A live worker holds the run: the cancel is a request it honours before its next call.
    echo(
        f"run {printable(run_id)}: cancel requested ({printable(reason)}); the live worker that holds it ends it "
        f"before its next call (it is {paint(status)} now)"
    )


@click.command("decide")
@click.argument("run_id")
@click.option(
    "--call",
    "words",
    multiple=True,
    metavar="CALL_ID=WORD",
    help="Per call in doubt: CALL_ID=rerun, CALL_ID=happened:JSON (its result) or CALL_ID=not:REASON.",
)
@click.option("--rerun-all", is_flag=True, help="Rerun every call in doubt (checked at their systems first).")
@acting()
def decide(how: Acting, run_id: str, words: tuple[str, ...], rerun_all: bool) -> None:
    """Say what happened to the calls in doubt of a run; the next recovery acts on it (--workers: a worker, now)."""
    if bool(words) == rerun_all:
        raise click.UsageError("say --call CALL_ID=... for each call in doubt, or --rerun-all")
    calls = dict(parse_word(w) for w in words) if words else None
    if how.workers is not None:
        _decide_through(how.workers, run_id, calls, how.operator)
        return
    here = how.here()
    step = here.target.run(lambda: _decide_here(here, run_id, calls, how.operator))
    echo(f"run {printable(run_id)}: decision stored at step {step}; recover the run (or let a worker) to act on it")


async def _decide_here(here: Here, run_id: str, calls: dict[str, InDoubtDecision] | None, operator: str | None) -> int:
    try:  # the decision waits for the next recovery (a worker, or `agentflow recover`)
        return await here.runs.decide_in_doubt(run_id, calls=calls, operator=operator)
    except ValueError as exc:
        raise _errors.CliError(str(exc)) from None


def _decide_through(
    workers: Workers, run_id: str, calls: dict[str, InDoubtDecision] | None, operator: str | None
) -> None:
    async def act() -> tuple[int, Settled | None]:
        step = await workers.client.decide_in_doubt(run_id, calls=calls, operator=operator)
        return step, await workers.settle(run_id)

    step, settled = workers.run(act)
    said = f"run {printable(run_id)}: decision stored at step {step}"
    if settled is None:
        echo(f"{said}; a worker acts on it")
        return
    workers.check(settled)
    echo(f"{said}; a worker acted on it: {_where(settled)}")
    _errors.raise_if_failed(run_id, settled.report.status, settled.report.error)


@click.command("retry")
@click.argument("run_id")
@acting()
def retry(how: Acting, run_id: str) -> None:
    """Run a failed run again from the superstep that failed (its failed calls run again, here or on a worker)."""
    if how.workers is not None:
        workers = how.workers

        async def enqueue() -> tuple[int, Settled | None]:
            step = await workers.client.retry(run_id, operator=how.operator)
            return step, await workers.settle(run_id)

        step, settled = workers.run(enqueue)
        if settled is None:
            echo(f"run {printable(run_id)}: retry stored at step {step}; a worker runs it")
            return
        workers.check(settled)
        status, error, where = settled.report.status, settled.report.error, _where(settled)
    else:
        here = how.here()

        async def act() -> tuple[str, int | None, str | None]:
            async with here.moving():
                acted = await here.runs.retry(run_id, operator=how.operator)
            return str(acted.status), acted.step, acted.error

        status, step_now, error = here.target.run(act)
        where = f"now {paint(status)} at step {step_now}"
    echo(f"run {printable(run_id)}: retried; {where}")
    _errors.raise_if_failed(run_id, status, error, again=True)


def _patch(patch: str | None) -> dict[str, Any] | None:
    if patch is None:
        return None
    try:
        fields = loads_storable(patch, "--patch")
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"--patch must be a JSON object ({exc})") from None
    except UnstorableValue as exc:
        raise click.BadParameter(str(exc)) from None
    if not isinstance(fields, dict):
        raise click.BadParameter("--patch must be a JSON object of state fields")
    return fields


@click.command("fork")
@click.argument("run_id")
@click.option("--at", "at_step", type=int, required=True, help="The checkpoint (step) to start from.")
@click.option("--patch", help="A JSON object of state fields to change (a flow run's; a loop or an agent takes none).")
@click.option("--new-id", "new_run_id", help="The new run's id (unguessable by default).")
@click.option("--run", "run_here", is_flag=True, help="Run the new run here (else only its step 0 is saved).")
@acting()
def fork(how: Acting, run_id: str, at_step: int, patch: str | None, new_run_id: str | None, run_here: bool) -> None:
    """Start a new run from a checkpoint of RUN_ID, with its history up to there (the old run is not touched).

    Any run forks: a flow run from that checkpoint's state (changed by --patch), a tool loop or
    an agent run from that stage's messages.
    """
    fields = _patch(patch)
    forked = f"forked from {printable(run_id)} at step {at_step}"
    if how.workers is not None:
        if run_here:
            raise click.UsageError("--run runs the new run in this process; with --workers a worker runs it")
        new_id, settled = _fork_through(how.workers, run_id, at_step, fields, new_run_id, how.operator)
        if settled is None:
            echo(f"run {printable(new_id)} {forked}: a worker runs it")
            return
        how.workers.check(settled)
        echo(f"run {printable(new_id)} {forked}: {_where(settled)}")
        _errors.raise_if_failed(new_id, settled.report.status, settled.report.error)
        return
    here = how.here()

    async def act() -> tuple[str, str, int | None, str | None]:
        limit = None if run_here else 0  # without --run: step 0 only
        async with here.moving() if run_here else contextlib.nullcontext():
            acted = await here.runs.fork(
                run_id,
                at_step=at_step,
                new_run_id=new_run_id,
                patch=fields,
                operator=how.operator,
                max_supersteps=limit,
            )
        return acted.run_id, str(acted.status), acted.step, acted.error

    new_id, status, step, error = here.target.run(act)
    echo(f"run {printable(new_id)} {forked}: {paint(status)} at step {step}")
    _errors.raise_if_failed(new_id, status, error)


def _fork_through(
    workers: Workers,
    run_id: str,
    at_step: int,
    fields: dict[str, Any] | None,
    new_run_id: str | None,
    operator: str | None,
) -> tuple[str, Settled | None]:
    async def act() -> tuple[str, Settled | None]:
        new_id = await workers.client.fork(
            run_id, at_step=at_step, new_run_id=new_run_id, patch=fields, operator=operator
        )
        return new_id, await workers.settle(new_id)

    return workers.run(act)
