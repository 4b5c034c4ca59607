"""Events: what a run reports while it goes, and the small hub that delivers them.

Names in use (data in parentheses):
- ``run.started`` (flow), ``run.finished`` (flow, status), ``run.recovered`` (kind, step,
  replayed, rerun), ``run.paused`` (pending)
- ``node.started`` / ``node.finished`` (node, superstep)
- ``tool.started`` (tool, call_id, attempt), ``tool.finished`` (tool, call_id, ms),
  ``tool.failed`` (tool, call_id, error, ms), ``tool.retrying`` (tool, call_id, attempt, delay_s),
  ``tool.replayed`` (tool, call_id), ``tool.rerun`` (tool, call_id): a call in doubt runs again
- ``checkpoint.saved`` (kind, step, status, flow, or loop and stage, unreplayed, claim, segment,
  seconds): ``claim`` is the claim's cause (None for a checkpoint that ends a step), ``seconds``
  the time since this process last saved the run or took it up
- ``run.parked`` (step, tools): a worker parked the run on calls in doubt (their tools)
- ``lease.lost`` (owner): a holder's renewal found the run's lease lapsed or taken over
- ``runs.swept`` (waiting): a worker's recover_all counted the runs waiting for a person,
  per flow and reason (``agentflow.celery._waiting``); no run id
- ``run.cancel_requested`` (holder, reason, operator): a live worker holds the run, so a
  signed cancel request was left for it; ``run.cancelled`` (kind, step, reason, operator)
- ``control.refused`` (kind, why): a control request that does not check was ignored and removed
- ``run.unlisted`` (flow, relisted, why): `recover_all(sweep=True)` found a run with stored
  rows and no listing entry, and listed it again (or says why not)

A subscriber that raises is logged and ignored: observing a run never breaks it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("agentflow.events")


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
    """A hub: `subscribe` a callback, get back a function that unsubscribes it."""

    def __init__(self) -> None:
        self._subscribers: list[Subscriber] = []

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call `callback` with every event from now on; return the unsubscribe function."""
        self._subscribers.append(callback)

        def unsubscribe() -> None:
            if callback in self._subscribers:
                self._subscribers.remove(callback)

        return unsubscribe

    def emit(self, name: str, run_id: str | None, **data: Any) -> None:
        """Deliver an event to every subscriber."""
        if not self._subscribers:
            return
        event = Event(name, run_id, data)
        for callback in list(self._subscribers):
            try:
                callback(event)
            except Exception:
                log.exception("event subscriber %r failed on %s", callback, name, extra={"run_id": run_id})
