"""The two pages: the run list (``/``) and one run (``/runs/{run_id}``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from agentflow._errors import CheckpointError, CheckpointNotFound
from agentflow.exec._run_read import read_run, read_runs, signed_with_other_keys
from agentflow.exec._run_view import STATUSES, RunReport
from agentflow.viewer._resume import action
from agentflow.viewer._settings import Viewer

Endpoint = Callable[[Request], Awaitable[Response]]


def _counts(reports: list[RunReport]) -> list[tuple[str, int]]:
    """How many runs have each status and mark, in a fixed order, zeros left out."""
    seen: Counter[str] = Counter()
    for rep in reports:
        seen.update({rep.status} if not rep.corrupt else set())
        seen.update(set(rep.marks) - {rep.status})
    order = ("running", "paused", "done", "failed", "in doubt", "recovered", "resumed", "corrupt")
    return [(name, seen[name]) for name in order if seen[name]]


def list_page(viewer: Viewer) -> Endpoint:
    """``/``: every run (newest first), filtered by ``?flow=`` and ``?status=``."""

    async def endpoint(request: Request) -> Response:
        flow = request.query_params.get("flow") or None
        status = request.query_params.get("status") or None
        if status is not None and status not in STATUSES:
            status = None
        settings = viewer.settings
        try:
            reports = await read_runs(settings.store, viewer.sealer, None, settings.limit)
        except CheckpointError as exc:
            return viewer.problem(request, 503, "The store cannot be read", str(exc))
        flows = sorted({rep.flow for rep in reports if not rep.corrupt})
        shown = [
            rep
            for rep in reports
            if rep.has_status(status) and (flow is None or (not rep.corrupt and rep.flow == flow))
        ]
        context = {
            "runs": shown,
            "total": len(reports),
            "counts": _counts(reports),
            "flows": flows,
            "statuses": STATUSES,
            "flow": flow,
            "status": status,
            "wrong_key": signed_with_other_keys(reports),
        }
        return viewer.page(request, "runs.html", context)

    return endpoint


def run_page(viewer: Viewer) -> Endpoint:
    """``/runs/{run_id}``: timeline, state, call log, recoveries, approvals."""

    async def endpoint(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        try:
            report = await read_run(viewer.settings.store, viewer.sealer, run_id)
        except CheckpointNotFound:
            return viewer.problem(request, 404, "No such run", f"The store holds no run {run_id!r}.")
        except CheckpointError as exc:
            return viewer.problem(request, 503, "The store cannot be read", str(exc), run_id)
        context = {
            "run": report,
            "act": action(viewer, request, report),
            "resumed": request.query_params.get("resumed"),
        }
        return viewer.page(request, "run.html", context)

    return endpoint
