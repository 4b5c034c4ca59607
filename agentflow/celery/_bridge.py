"""Async inside sync Celery tasks: one event loop per worker process.

Clients (Redis, SQL) are bound to the loop that made them, so a process keeps one loop
and its stores keep one client on it, instead of reconnecting for every task. The loop
is made lazily in the process that uses it (never inherited across a fork).

A soft time limit raises inside whatever the loop was doing. `run` then cancels the
coroutine and lets it unwind before re-raising, so no half-run superstep is left on the
loop to wake up during the next task.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopBridge:
    """Runs coroutines to completion on this process's own event loop."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid: int | None = None

    def loop(self) -> asyncio.AbstractEventLoop:
        """This process's loop (made on first use, and again after a fork)."""
        if self._loop is None or self._loop.is_closed() or self._pid != os.getpid():
            self._loop = asyncio.new_event_loop()
            self._pid = os.getpid()
        return self._loop

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` to completion; on any interruption cancel it and let it unwind first."""
        loop = self.loop()
        task = loop.create_task(coro)
        try:
            return loop.run_until_complete(task)
        except BaseException:
            if not task.done():
                task.cancel()
                try:
                    loop.run_until_complete(task)
                except BaseException:  # the cancellation itself, or what the task raised while unwinding
                    pass
            raise

    def close(self) -> None:
        """Close the loop (at process shutdown)."""
        if self._loop is not None and not self._loop.is_closed() and self._pid == os.getpid():
            # Stores close their clients from async generators the loop finalizes here.
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()
        self._loop = None
