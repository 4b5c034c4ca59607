"""Events: what a run reports while it goes, and the small hub that delivers them.

Names in use (data in parentheses):
- ``run.started`` (kind, and flow, or loop and stage): step 0 is saved; ``run.finished``
  (flow or loop, status, and error when it failed), ``run.recovered`` (kind, step, replayed,
  rerun), ``run.paused`` (pending)
- ``node.started`` / ``node.finished`` (node, superstep)
- ``model.text`` (loop, turn, text): a streamed model request's text as it comes (a durable
  pydantic-ai agent built with ``stream=True``)
- ``tool.started`` (tool, call_id, attempt), ``tool.finished`` (tool, call_id, ms),
  ``tool.failed`` (tool, call_id, error, ms), ``tool.retrying`` (tool, call_id, attempt, delay_s),
  ``tool.replayed`` (tool, call_id), ``tool.rerun`` (tool, call_id): a call in doubt runs again;
  ``tool.withheld`` (tool, call_id, owner): its worker could not confirm its lease right before the
  tool would run (it lapsed or was taken over), so the tool did not run and the call stays in doubt
- ``checkpoint.saved`` (kind, step, status, flow, or loop and stage, unreplayed, claim, segment,
  seconds): ``claim`` is the claim's cause (None for a checkpoint that ends a step), ``seconds``
  the time from this process's last save of the run (or its taking the run up) to this save
- ``run.parked`` (step, tools): a worker parked the run on calls in doubt (their tools)
- ``lease.lost`` (owner): a holder's renewal found the run's lease lapsed or taken over
- ``lease.taken_over`` (owner, earlier): a runner with an identity took over the lease an earlier
  life of its own process held (`agentflow.exec.run.lease.Ownership.restartable`)
- ``runs.swept`` (waiting, unfinished): a worker's recover_all counted the runs waiting for a
  person, per flow and reason, and the unfinished runs and the oldest one's age, per flow
  (``agentflow.celery._stranded``); no run id
- ``run.cancel_requested`` (holder, reason, operator): a live worker holds the run, so a
  signed cancel request was left for it; ``run.cancelled`` (kind, step, reason, operator)
- ``run.migrated`` (kind, step, from, to, at, operator): an operator moved the run onto another
  version of its flow (the signed ``migrate`` claim is at `step`)
- ``run.waiting`` (until): a `Wait` node paused the run until a time; ``run.woken`` (kind, step,
  late_s, at, for, and what a deadline decided): a due timer woke it (the ``wake`` claim is at `step`);
  ``run.paused`` also carries ``wake`` when the approvals have a deadline
- ``call.waiting`` (tool or model, call_id, limit, why, wait_s): a call waits for a slot of a
  shared limit (why: ``concurrency``, ``rate`` or ``closed``), said again only when the reason changes;
  ``call.admitted`` (tool or model, call_id, waited_s): it got every slot and starts;
  ``limit.closed`` (tool or model, call_id, limit, retry_after_s, closed_s): the call's provider
  said 429, so the limit is closed for every worker sharing it (`agentflow.exec.limits`)
- ``control.refused`` (kind, why): a control request that does not check was ignored and removed
- ``run.unlisted`` (flow, relisted, why): `recover_all(sweep=True)` found a run with stored
  rows and no listing entry, and listed it again (or says why not)

A subscriber that raises is logged and ignored: observing a run never breaks it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Final

log = logging.getLogger("agentflow.events")

#: Every name above a run's stream can carry (``runs.swept`` has no run): a page that follows a
#: run listens for these (a test holds them to every name agentflow emits).
RUN_EVENT_NAMES: Final = (
    "run.started",
    "run.finished",
    "run.paused",
    "run.recovered",
    "run.parked",
    "run.cancel_requested",
    "run.cancelled",
    "run.retried",
    "run.forked",
    "run.quarantined",
    "run.unknown_flow",
    "run.unlisted",
    "run.migrated",
    "run.waiting",
    "run.woken",
    "node.started",
    "node.finished",
    "model.text",
    "tool.started",
    "tool.finished",
    "tool.failed",
    "tool.retrying",
    "tool.replayed",
    "tool.rerun",
    "tool.withheld",
    "call.waiting",
    "call.admitted",
    "limit.closed",
    "checkpoint.saved",
    "lease.lost",
    "lease.taken_over",
    "control.refused",
)


@dataclass(frozen=True, slots=True)
class Event:
    """One thing that happened in a run."""

    name: str
    """Dotted event name, e.g. ``checkpoint.saved``."""
    run_id: str | None
    """The run it happened in (None for events outside a run)."""
    data: dict[str, Any] = field(default_factory=dict)
    """Event-specific fields (see the module docstring)."""
    at: float = field(default_factory=time.time)
    """Wall-clock time of the event."""


Subscriber = Callable[[Event], None]


class Events:
    """A hub: `subscribe` a callback, get back a function that unsubscribes it.

    With ``record=True``, the events of each run are also appended to the run's stream in
    its store while a runner on this hub holds the run (`agentflow.exec.run.events`), for
    any process to read or follow. Off by default: recording seals and stores every event,
    which costs a superstep on the memory store as much as the superstep itself; the
    Celery workers record (their supersteps take milliseconds, and following a run from
    another process is what the stream is for there).
    """

    def __init__(self, *, record: bool = False) -> None:
        self.record = record
        """Whether runners on this hub record their runs' events into the runs' streams."""
        #: Replaced, never changed in place: an emit goes on over the subscribers it started with.
        self._subscribers: tuple[tuple[Subscriber, frozenset[str] | None], ...] = ()
        #: The names some subscriber wants (None: some subscriber wants every event).
        self._wanted: frozenset[str] | None = frozenset()

    def subscribe(self, callback: Subscriber, names: Collection[str] | None = None) -> Callable[[], None]:
        """Call `callback` with every event from now on (only those named in `names`, if given).

        An event no subscriber wants is never built: a hub whose subscribers want a few
        names costs the others nothing but a set lookup.

        Returns:
            The function that unsubscribes it.
        """
        entry = (callback, None if names is None else frozenset(names))
        self._subscribers += (entry,)
        self._rewant()

        def unsubscribe() -> None:
            if entry in self._subscribers:
                self._subscribers = tuple(e for e in self._subscribers if e is not entry)
                self._rewant()

        return unsubscribe

    def _rewant(self) -> None:
        wanted: frozenset[str] | None = frozenset()
        for _, names in self._subscribers:
            wanted = None if names is None or wanted is None else wanted | names
        self._wanted = wanted

    def wants(self, name: str) -> bool:
        """Whether some subscriber wants events named `name` (an event nobody wants need not be built)."""
        wanted = self._wanted
        return wanted is None or name in wanted

    def emit(self, name: str, run_id: str | None, **data: Any) -> None:
        """Deliver an event to every subscriber that wants it."""
        wanted = self._wanted
        if wanted is not None and name not in wanted:
            return
        self.deliver(Event(name, run_id, data))

    def deliver(self, event: Event) -> None:
        """Deliver an event built beforehand (the one a save carries into the store: `agentflow.exec.run.steps`)."""
        name = event.name
        for callback, names in self._subscribers:
            if names is not None and name not in names:
                continue
            try:
                callback(event)
            except Exception:
                who = getattr(callback, "__qualname__", None) or repr(callback)
                log.exception("event subscriber %s failed on %s", who, name, extra={"run_id": event.run_id})
