"""The viewer's actions: one POST sequence for all of them, and per action its form and its deed.

``POST /runs/{run_id}/{action}`` for ``resume`` (Approve/Deny), ``cancel``, ``retry``,
``decide`` and ``fork``. Every one goes through the same steps, in this order (`endpoint`):
1. the form, then who asks and from where (`_guards.who_refusal`: a 403);
2. the run, read and checked (a 404 if the store has none);
3. a live holder (a 409 naming it) for the actions it blocks, then the action's rule
   (`rules.Rule`: the run's state, the app, a tool loop, a principal: a 409);
4. the action's own fields (a 400 saying what is wrong);
5. the CSRF token, bound to the action, the run and the step the page showed (a stale page: a 409);
6. the deed, through `Viewer.transport` (this process's runs, or the workers' client); what the runner
   refuses is answered with its message, never a 500 (a 409 for a run that moved on or is
   held, a 400 for a value it does not take); then a redirect to the run's page.

Every deed signs `ViewerSettings.token_label` as its operator.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from agentflow import DidNotHappen, Happened, InDoubtDecision, Rerun
from agentflow._errors import (
    AgentflowError,
    CheckpointConflict,
    CheckpointError,
    CheckpointNotFound,
    FlowError,
    IdentityMismatch,
    RecoveryNeedsDecision,
    RunHeld,
    UnstorableValue,
)
from agentflow.exec.run.view import RunReport
from agentflow.exec.seal import loads_storable
from agentflow.runs import Runs
from agentflow.viewer._guards import STALE, csrf_matches, read_form, who_refusal
from agentflow.viewer._rules import CANCEL, DECIDE, FORK, HELD_TITLE, RESUME, RETRY, Rule, held_text
from agentflow.viewer._settings import Viewer, root_of

if TYPE_CHECKING:
    from agentflow.celery import FlowClient

T = TypeVar("T")
Endpoint = Callable[[Request], Awaitable[Response]]

#: The longest note or reason taken, in characters.
MAX_TEXT: Final = 500
#: The most calls in doubt one decision form carries.
MAX_CALLS: Final = 100


class BadForm(ValueError):
    """Raised when an action's own fields are missing or malformed (the message says which)."""


@dataclass(frozen=True)
class Done:
    """Where the browser goes after a deed: the run to show and what was done (``?done=``)."""

    run_id: str
    what: str


@dataclass(frozen=True)
class Operation(Generic[T]):
    """One action: its rule, how its form reads, and what it does."""

    rule: Rule
    parse: Callable[[RunReport, dict[str, str]], T]
    """The action's own fields (raises `BadForm`)."""
    deed: Callable[[Runs | FlowClient, RunReport, T, str], Awaitable[Done]]
    """Carry it out, signed by the operator named last."""


def _text(form: dict[str, str], name: str, what: str) -> str:
    text = form.get(name, "").strip()
    if len(text) > MAX_TEXT:
        raise BadForm(f"{what} is longer than {MAX_TEXT} characters.")
    return text


def _decision(report: RunReport, form: dict[str, str]) -> tuple[bool, str | None]:
    if form.get("decision") not in ("approve", "deny"):
        raise BadForm("Post decision=approve or deny.")
    return form["decision"] == "approve", _text(form, "note", "The note") or None


async def _resume(op: Runs | FlowClient, report: RunReport, args: tuple[bool, str | None], who: str) -> Done:
    approve, note = args
    await op.resume(report.run_id, approve=approve, note=note, operator=who)
    return Done(report.run_id, "approved" if approve else "denied")


def _reason(report: RunReport, form: dict[str, str]) -> str:
    reason = _text(form, "reason", "The reason")
    if not reason:
        raise BadForm("Say why the run is cancelled: the reason is signed into the run.")
    return reason


async def _cancel(op: Runs | FlowClient, report: RunReport, reason: str, who: str) -> Done:
    acted = await op.cancel(report.run_id, reason=reason, operator=who)
    status = acted if isinstance(acted, str) else acted.status  # the workers' client says the status alone
    # A run a live worker holds is asked to stop: it stays running until its holder reads the request.
    return Done(report.run_id, "cancelled" if status == "cancelled" else "cancel-requested")


def _nothing(report: RunReport, form: dict[str, str]) -> None:
    return None


async def _retry(op: Runs | FlowClient, report: RunReport, args: None, who: str) -> Done:
    await op.retry(report.run_id, operator=who)
    return Done(report.run_id, "retried")


def _word(form: dict[str, str], index: int, call_id: str) -> InDoubtDecision:
    word = form.get(f"word.{index}")
    if word == "rerun":
        return Rerun()
    if word == "happened":
        try:
            return Happened(loads_storable(form.get(f"result.{index}", ""), f"The result of call {call_id}"))
        except json.JSONDecodeError as exc:
            raise BadForm(
                f"Call {call_id}: the result it returned must be JSON (text in double quotes): {exc}."
            ) from None
        except UnstorableValue as exc:
            raise BadForm(f"{exc}.") from None
    if word == "not":
        return DidNotHappen(_text(form, f"reason.{index}", f"The reason for call {call_id}"))
    raise BadForm(f"Call {call_id}: say whether it is to run again, happened, or did not happen.")


def _calls(report: RunReport, form: dict[str, str]) -> dict[str, InDoubtDecision]:
    calls: dict[str, InDoubtDecision] = {}
    for index in range(MAX_CALLS):
        call_id = form.get(f"call.{index}")
        if call_id is None:
            break
        calls[call_id] = _word(form, index, call_id)
    if not calls:
        raise BadForm("Say what happened to each call in doubt.")
    return calls


async def _decide(op: Runs | FlowClient, report: RunReport, calls: dict[str, InDoubtDecision], who: str) -> Done:
    await op.decide_in_doubt(report.run_id, calls=calls, operator=who)
    if isinstance(op, Runs):  # here, the run goes on in this process (the workers' client sent a worker)
        with contextlib.suppress(CheckpointConflict):  # a worker took the run since: the decision is its to spend
            await op.recover(report.run_id, operator=who)
    return Done(report.run_id, "decided")


def _fork_args(report: RunReport, form: dict[str, str]) -> tuple[int, dict[str, Any] | None]:
    try:
        at_step = int(form.get("at_step", ""))
    except ValueError:
        raise BadForm("Choose the step to fork from.") from None
    if not 0 <= at_step <= report.step:
        raise BadForm(f"Run {report.run_id!r} has steps 0 to {report.step}, not {at_step}.")
    text = form.get("patch", "").strip()
    if not text:
        return at_step, None
    try:
        patch = loads_storable(text, "The patch")
    except json.JSONDecodeError as exc:
        raise BadForm(f"The patch must be a JSON object of state fields ({exc}).") from None
    except UnstorableValue as exc:
        raise BadForm(f"{exc}.") from None
    if not isinstance(patch, dict):
        raise BadForm('The patch must be a JSON object of state fields, such as {"note": "again"}.')
    return at_step, patch


async def _fork(op: Runs | FlowClient, report: RunReport, args: tuple[int, dict[str, Any] | None], who: str) -> Done:
    at_step, patch = args
    forked = await op.fork(report.run_id, at_step=at_step, patch=patch, operator=who)
    return Done(forked if isinstance(forked, str) else forked.run_id, "forked")


#: Every action, by the last segment of its path.
OPERATIONS: Final[dict[str, Operation[Any]]] = {
    op.rule.name: op
    for op in (
        Operation(RESUME, _decision, _resume),
        Operation(CANCEL, _reason, _cancel),
        Operation(RETRY, _nothing, _retry),
        Operation(DECIDE, _calls, _decide),
        Operation(FORK, _fork_args, _fork),
    )
}


def endpoint(viewer: Viewer, operation: Operation[Any]) -> Endpoint:
    """``POST /runs/{run_id}/<action>``: steps 1 to 5 of the module docstring, then the deed."""
    rule = operation.rule

    async def post(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        form = await read_form(request)
        if form is None:
            return viewer.problem(request, 400, "Not a form", "Post the run page's form.", run_id)
        refusal = who_refusal(viewer, request, form)
        if refusal:
            return viewer.problem(request, 403, "Not allowed", refusal, run_id)
        report = await viewer.read(request, run_id)
        if isinstance(report, Response):
            return report
        held = held_text(report) if rule.held_blocks and not report.corrupt else None
        if held is not None:
            return viewer.problem(request, 409, HELD_TITLE, held, run_id)
        why = rule.fits(report) or rule.refusal(viewer, report)
        if why:
            return viewer.problem(request, 409, f"Cannot {rule.verb} this run", why, run_id)
        try:
            args = operation.parse(report, form)
        except BadForm as exc:
            return viewer.problem(request, 400, "Not accepted", str(exc), run_id)
        if not csrf_matches(viewer, form, rule.name, run_id, report.step):
            return viewer.problem(request, 409, "Stale page", STALE, run_id)
        return await _carry_out(viewer, request, operation, report, args)

    return post


async def _carry_out(viewer: Viewer, request: Request, operation: Operation[T], report: RunReport, args: T) -> Response:
    """Step 6: the deed, its refusals answered with their message, then back to the run."""
    transport = viewer.transport
    assert transport is not None  # the rule refuses every action without an app
    run_id = report.run_id
    try:
        done = await operation.deed(transport, report, args, viewer.settings.token_label)
    except RunHeld as exc:  # taken between the read above and the deed
        return viewer.problem(request, 409, HELD_TITLE, str(exc), run_id)
    except CheckpointConflict as exc:
        return viewer.problem(request, 409, "The run moved on", str(exc), run_id)
    except IdentityMismatch as exc:
        return viewer.problem(request, 403, "Not this run's principal", str(exc), run_id)
    except RecoveryNeedsDecision as exc:
        return viewer.problem(request, 409, "Calls in doubt need a decision", str(exc), run_id)
    except (CheckpointNotFound, FlowError, ValueError) as exc:
        return viewer.problem(request, 400, "Not accepted", str(exc), run_id)
    except CheckpointError as exc:  # unreachable, or a row that fails its check since the page was read
        return viewer.problem(request, 503, "The store failed", str(exc), run_id)
    except AgentflowError as exc:
        return viewer.problem(request, 500, "The run could not go on", str(exc), run_id)
    where = f"{root_of(request)}/runs/{quote(done.run_id, safe='')}?done={done.what}"
    return RedirectResponse(where, status_code=303)
