"""Serve the viewer with uvicorn."""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import socket
import sys
from typing import Any, Final

import uvicorn

from agentflow.viewer._app import ViewerSettings, create_app

#: How `serve` runs uvicorn. Its own proxy headers stay off (its default trusts ``X-Forwarded-For``
#: from ``$FORWARDED_ALLOW_IPS``): the app believes only `ViewerSettings.proxies`.
UVICORN_OPTIONS: Final[dict[str, Any]] = {"log_level": "warning", "server_header": False, "proxy_headers": False}


class ViewerServer(uvicorn.Server):
    """uvicorn's server, which ends the viewer's open event streams when it shuts down.

    uvicorn waits for every running response before it stops, and an event stream of a run
    that has not ended never finishes on its own: without this, an open run page would hold
    the viewer up until the browser left.
    """

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Tell the app's event streams to stop, then shut down as uvicorn does."""
        state = getattr(self.config.app, "state", None)
        viewer = getattr(state, "viewer", None)
        if viewer is not None:
            viewer.closing = True
        await super().shutdown(sockets)


#: What `serve` exits with when the server did not start (uvicorn.run's code).
STARTUP_FAILURE: Final = 3


def bound(settings: ViewerSettings, host: str, port: int) -> ViewerSettings:
    """`settings` for a viewer listening on `host`:`port`.

    The port becomes `ViewerSettings.port` (unless set, or 0), so the loopback names are
    trusted at it only; a specific IP address to listen on (not 0.0.0.0 or ::) is a
    trusted host too, since no DNS answer can put it in a browser's address bar.
    """
    port_of = settings.port if settings.port is not None or port == 0 else port
    extra: list[str] = []
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None and not address.is_unspecified and not address.is_loopback:
        name = f"[{address.compressed}]" if address.version == 6 else address.compressed
        extra.append(f"{name}:{port}" if port else name)
    hosts = tuple(settings.allowed_hosts) + tuple(e for e in extra if e not in settings.allowed_hosts)
    return dataclasses.replace(settings, port=port_of, allowed_hosts=hosts)


def serve(settings: ViewerSettings, *, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Serve the viewer on `host`:`port` until the process is interrupted (loopback by default)."""
    config = uvicorn.Config(create_app(bound(settings, host, port)), host=host, port=port, **UVICORN_OPTIONS)
    server = ViewerServer(config)
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    if not server.started:  # as uvicorn.run: the port was taken, say
        sys.exit(STARTUP_FAILURE)
