"""Which names the viewer answers to, and which proxies it believes.

DNS rebinding: a page of ``evil.example`` re-points that name at 127.0.0.1, and the
victim's browser then talks to the viewer while it believes it talks to ``evil.example``.
Every such request names ``evil.example`` in its ``Host`` (and in ``Origin``), so the
viewer answers only requests whose ``Host`` is on a trusted list (`HostCheck`, before any
route), and takes a form only from an ``Origin`` on that same list: never compared with
the request's own ``Host``, which the attacker writes.

The list holds the loopback names (``127.0.0.1``, ``localhost``, ``[::1]``), at the port
the viewer is served on when it is known, and the names the operator adds. An entry
without a port matches any port.

Proxies: ``X-Forwarded-For`` and ``X-Forwarded-Proto`` are believed only from the
addresses the operator names (uvicorn's `ProxyHeadersMiddleware`, applied by the app
itself so every ASGI server behaves the same); by default from nobody.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

#: The names of this machine that no DNS answer can give to another site.
LOOPBACK_NAMES: Final = ("127.0.0.1", "localhost", "[::1]")
#: The port a URL of each scheme means when it names none.
DEFAULT_PORTS: Final = {"http": 80, "https": 443, "ws": 80, "wss": 443}
#: What a 400 says (it never repeats the Host it refused).
REFUSED: Final = (
    "This viewer does not answer to the host name this request used. If you reach it by that "
    "name on purpose, start it with --allowed-host NAME (ViewerSettings.allowed_hosts).\n"
)

_HOST_PORT = re.compile(r"(\[[0-9a-f:.]+\]|[^:\[\]/@?#\s]+)(?::([0-9]{1,5}))?")
_DNS_NAME = re.compile(r"[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*")


@dataclass(frozen=True, slots=True)
class HostEntry:
    """One trusted name: a DNS name or an IP address (IPv6 in brackets), and maybe a port."""

    name: str
    """Lowercase, without a trailing dot; an IPv6 address in brackets, compressed."""
    port: int | None
    """The only port it is trusted at, or None for any port."""


def split_host(text: str) -> tuple[str, int | None] | None:
    """Split ``name[:port]`` (a Host header, the authority of an Origin) into a normal name and port.

    Returns:
        The lowercase name (IPv6 in brackets, compressed; no trailing dot) and the port
        (None if it names none), or None if `text` is not a host name or an IP address.
    """
    found = _HOST_PORT.fullmatch(text.strip().lower())
    if found is None:
        return None
    name, port_text = found.group(1), found.group(2)
    port = int(port_text) if port_text else None
    if port is not None and not 0 < port < 65536:
        return None
    if name.startswith("["):
        try:
            return f"[{ipaddress.IPv6Address(name[1:-1]).compressed}]", port
        except ValueError:
            return None
    name = name.removesuffix(".")
    if not _DNS_NAME.fullmatch(name):
        return None
    return name, port


def parse_entry(text: str, what: str) -> HostEntry:
    """Read one trusted-host entry: ``name``, ``name:port``, an IPv4 address, ``[v6]`` or ``[v6]:port``.

    Raises:
        ValueError: the entry is not a host name or an address (the message names `what`).
    """
    if not isinstance(text, str):
        raise ValueError(f"{what}: each entry must be a host name as a string, not {type(text).__name__}")
    try:  # a bare IPv6 address, for convenience
        return HostEntry(f"[{ipaddress.IPv6Address(text.strip()).compressed}]", None)
    except ValueError:
        pass
    parsed = split_host(text)
    if parsed is None or "*" in text:
        raise ValueError(
            f"{what}: {text!r} is not a host name: give the name browsers use to reach the viewer, such as "
            "viewer.example.com or viewer.example.com:8443 (no scheme, path or wildcard)"
        )
    return HostEntry(*parsed)


class TrustedHosts:
    """The names the viewer answers to and takes forms from."""

    def __init__(self, entries: Sequence[HostEntry]) -> None:
        self.entries = tuple(entries)

    @classmethod
    def of(cls, allowed: Sequence[str], port: int | None) -> TrustedHosts:
        """The loopback names at `port` (any port if None), then the `allowed` entries."""
        loopback = [HostEntry(name, port) for name in LOOPBACK_NAMES]
        return cls(loopback + [parse_entry(text, "allowed_hosts") for text in allowed])

    def allows(self, name: str, port: int) -> bool:
        """Whether `name` (normalised, as `split_host` gives it) at `port` is trusted."""
        return any(e.name == name and e.port in (None, port) for e in self.entries)

    def allows_host(self, header: str | None, scheme: str) -> bool:
        """Whether a request's ``Host`` header names a trusted host (its port defaults by `scheme`)."""
        parsed = split_host(header) if header else None
        if parsed is None:
            return False
        name, port = parsed
        return self.allows(name, port if port is not None else DEFAULT_PORTS.get(scheme, 80))

    def allows_origin(self, origin: str) -> bool:
        """Whether an ``Origin`` header (``scheme://host[:port]``) is a trusted host; ``null`` never is."""
        try:
            parts = urlsplit(origin.strip())
        except ValueError:
            return False
        if parts.scheme not in ("http", "https") or parts.path or parts.query or parts.fragment or "@" in parts.netloc:
            return False
        parsed = split_host(parts.netloc)
        if parsed is None:
            return False
        name, port = parsed
        return self.allows(name, port if port is not None else DEFAULT_PORTS[parts.scheme])


class HostCheck:
    """ASGI middleware: a request whose ``Host`` is not trusted gets a 400 before any route sees it."""

    def __init__(self, app: ASGIApp, trusted: TrustedHosts) -> None:
        self.app = app
        self.trusted = trusted

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse an untrusted ``Host``; pass everything else (and lifespan events) on."""
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        hosts = [value for key, value in scope["headers"] if key == b"host"]
        header = hosts[0].decode("latin-1") if len(hosts) == 1 else None
        if self.trusted.allows_host(header, str(scope.get("scheme", "http"))):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        else:
            await PlainTextResponse(REFUSED, status_code=400)(scope, receive, send)


def check_proxies(entries: Sequence[str], what: str) -> tuple[str, ...]:
    """The proxy addresses (or networks) to believe forwarded headers from, checked.

    Raises:
        ValueError: an entry is ``*`` or not an IP address or network (the message names `what`).
    """
    out: list[str] = []
    for entry in entries:
        text = entry.strip() if isinstance(entry, str) else ""
        if text == "*":
            raise ValueError(
                f"{what}: '*' would let any client say which address it comes from; name each proxy's address"
            )
        try:
            if "/" in text:
                ipaddress.ip_network(text, strict=False)
            else:
                ipaddress.ip_address(text)
        except ValueError:
            raise ValueError(
                f"{what}: {entry!r} is not an IP address or network (such as 10.0.0.5 or 10.0.0.0/24)"
            ) from None
        out.append(text)
    return tuple(out)
