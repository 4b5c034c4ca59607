"""Leases in tests: a killed worker's lease lapses soon, and whoever recovers after it waits that out.

A worker process a test kills with SIGKILL leaves its lease in the store, live until it
lapses, exactly as in production. Worker subprocesses therefore hold runs with
`KILLED_LEASE_S` (renewed every third of it while they live), and the process that
recovers after the kill calls `once_lapsed`: on `RunHeld` it waits until the moment the
holder's lease ends (the error says when) and tries again. Nothing waits on a guessed
sleep, and a live holder is never broken.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from agentflow._errors import RunHeld

#: The lease of a worker subprocess a test may kill: short, so its death is seen soon.
KILLED_LEASE_S = 0.3

T = TypeVar("T")


async def once_lapsed(act: Callable[[], Awaitable[T]], timeout_s: float = 15.0) -> T:
    """Run `act`; while it finds the run held (a killed worker's lease), run it again once that lease ends.

    Raises:
        RunHeld: still held after `timeout_s` (a live holder that keeps renewing).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await act()
        except RunHeld as exc:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(max(0.01, exc.expires_at - time.time() + 0.01))
