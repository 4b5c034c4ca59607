"""``agentflow decide``, ``retry``, ``cancel`` and ``fork``: an operator's actions on one run.

Each holds the run's lease while it acts (a run a live worker holds is refused, naming
the holder), signs what it decides with the operator's name (``--as``), and runs no tool:
``decide`` stores the word on each call in doubt for the next recovery (a worker, or
``agentflow recover``) to spend; ``fork`` saves the new run's step 0 and, unless
``--run``, leaves it for a worker.
"""

from __future__ import annotations

import json
from typing import Any

import click

from agentflow._app import FlowApp
from agentflow._display import printable
from agentflow._errors import FlowError
from agentflow._run_types import RunKind
from agentflow.cli import _errors
from agentflow.cli._apps import import_app
from agentflow.cli._cmd_act import _runner, operator_option
from agentflow.cli._target import Target, open_target, store_options
from agentflow.cli._text import echo, paint
from agentflow.exec._durable_loop import cancel_tool_loop, decide_in_doubt_tool_loop
from agentflow.exec._run_control import DidNotHappen, Happened, InDoubtDecision, Rerun
from agentflow.flow._graph import Flow
from agentflow.flow._runner import FlowRunner

_APP = click.option("--app", "app_path", required=True, metavar="MODULE:ATTR", help="The FlowApp with the run's flow.")


async def _column(runner: FlowRunner, run_id: str) -> str:
    """The run's stored flow column, trusted only once its latest row checks."""
    assert runner.checkpoints is not None and runner.sealer is not None
    row = await runner.checkpoints.latest(run_id)
    runner.sealer.open_checkpoint(row, run_id)
    return row.flow


def _flow(app: FlowApp, column: str) -> Flow[Any]:
    try:
        return app.flow(column)
    except FlowError as exc:
        raise _errors.CliError(str(exc)) from None


def _loop_registry(app: FlowApp, name: str) -> Any:
    spec = app.loops.get(name)
    if spec is None:
        raise _errors.CliError(
            f"the app has no tool loop {name!r} (registered: {', '.join(sorted(app.loops)) or 'none'})"
        )
    return spec.registry


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
            return call_id, Happened(json.loads(rest))
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"{text!r}: the result after happened: must be JSON ({exc})") from None
    if kind == "not":
        return call_id, DidNotHappen(rest)
    raise click.BadParameter(f"{text!r}: say rerun, happened:JSON or not:REASON after the =")


@click.command("cancel")
@store_options
@click.argument("run_id")
@_APP
@click.option("--reason", required=True, help="Why the run is cancelled (signed into it).")
@operator_option
def cancel(store_url: str, key_env: str, run_id: str, app_path: str, reason: str, operator: str) -> None:
    """Cancel a paused or stranded run: it ends ``cancelled`` and is never recovered."""
    app = import_app(app_path)
    target = open_target(store_url, key_env)
    runner = _runner(app, target)

    async def act() -> str:
        column = await _column(runner, run_id)
        if RunKind.of(column) is RunKind.LOOP:
            loop = await cancel_tool_loop(
                run_id,
                reason=reason,
                checkpoints=target.store,
                checkpoint_key=target.keys,
                operator=operator or None,
                name=RunKind.name_of(column),
                owner=runner.ownership.owner,
            )
            return str(loop.status)
        result = await runner.cancel(_flow(app, column), run_id, reason=reason, operator=operator or None)
        return str(result.status)

    status = target.run(act)
    echo(f"run {printable(run_id)}: {paint(status)} ({printable(reason)})")


@click.command("decide")
@store_options
@click.argument("run_id")
@_APP
@click.option(
    "--call",
    "words",
    multiple=True,
    metavar="CALL_ID=WORD",
    help="Per call in doubt: CALL_ID=rerun, CALL_ID=happened:JSON (its result) or CALL_ID=not:REASON.",
)
@click.option("--rerun-all", is_flag=True, help="Rerun every call in doubt (checked at their systems first).")
@operator_option
def decide(
    store_url: str, key_env: str, run_id: str, app_path: str, words: tuple[str, ...], rerun_all: bool, operator: str
) -> None:
    """Say what happened to the calls in doubt of a run; the next recovery acts on it."""
    if bool(words) == rerun_all:
        raise click.UsageError("say --call CALL_ID=... for each call in doubt, or --rerun-all")
    calls = dict(parse_word(w) for w in words) if words else None
    app = import_app(app_path)
    target = open_target(store_url, key_env)
    runner = _runner(app, target)
    step = target.run(lambda: _decide(runner, app, target, run_id, calls, operator or None))
    echo(f"run {printable(run_id)}: decision stored at step {step}; recover the run (or let a worker) to act on it")


async def _decide(
    runner: FlowRunner,
    app: FlowApp,
    target: Target,
    run_id: str,
    calls: dict[str, InDoubtDecision] | None,
    operator: str | None,
) -> int:
    column = await _column(runner, run_id)
    try:
        if RunKind.of(column) is RunKind.LOOP:
            return await decide_in_doubt_tool_loop(
                run_id,
                checkpoints=target.store,
                checkpoint_key=target.keys,
                registry=_loop_registry(app, RunKind.name_of(column)),
                calls=calls,
                operator=operator,
                name=RunKind.name_of(column),
                owner=runner.ownership.owner,
            )
        return await runner.decide_in_doubt(_flow(app, column), run_id, calls=calls, operator=operator)
    except ValueError as exc:
        raise _errors.CliError(str(exc)) from None


@click.command("retry")
@store_options
@click.argument("run_id")
@_APP
@operator_option
def retry(store_url: str, key_env: str, run_id: str, app_path: str, operator: str) -> None:
    """Run a failed run again from the superstep that failed (its failed calls run again, here)."""
    app = import_app(app_path)
    target = open_target(store_url, key_env)
    runner = _runner(app, target)

    async def act() -> tuple[str, int | None, str | None]:
        column = await _column(runner, run_id)
        if RunKind.of(column) is RunKind.LOOP:
            raise _errors.CliError(f"run {run_id!r} is a tool loop: retrying a tool loop is not built yet")
        result = await runner.retry(_flow(app, column), run_id, operator=operator or None)
        return str(result.status), result.step, result.error

    status, step, error = target.run(act)
    echo(f"run {printable(run_id)}: retried; now {paint(status)} at step {step}")
    if status == "failed":
        raise _errors.ProblemsFound(f"run {run_id!r} failed again: {error}")


@click.command("fork")
@store_options
@click.argument("run_id")
@_APP
@click.option("--at", "at_step", type=int, required=True, help="The checkpoint (step) to start from.")
@click.option("--patch", help="A JSON object of state fields to change.")
@click.option("--new-id", "new_run_id", help="The new run's id (unguessable by default).")
@click.option("--run", "run_here", is_flag=True, help="Run the new run here (else only its step 0 is saved).")
@operator_option
def fork(
    store_url: str,
    key_env: str,
    run_id: str,
    app_path: str,
    at_step: int,
    patch: str | None,
    new_run_id: str | None,
    run_here: bool,
    operator: str,
) -> None:
    """Start a new run from a checkpoint of RUN_ID, its state patched (the old run is not touched)."""
    fields: dict[str, Any] | None = None
    if patch is not None:
        try:
            fields = json.loads(patch)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"--patch must be a JSON object ({exc})") from None
        if not isinstance(fields, dict):
            raise click.BadParameter("--patch must be a JSON object of state fields")
    app = import_app(app_path)
    target = open_target(store_url, key_env)
    runner = _runner(app, target)

    async def act() -> tuple[str, str, int | None]:
        column = await _column(runner, run_id)
        if RunKind.of(column) is RunKind.LOOP:
            raise _errors.CliError(f"run {run_id!r} is a tool loop: only flow runs can be forked")
        result = await runner.fork(
            _flow(app, column),
            run_id,
            at_step=at_step,
            new_run_id=new_run_id,
            patch=fields,
            operator=operator or None,
            max_supersteps=None if run_here else 0,
        )
        return result.run_id, str(result.status), result.step

    new_id, status, step = target.run(act)
    echo(f"run {printable(new_id)} forked from {printable(run_id)} at step {at_step}: {paint(status)} at step {step}")
