"""`ViewerSettings` (what to serve, who may act) and `Viewer` (what the pages share)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote

import jinja2
from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from agentflow._app import FlowApp
from agentflow._display import short, when
from agentflow.exec._durable_seal import Sealer
from agentflow.exec.checkpoints._protocol import CheckpointStore

#: Sent with every page: no framing, no inline or foreign scripts, forms post only here.
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def root_of(request: Request) -> str:
    """The path the viewer is mounted at (``""`` at the root), so links work under a prefix."""
    return str(request.scope.get("root_path", "")).rstrip("/")


@dataclass(frozen=True)
class ViewerSettings:
    """What the viewer serves and who may act through it."""

    store: CheckpointStore
    """The store whose runs are shown."""
    keys: Sequence[bytes]
    """The checkpoint key ring (newest first) that checks every row shown."""
    flows: FlowApp | None = None
    """The app whose flows resume paused runs; None disables Approve and Deny."""
    token: str | None = None
    """If set, resuming needs this token (from any address); if not, only loopback clients may resume."""
    label: str = ""
    """What the header names as the store (a URL without its password)."""
    limit: int = 200
    """How many runs the list reads, newest first."""
    refresh_s: int = 5
    """Seconds between live refreshes."""


class Viewer:
    """What the pages share: the settings, a sealer, the templates and the CSRF secret."""

    def __init__(self, settings: ViewerSettings) -> None:
        self.settings = settings
        self.sealer = Sealer(list(settings.keys))
        #: Signs the CSRF tokens of this process's forms (a restart makes open pages stale).
        self.csrf_secret = secrets.token_bytes(32)
        env = jinja2.Environment(
            loader=jinja2.PackageLoader("agentflow.viewer", "templates"),
            autoescape=jinja2.select_autoescape(["html"]),
            undefined=jinja2.StrictUndefined,
        )
        env.filters.update(
            when=when,
            short=lambda v, width=60: "" if v is None else short(v, width),
            pretty=lambda v: json.dumps(v, indent=2, sort_keys=True, default=str),
            q=lambda v: quote(str(v), safe=""),
            cls=lambda v: str(v).replace(" ", "-").lower(),
        )
        self.templates = Jinja2Templates(env=env)

    def page(self, request: Request, name: str, context: dict[str, Any], status: int = 200) -> Response:
        """Render template `name` with the shared context and the security headers."""
        shared = {"label": self.settings.label, "refresh_s": self.settings.refresh_s, "root": root_of(request)}
        response = self.templates.TemplateResponse(request, name, shared | context, status_code=status)
        response.headers.update(SECURITY_HEADERS)
        return response

    def problem(self, request: Request, status: int, title: str, message: str, run_id: str | None = None) -> Response:
        """An error page: what went wrong, in one sentence, and a way back."""
        return self.page(request, "problem.html", {"title": title, "message": message, "run_id": run_id}, status)
