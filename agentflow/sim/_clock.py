"""Virtual time: one clock the simulation owns, read by the loop, the stores and the code under test.

Every reading of time the protocol makes (lease expiry in the memory and SQLite stores, the
Redis server's ``TIME`` and key expiry in fakeredis, ``saved_at``, stale-after checks, the
renewal timers, backoffs) goes through ``time.time``, ``time.monotonic`` or the event
loop's clock. Rather than thread a clock parameter through about forty call sites (and
miss the ones inside fakeredis), `virtual_time` points those two functions at the
simulation's clock for as long as a simulation runs, and `SimLoop` keeps its timers on it.
The clock moves only when the scheduler says so (`VirtualClock.advance`): a lease lapses
because the scheduler moved time past it, never because the machine was slow.

`SimLoop` also counts the jobs it hands to threads (the SQLite store's first open, a sync
node function), so the scheduler can tell "every actor is parked or waiting for a timer"
from "an actor is waiting for a thread" and never declares a step over too early.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from contextlib import contextmanager
from typing import Any, TypeVar, TypeVarTuple
from unittest import mock

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")

#: Where virtual wall-clock time starts (seconds since the epoch: 2027-01-15).
EPOCH = 1_800_000_000.0
#: Where virtual monotonic time (and so the event loop's) starts.
MONOTONIC_START = 1_000.0


class VirtualClock:
    """Seconds since the simulation began; moved only by `advance`."""

    def __init__(self) -> None:
        self.now = 0.0

    def time(self) -> float:
        """Virtual wall-clock time (seconds since the epoch)."""
        return EPOCH + self.now

    def monotonic(self) -> float:
        """Virtual monotonic time."""
        return MONOTONIC_START + self.now

    def since_start(self, monotonic: float) -> float:
        """A virtual monotonic (or loop) time as seconds since the simulation began."""
        return monotonic - MONOTONIC_START

    def advance(self, seconds: float) -> None:
        """Move time forward (never back)."""
        if seconds < 0:
            raise ValueError(f"time only moves forward, not by {seconds}")
        self.now += seconds


class Clocks:
    """The clock ``time`` reads while a simulation runs: each episode gets a new one, starting at 0.

    So an episode's schedule depends on its seed alone, not on how long the episodes
    before it ran: a failing episode replays the same on its own.
    """

    def __init__(self) -> None:
        self.current = VirtualClock()

    def time(self) -> float:
        return self.current.time()

    def monotonic(self) -> float:
        return self.current.monotonic()


@contextmanager
def virtual_time(clocks: Clocks) -> Iterator[None]:
    """Point ``time.time`` and ``time.monotonic`` (in every module) at the current clock of `clocks` in the block."""
    with mock.patch.object(time, "time", clocks.time), mock.patch.object(time, "monotonic", clocks.monotonic):
        yield


class SimLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time that knows how many jobs it has out on threads."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self.clock = clock
        self.on_threads: set[asyncio.Future[Any]] = set()

    def time(self) -> float:
        return self.clock.monotonic()

    def run_in_executor(self, executor: Executor | None, func: Callable[[*_Ts], _T], *args: *_Ts) -> asyncio.Future[_T]:
        future = super().run_in_executor(executor, func, *args)
        self.on_threads.add(future)
        future.add_done_callback(self.on_threads.discard)
        return future

    def ready_count(self) -> int:
        """How many callbacks wait to run now (CPython's ready queue)."""
        return len(self._ready)  # type: ignore[attr-defined]

    def next_timer(self) -> float | None:
        """The loop time of the earliest timer not cancelled (None: no timer)."""
        live = [h.when() for h in self._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
        return min(live) if live else None
