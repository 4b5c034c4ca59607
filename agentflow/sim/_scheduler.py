"""The scheduler: who runs next, where the faults land, and the log that replays a schedule.

Moving parts:
- An *actor* is one simulated process (a worker, the sweep, the operator, a client). Every
  asyncio task an actor starts inherits its name through `ACTOR` (tasks copy the context
  they are made in, timers too), so a lease renewal or an event flush belongs to the
  worker that started it.
- A *point* (`Scheduler.point`) is a place where the real system could interleave: every
  store operation (before it takes effect and after it returned), every tool's start,
  effect and return, every message delivery. The task parks there on a future; nothing
  else of it runs until the scheduler resolves that future.
- Between points a task runs alone. `settle` waits until every task is parked, waiting
  for a timer, or done; then `step` makes one choice, drawn from one seeded generator:
  resume one parked task, move the clock to the next timer, or inject a fault.

A crash is not a cancellation: a crashed actor's parked tasks are never resumed (no
``finally`` runs, no lease is released, exactly as after SIGKILL), and a task of it that
reaches a point later parks there for good. A stall keeps the actor's tasks parked until
the clock has passed the stall's end; then it carries on with whatever it believed.

Every choice is logged (`Choice`); the log of a failing seed is the schedule it printed.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field

from agentflow.sim._clock import SimLoop, VirtualClock

#: The actor the current task belongs to.
ACTOR: ContextVar[str] = ContextVar("agentflow_sim_actor", default="world")


@dataclass
class Parked:
    """A task waiting at a point for the scheduler to let it go on."""

    actor: str
    point: str
    future: asyncio.Future[None]
    ready: Callable[[], bool] | None = None
    """None: always ready; else resumable only while this says so (a receive waits for a message)."""
    seq: int = 0
    run_id: str | None = None
    """The run whose rows the write at this point writes (None: not such a write)."""


@dataclass(frozen=True)
class Choice:
    """One decision of the scheduler, as the log shows it."""

    step: int
    at: float
    what: str

    def __str__(self) -> str:
        return f"{self.step:>7} t={self.at:9.3f}  {self.what}"


@dataclass
class Stats:
    """What a simulation did, for its report."""

    steps: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    #: (fault kind, point) pairs that fired: which points a crash, a stall or a failure ever hit.
    covered: set[tuple[str, str]] = field(default_factory=set)
    #: Every point some task parked at.
    points: set[str] = field(default_factory=set)


class Scheduler:
    """Owns the order of events: the parked tasks, the dead and stalled actors, the clock and the log."""

    def __init__(self, rng: random.Random, clock: VirtualClock, loop: SimLoop, keep_log: int = 400) -> None:
        self.rng = rng
        self.clock = clock
        self.loop = loop
        self.parked: list[Parked] = []
        #: The parked tasks of crashed actors: never resumed, only cancelled when the episode is torn down.
        self.graveyard: list[Parked] = []
        self.dead: set[str] = set()
        self.stalled: dict[str, float] = {}
        self.stats = Stats()
        self.log: list[Choice] = []
        self.keep_log = keep_log
        #: When set, points let every task through at once (tearing an episode down).
        self.open_gates = False
        self._seq = 0

    # -- what actors call -----------------------------------------------------------------

    async def point(self, name: str, ready: Callable[[], bool] | None = None, run_id: str | None = None) -> None:
        """Park the current task at `name` until the scheduler picks it (forever, if its actor crashed)."""
        if self.open_gates:
            return
        self._seq += 1
        self.stats.points.add(name)
        parked = Parked(ACTOR.get(), name, self.loop.create_future(), ready, self._seq, run_id)
        (self.graveyard if parked.actor in self.dead else self.parked).append(parked)
        await parked.future

    # -- what the driver calls ------------------------------------------------------------

    def note(self, what: str) -> None:
        """Log a choice (the log keeps the last `keep_log`)."""
        self.log.append(Choice(self.stats.steps, self.clock.now, what))
        if len(self.log) > self.keep_log * 2:
            del self.log[: -self.keep_log]

    async def settle(self) -> None:
        """Let every task run until it parks, waits for a timer, or ends (jobs on threads included)."""
        loop = self.loop
        while True:
            await asyncio.sleep(0)
            if loop.on_threads:
                await asyncio.wait(set(loop.on_threads))
                continue
            if loop.ready_count() == 0:
                return

    def runnable(self) -> list[Parked]:
        """Parked tasks that may be resumed now: not of a dead or stalled actor, and ready."""
        self._wake_stalled()
        # A task can leave its point on its own: a timeout around it (the Redis store's
        # per-operation deadline, on virtual time) cancels the wait. It is no longer parked.
        self.parked = [p for p in self.parked if not p.future.done()]
        return [
            p
            for p in self.parked
            if p.actor not in self.dead and p.actor not in self.stalled and (p.ready is None or p.ready())
        ]

    def resume(self, parked: Parked) -> None:
        """Let one parked task go on."""
        self.parked.remove(parked)
        parked.future.set_result(None)

    def crash(self, actor: str) -> None:
        """The actor dies: none of its tasks is ever resumed again."""
        self.dead.add(actor)
        self.graveyard.extend(p for p in self.parked if p.actor == actor)
        self.parked = [p for p in self.parked if p.actor != actor]

    def stall(self, actor: str, until: float) -> None:
        """The actor freezes until the clock passes `until` (virtual seconds since the start)."""
        self.stalled[actor] = until

    def wake(self, actor: str) -> None:
        """The actor's stall ends now (it lasted exactly until here)."""
        self.stalled.pop(actor, None)

    def _wake_stalled(self) -> None:
        for actor, until in list(self.stalled.items()):
            if self.clock.now >= until:
                del self.stalled[actor]

    def next_event(self, *others: float | None) -> float | None:
        """The virtual time of the earliest thing waiting on the clock: a timer, a stall's end, or one of `others`."""
        times = [t for t in others if t is not None]
        timer = self.loop.next_timer()
        if timer is not None:
            times.append(self.clock.since_start(timer))
        times.extend(self.stalled.values())
        later = [t for t in times if t > self.clock.now]
        due = [t for t in times if t <= self.clock.now]
        if due:
            return self.clock.now
        return min(later) if later else None

    def advance_to(self, when: float) -> None:
        """Move the clock to `when` (virtual seconds since the start; never back)."""
        if when > self.clock.now:
            self.clock.advance(when - self.clock.now)

    def drop_all(self) -> None:
        """Cancel every parked task, the dead ones' too (the episode is over: nothing runs any more)."""
        self.open_gates = True
        for parked in [*self.parked, *self.graveyard]:
            if not parked.future.done():
                parked.future.cancel()
        self.parked.clear()
        self.graveyard.clear()
