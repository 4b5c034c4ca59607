"""Who may act from the viewer, and how a form proves it came from a page this viewer made.

Every action (Approve/Deny, Cancel, Retry, Decide, Fork) is a POST that passes the same
three rules, in this order:
1. Who: with a token configured, the request must carry it (form field ``token``, header
   ``X-Agentflow-Token`` or ``Authorization: Bearer``); without one, only a loopback client,
   and nobody when proxies are configured (behind a proxy, loopback proves nothing).
2. Where from: a cross-site request is refused (an ``Origin`` must be a trusted host of the
   settings, never compared with the request's own ``Host``; a browser's
   ``Sec-Fetch-Site: cross-site`` is refused).
3. What: the form's CSRF token is an HMAC of the action, the run id and the step the page
   showed, under a secret of this process (`csrf_token`).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Final
from urllib.parse import parse_qsl

from starlette.requests import Request

from agentflow.viewer._settings import Viewer

#: Client addresses that are this machine.
LOOPBACK: Final = frozenset({"127.0.0.1", "::1", "::ffff:127.0.0.1"})
#: The largest form accepted, in bytes.
MAX_FORM: Final = 16 * 1024
#: What a stale form is told.
STALE: Final = "the page was out of date (the run moved on, or the viewer restarted): reload it and decide again"


def csrf_token(viewer: Viewer, action: str, run_id: str, step: int) -> str:
    """The token the `action` form of `run_id` at `step` carries (a form of one action never serves another)."""
    msg = f"agentflow-viewer/{action}\n{run_id}\n{step}".encode()
    return hmac.new(viewer.csrf_secret, msg, hashlib.sha256).hexdigest()


def csrf_matches(viewer: Viewer, form: dict[str, str], action: str, run_id: str, step: int) -> bool:
    """Rule 3: whether the posted form was made for `action` on `run_id` at `step` (compared in constant time)."""
    return hmac.compare_digest(form.get("csrf", "").encode(), csrf_token(viewer, action, run_id, step).encode())


def client_refusal(viewer: Viewer, request: Request) -> str | None:
    """Why this client may not act (a token, if configured, is checked on POST)."""
    if viewer.settings.token is not None:
        return None
    if viewer.settings.proxies:
        return "behind a proxy, acting on a run needs the viewer's token (start the viewer with --token-env)"
    host = request.client.host if request.client else ""
    if host not in LOOPBACK:
        return "acting on a run is allowed only from this machine (or start the viewer with --token-env)"
    return None


def _given_token(request: Request, form: dict[str, str]) -> str:
    auth = request.headers.get("authorization", "")
    bearer = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
    return form.get("token") or request.headers.get("x-agentflow-token") or bearer


def who_refusal(viewer: Viewer, request: Request, form: dict[str, str]) -> str | None:
    """Rules 1 and 2: the token or a loopback client, and no cross-site request."""
    token = viewer.settings.token
    if token is not None:
        if not hmac.compare_digest(_given_token(request, form).encode(), token.encode()):
            return "the viewer's token is missing or wrong"
    else:
        refusal = client_refusal(viewer, request)
        if refusal:
            return refusal
    origin = request.headers.get("origin")
    if origin is not None and not viewer.trusted.allows_origin(origin):
        return "the request comes from another site"
    if request.headers.get("sec-fetch-site") == "cross-site":
        return "the request comes from another site"
    return None


async def read_form(request: Request) -> dict[str, str] | None:
    """The posted form (URL-encoded, small), or None if it is not one."""
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        return None
    body = bytearray()
    async for chunk in request.stream():  # read no more than a form may hold, whatever Content-Length says
        body += chunk
        if len(body) > MAX_FORM:
            return None
    return dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
