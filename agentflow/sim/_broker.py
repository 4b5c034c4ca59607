"""The message broker of the simulation: at-least-once delivery, with messages lost, doubled or late.

Messages carry what a Celery superstep message carries (flow, run id, step, cause) and
whether it is a redelivery, which is what makes a worker treat it as a recovery rather
than a clean handoff (`agentflow.celery._tasks.AgentflowTasks.handoff`). A message a worker
held when it crashed comes back later as a redelivery (the broker's visibility timeout),
or never (it was acknowledged early, or the broker lost it): the sweep must find the run.
A doubled message is a redelivery (flagged) or a publisher's retry (not flagged: the
second copy looks like a first delivery, a clean handoff).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace

#: Causes whose first delivery is a clean handoff (as the Celery tasks judge it).
HANDOFF_CAUSES = frozenset({"next", "start", "resume", "wake"})


@dataclass(frozen=True)
class Message:
    """One superstep message."""

    flow: str
    run_id: str
    step: int
    cause: str
    redelivered: bool = False
    due: float = 0.0
    id: int = 0

    @property
    def handoff(self) -> bool:
        """Whether the worker may take it as a clean handoff."""
        return self.cause in HANDOFF_CAUSES and not self.redelivered

    def __str__(self) -> str:
        again = " (redelivered)" if self.redelivered else ""
        return f"{self.cause} {self.run_id}@{self.step}{again}"


@dataclass
class MessageFaults:
    """How often the broker loses, doubles or delays a message it is given."""

    lost: float = 0.0
    doubled: float = 0.0
    late: float = 0.0


@dataclass
class Broker:
    """The queue every worker reads (virtual time: a message is deliverable once its `due` has come)."""

    rng: random.Random
    faults: MessageFaults = field(default_factory=MessageFaults)
    queue: list[Message] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    def send(self, msg: Message, now: float, delay: float, fires: Callable[[str], bool]) -> list[str]:
        """Enqueue `msg` after `delay`; return what the faults did to it (for the log).

        Every draw is made whether or not its fault applies (`fires` says), so suppressing
        one fault leaves the rest of the schedule's draws where they were.
        """
        msg = replace(msg, due=now + delay, id=next(self._ids))
        lost, late, later, doubled, again, flagged = (self.rng.random() for _ in range(6))
        if lost < self.faults.lost and fires("lost"):
            return [f"lost {msg}"]
        what = []
        if late < self.faults.late and fires("late"):
            msg = replace(msg, due=msg.due + 5.0 + 115.0 * later)
            what.append(f"late {msg}")
        self.queue.append(msg)
        if doubled < self.faults.doubled and fires("doubled"):
            # A redelivery is flagged as one; a publisher's retry after a lost confirm is not.
            twin = replace(msg, redelivered=flagged < 0.5, id=next(self._ids), due=msg.due + 120.0 * again)
            self.queue.append(twin)
            what.append(f"doubled {twin}")
        return what

    def redeliver(self, msg: Message, now: float) -> None:
        """A message whose worker died comes back, marked redelivered (after the visibility timeout)."""
        self.queue.append(replace(msg, redelivered=True, due=now + self.rng.uniform(30.0, 300.0), id=next(self._ids)))

    def echo(self, msg: Message, due: float) -> None:
        """A twin of `msg` its publisher sent (unflagged: it looks like a first delivery), due at `due`."""
        self.queue.append(replace(msg, redelivered=False, due=due, id=next(self._ids)))

    def deliverable(self, now: float) -> bool:
        """Whether some message is due."""
        return any(m.due <= now for m in self.queue)

    def take(self, now: float) -> Message:
        """Hand one due message (chosen by the seed) to a worker."""
        due = [m for m in self.queue if m.due <= now]
        msg = self.rng.choice(due)
        self.queue.remove(msg)
        return msg

    def next_due(self, now: float) -> float | None:
        """When the next message not yet due becomes deliverable."""
        later = [m.due for m in self.queue if m.due > now]
        return min(later) if later else None
