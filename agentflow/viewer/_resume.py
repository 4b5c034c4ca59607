"""Approve or Deny from the run page: who may, and the POST that resumes the run.

Rules, in the order the POST checks them:
1. Who: with a token configured, the request must carry it (form field ``token``, header
   ``X-Agentflow-Token`` or ``Authorization: Bearer``); without one, only a loopback client,
   and nobody when proxies are configured (behind a proxy, loopback proves nothing).
2. Where from: a cross-site request is refused (an ``Origin`` must be a trusted host of the
   settings, never compared with the request's own ``Host``; a browser's
   ``Sec-Fetch-Site: cross-site`` is refused).
3. What: the form's CSRF token is an HMAC of the run id and the step the page showed, under
   a secret of this process; the run must still be paused at that step.
4. Then the run is resumed in this process with the app's flow, as a worker would, holding
   the run's lease as ``viewer@<host>:<pid>``; the decision is signed with the settings'
   `ViewerSettings.token_label` as its operator. A run a live worker holds is never
   resumed here: the page offers no buttons, and a POST is answered with who holds it.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final
from urllib.parse import parse_qsl, quote

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from agentflow._errors import AgentflowError, CheckpointConflict, CheckpointNotFound, IdentityMismatch, RunHeld
from agentflow._run_types import RunKind
from agentflow.exec._run_lease import process_owner
from agentflow.exec._run_read import read_run
from agentflow.exec._run_view import RunReport
from agentflow.viewer._settings import Viewer, root_of

#: Client addresses that are this machine.
LOOPBACK: Final = frozenset({"127.0.0.1", "::1", "::ffff:127.0.0.1"})
#: The largest form accepted, in bytes.
MAX_FORM: Final = 16 * 1024


@dataclass(frozen=True)
class Action:
    """What the run page offers: Approve and Deny, or why not."""

    allowed: bool
    """Whether the buttons are enabled."""
    why_not: str = ""
    """Why they are disabled (shown next to them)."""
    csrf: str = ""
    """The form's CSRF token."""
    needs_token: bool = False
    """Whether the form asks for the viewer's token."""


def csrf_token(viewer: Viewer, run_id: str, step: int) -> str:
    """The token a resume form of `run_id` at `step` carries."""
    msg = f"agentflow-viewer/resume\n{run_id}\n{step}".encode()
    return hmac.new(viewer.csrf_secret, msg, hashlib.sha256).hexdigest()


#: The title of the answer to a decision on a run a live worker holds.
HELD_TITLE: Final = "The run is held by a live worker"


def held_text(report: RunReport) -> str | None:
    """Who holds the run and until when, if a live worker does (then nothing is decided here)."""
    lease = report.lease
    return str(RunHeld(report.run_id, lease.owner, lease.expires_at)) if lease is not None else None


def _run_refusal(viewer: Viewer, report: RunReport) -> str | None:
    """Why this run cannot be resumed from here, whoever asks."""
    flows = viewer.settings.flows
    if report.corrupt or report.status != "paused":
        return "only a paused run whose rows all check can be resumed"
    held = held_text(report)
    if held is not None:
        return held
    if flows is None:
        return "start the viewer with --app module:attr to approve or deny from here"
    if report.kind is RunKind.LOOP:
        return "a paused tool loop resumes through run_tool_loop with the same run_id"
    if report.flow not in flows.flows:
        return f"the app given to the viewer has no flow {report.flow!r}"
    if report.identity is not None and report.identity.principal:
        return "this run acts for a principal, which the viewer does not hold: resume it from the application"
    return None


def _client_refusal(viewer: Viewer, request: Request) -> str | None:
    """Why this client may not resume (a token, if configured, is checked on POST)."""
    if viewer.settings.token is not None:
        return None
    if viewer.settings.proxies:
        return "behind a proxy, approving needs the viewer's token (start the viewer with --token-env)"
    host = request.client.host if request.client else ""
    if host not in LOOPBACK:
        return "approving is allowed only from this machine (or start the viewer with --token-env)"
    return None


def action(viewer: Viewer, request: Request, report: RunReport) -> Action:
    """What the run page offers for `report`."""
    if report.status != "paused" and not report.corrupt:
        return Action(False)
    why = _run_refusal(viewer, report) or _client_refusal(viewer, request)
    if why:
        return Action(False, why)
    return Action(
        True, csrf=csrf_token(viewer, report.run_id, report.step), needs_token=viewer.settings.token is not None
    )


def _given_token(request: Request, form: dict[str, str]) -> str:
    auth = request.headers.get("authorization", "")
    bearer = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
    return form.get("token") or request.headers.get("x-agentflow-token") or bearer


def _who_refusal(viewer: Viewer, request: Request, form: dict[str, str]) -> str | None:
    """Rules 1 and 2: the token or a loopback client, and no cross-site request."""
    token = viewer.settings.token
    if token is not None:
        if not hmac.compare_digest(_given_token(request, form).encode(), token.encode()):
            return "the viewer's token is missing or wrong"
    else:
        refusal = _client_refusal(viewer, request)
        if refusal:
            return refusal
    origin = request.headers.get("origin")
    if origin is not None and not viewer.trusted.allows_origin(origin):
        return "the request comes from another site"
    if request.headers.get("sec-fetch-site") == "cross-site":
        return "the request comes from another site"
    return None


async def _form(request: Request) -> dict[str, str] | None:
    """The posted form (URL-encoded, small), or None if it is not one."""
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        return None
    body = await request.body()
    if len(body) > MAX_FORM:
        return None
    return dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))


def resume_endpoint(viewer: Viewer) -> Callable[[Request], Awaitable[Response]]:
    """``POST /runs/{run_id}/resume``: check rules 1 to 3, then resume the run."""

    async def endpoint(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        form = await _form(request)
        if form is None or form.get("decision") not in ("approve", "deny"):
            return viewer.problem(request, 400, "Not a resume form", "Post decision=approve or deny.", run_id)
        refusal = _who_refusal(viewer, request, form)
        if refusal:
            return viewer.problem(request, 403, "Not allowed", refusal, run_id)
        try:
            report = await read_run(viewer.settings.store, viewer.sealer, run_id)
        except CheckpointNotFound:
            return viewer.problem(request, 404, "No such run", f"The store holds no run {run_id!r}.")
        held = held_text(report) if report.status == "paused" and not report.corrupt else None
        if held is not None:
            return viewer.problem(request, 409, HELD_TITLE, held, run_id)
        refusal = _run_refusal(viewer, report)
        if refusal:
            return viewer.problem(request, 409, "Cannot resume this run", refusal, run_id)
        if not hmac.compare_digest(form.get("csrf", "").encode(), csrf_token(viewer, run_id, report.step).encode()):
            why = "the page was out of date (the run moved on, or the viewer restarted): reload it and decide again"
            return viewer.problem(request, 409, "Stale page", why, run_id)
        return await _resume(viewer, request, report, form)

    return endpoint


async def _resume(viewer: Viewer, request: Request, report: RunReport, form: dict[str, str]) -> Response:
    flows = viewer.settings.flows
    assert flows is not None
    approve = form["decision"] == "approve"
    settings = viewer.settings
    runner = flows.runner(settings.store, list(settings.keys), owner=process_owner("viewer"))
    flow, note = flows.flow(report.flow), form.get("note") or None
    try:
        await runner.resume(flow, report.run_id, approve=approve, note=note, operator=settings.token_label)
    except RunHeld as exc:  # taken between the read above and the resume
        return viewer.problem(request, 409, HELD_TITLE, str(exc), report.run_id)
    except CheckpointConflict as exc:
        return viewer.problem(request, 409, "Someone else decided first", str(exc), report.run_id)
    except IdentityMismatch as exc:
        return viewer.problem(request, 403, "Not this run's principal", str(exc), report.run_id)
    except AgentflowError as exc:
        return viewer.problem(request, 500, "The run could not go on", str(exc), report.run_id)
    done = "approved" if approve else "denied"
    where = f"{root_of(request)}/runs/{quote(report.run_id, safe='')}?resumed={done}"
    return RedirectResponse(where, status_code=303)
