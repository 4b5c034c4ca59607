"""The two pages: the run list (``/``) and one run (``/runs/{run_id}``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Final
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response

from agentflow._errors import CheckpointError
from agentflow._events import RUN_EVENT_NAMES
from agentflow._hints import decide_hint
from agentflow.exec.run.read import read_heads
from agentflow.exec.run.view import DECISION, STATUSES, RunHead, RunReport
from agentflow.exec.seal import key_id
from agentflow.viewer._offers import offers
from agentflow.viewer._rules import needs_migration_text
from agentflow.viewer._settings import Viewer, root_of

Endpoint = Callable[[Request], Awaitable[Response]]

#: How many pages back the list goes (the store hands over every run a page skips).
MAX_PAGES: Final = 200
#: What the page's counters sum up, in this order.
COUNTED: Final = ("running", "paused", "done", "failed", "cancelled", DECISION, "live", "corrupt")
#: What the run page can say was just done to the run (``?done=``, set by the actions' redirects).
DONE: Final = frozenset({"approved", "denied", "cancelled", "cancel-requested", "retried", "decided", "forked"})


def _counts(heads: Sequence[RunHead]) -> list[tuple[str, int]]:
    """How many runs of the page have each status and mark, in a fixed order, zeros left out."""
    seen: Counter[str] = Counter()
    for head in heads:
        seen.update(["corrupt"] if head.corrupt else [head.status])
        seen.update([DECISION] if head.waiting else [])
        seen.update(["live"] if head.lease is not None else [])
    return [(name, seen[name]) for name in COUNTED if seen[name]]


def _other_keys(viewer: Viewer, heads: Sequence[RunHead], *, whole: bool) -> dict[str, object]:
    """What the page says of runs signed with a key the viewer does not hold (their rows' key ids, and its own).

    ``wrong_key`` (no run checks: the viewer was given the wrong key) only when every run the
    store lists here fails so, and the page holds all of them (`whole`): a page of such runs
    among pages of good ones gets the count of its runs instead.
    """
    other = [h for h in heads if h.other_key is not None]
    return {
        "wrong_key": whole and bool(heads) and len(other) == len(heads),
        "other_count": len(other),
        "other_keys": sorted({h.other_key for h in other if h.other_key is not None}),
        "our_keys": [key_id(key) for key in viewer.settings.keys],
    }


def _page_number(text: str | None) -> int:
    """The ``?page=`` asked for, from 1 to `MAX_PAGES` (anything else is page 1)."""
    try:
        number = int(text or "1")
    except ValueError:
        return 1
    return min(max(number, 1), MAX_PAGES)


def _link(request: Request, flow: str | None, status: str | None, page: int) -> str:
    query = urlencode([(k, v) for k, v in (("flow", flow), ("status", status), ("page", str(page))) if v])
    return f"{root_of(request)}/?{query}"


def list_page(viewer: Viewer) -> Endpoint:
    """``/``: one page of runs (newest first, ``?page=``), filtered by ``?flow=`` and ``?status=``.

    Each run is read as its latest checkpoint only (`read_heads`): the page costs the same
    however long the runs are. The flow filter is the store's; the status filter narrows
    the page.
    """

    async def endpoint(request: Request) -> Response:
        flow = request.query_params.get("flow") or None
        status = request.query_params.get("status") or None
        if status is not None and status not in STATUSES:
            status = None
        page = _page_number(request.query_params.get("page"))
        settings = viewer.settings
        offset = (page - 1) * settings.limit
        try:
            heads = await read_heads(settings.store, viewer.sealer, flow, settings.limit + 1, offset)
        except CheckpointError as exc:
            return viewer.problem(request, 503, "The store cannot be read", str(exc))
        more, heads = len(heads) > settings.limit, heads[: settings.limit]
        known = set(settings.flows.flows) if settings.flows is not None else set()
        flows = sorted(known | {h.flow for h in heads if not h.corrupt} | ({flow} if flow else set()))
        context = {
            "runs": [h for h in heads if h.has_status(status)],
            "first": offset + 1,
            "last": offset + len(heads),
            "prev": _link(request, flow, status, page - 1) if page > 1 else None,
            "next": _link(request, flow, status, page + 1) if more and page < MAX_PAGES else None,
            "counts": _counts(heads),
            "flows": flows,
            "statuses": STATUSES,
            "flow": flow,
            "status": status,
        }
        context |= _other_keys(viewer, heads, whole=page == 1 and not more and flow is None)
        return viewer.page(request, "runs.html", context)

    return endpoint


def _migration(viewer: Viewer, report: RunReport) -> str | None:
    """Why an unfinished run needs migration (its flow version is not in the viewer's app), or None."""
    flows = viewer.flows
    unfinished = report.status in ("running", "paused") and not report.corrupt
    if flows is None or report.version is None or not unfinished or report.flow not in flows.versions:
        return None
    if flows.has_version(report.flow, report.version):
        return None
    return needs_migration_text(report, flows.flow_versions(report.flow).versions)


def run_page(viewer: Viewer) -> Endpoint:
    """``/runs/{run_id}``: timeline, state, call log, recoveries, and the actions (every row checked)."""

    async def endpoint(request: Request) -> Response:
        report = await viewer.read(request, request.path_params["run_id"])
        if isinstance(report, Response):
            return report
        done = request.query_params.get("done")
        distributed = viewer.client is not None
        context = {
            "run": report,
            "ops": offers(viewer, request, report),
            "done": done if done in DONE else None,
            "distributed": distributed,
            "decide_hint": decide_hint(report.run_id, workers="..." if distributed else None),
            "event_names": RUN_EVENT_NAMES,
            "migration": _migration(viewer, report),
        }
        return viewer.page(request, "run.html", context)

    return endpoint
