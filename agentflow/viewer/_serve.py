"""Serve the viewer with uvicorn."""

from __future__ import annotations

import dataclasses
import ipaddress
from typing import Any, Final

import uvicorn

from agentflow.viewer._app import ViewerSettings, create_app

#: How `serve` runs uvicorn. Its own proxy headers stay off (its default trusts ``X-Forwarded-For``
#: from ``$FORWARDED_ALLOW_IPS``): the app believes only `ViewerSettings.proxies`.
UVICORN_OPTIONS: Final[dict[str, Any]] = {"log_level": "warning", "server_header": False, "proxy_headers": False}


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
    uvicorn.run(create_app(bound(settings, host, port)), host=host, port=port, **UVICORN_OPTIONS)
