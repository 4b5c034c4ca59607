"""`create_app`: the viewer's routes, static files, request guards and shutdown.

Pages read the store on every request and check every row they show, as
``agentflow runs show`` does (`agentflow.exec.run.read`). Nothing is cached.

Before any route, a request passes two guards (`agentflow.viewer._hosts`): forwarded
headers rewrite its client address and scheme only when they come from a proxy the
settings name, and its ``Host`` must be trusted (else 400).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.convertors import PathConvertor, register_url_convertor
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from agentflow.viewer._actions import OPERATIONS, endpoint
from agentflow.viewer._hosts import HostCheck
from agentflow.viewer._pages import Endpoint, list_page, run_page
from agentflow.viewer._settings import Viewer, ViewerSettings
from agentflow.viewer._stream import event_stream

__all__ = ["ViewerSettings", "create_app"]


class RunIdConvertor(PathConvertor):
    """A run id in a path: anything, slashes and line breaks included (``path``'s ``.*`` stops at a line break)."""

    regex = r"[\s\S]*"


register_url_convertor("agentflow_run_id", RunIdConvertor())


def events_or_page(viewer: Viewer, page: Endpoint) -> Endpoint:
    """``GET /runs/{run_id}/events``: the run's event stream; but the page of a run whose id ends in ``/events``.

    The path is matched decoded, so ``/runs/a%2Fevents`` (the page of run ``a/events``, as the
    pages link it) looks like the stream of run ``a``: the raw path tells them apart.
    """

    async def endpoint(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        raw = request.scope.get("raw_path")
        if isinstance(raw, bytes) and not raw.split(b"?", 1)[0].endswith(b"/events"):
            request.path_params["run_id"] = f"{run_id}/events"
            return await page(request)
        return await event_stream(viewer, request, run_id)

    return endpoint


def create_app(settings: ViewerSettings) -> Starlette:
    """Build the viewer's ASGI app (serve it with any ASGI server; `serve` uses uvicorn).

    Served by hand, give `ViewerSettings.port` (the loopback names are then trusted at that
    port only) and turn the server's own proxy-header handling off: the app applies
    `ViewerSettings.proxies` itself.
    """
    viewer = Viewer(settings)
    page = run_page(viewer)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await settings.store.aclose()
        if viewer.client is not None:
            await viewer.client.aclose()

    # The actions before the run page: its {run_id} would match ".../resume" too (a GET still reaches the page).
    actions = [
        Route(f"/runs/{{run_id:agentflow_run_id}}/{name}", endpoint(viewer, op), methods=["POST"], name=name)
        for name, op in OPERATIONS.items()
    ]
    routes = [
        Route("/", list_page(viewer), name="runs"),
        *actions,
        Route("/runs/{run_id:agentflow_run_id}/events", events_or_page(viewer, page), methods=["GET"], name="events"),
        Route("/runs/{run_id:agentflow_run_id}", page, name="run"),
        Mount("/static", StaticFiles(packages=[("agentflow.viewer", "static")]), name="static"),
    ]
    middleware = [Middleware(HostCheck, trusted=viewer.trusted)]
    if settings.proxies:  # first: a named proxy's X-Forwarded-Proto sets the scheme the Host's port defaults by
        middleware.insert(0, Middleware(ProxyHeadersMiddleware, trusted_hosts=list(settings.proxies)))
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    app.state.viewer = viewer  # `ViewerServer` ends its event streams when it shuts down
    return app
