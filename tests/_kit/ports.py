"""Loopback ports for the servers a test starts of its own (Redis, Sentinels, Flower, Prometheus, ...).

Each pytest-xdist process hands out ports from a band of its own (``gw0`` the first band, ``gw1``
the next, ...; a process alone the first), below the kernel's ephemeral range (32768 and up on
Linux). So no other process of the session hands out the same port, and no outgoing connection
is given one between the probe here and the server's bind (a port the kernel picks for port 0 is
from that range, and any connect may take it meanwhile). A suite running beside this one uses
the same bands: each port is probed before it is handed out, and one in use is skipped.
"""

from __future__ import annotations

import os
import secrets
import socket

PORT_BAND_START = 20000
PORT_BAND_SIZE = 2000
_next_port: list[int] = []


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port(*, also_free_at: int | None = None) -> int:
    """A loopback TCP port of this process's band that nothing listens on now.

    The band is walked from a random place, one port after another: this process hands out each
    port of it once before it comes round again. With `also_free_at`, the port that far above
    it must be free too (a Redis Cluster node's bus port is its port + 10000).

    Raises:
        AssertionError: no port of the band is free.
    """
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    start = PORT_BAND_START + index * PORT_BAND_SIZE
    if not _next_port:
        _next_port.append(secrets.randbelow(PORT_BAND_SIZE))
    for _ in range(PORT_BAND_SIZE):
        port = start + _next_port[0]
        _next_port[0] = (_next_port[0] + 1) % PORT_BAND_SIZE
        if _bindable(port) and (also_free_at is None or _bindable(port + also_free_at)):
            return port
    raise AssertionError(f"no free port in {start}..{start + PORT_BAND_SIZE - 1}")
