"""Calls waiting for a shared limit, as a run's event stream tells it.

A call waiting for a slot of a limit has no record in the call log (nothing is logged
``started`` before it holds its slots), so only the run's events say that it waits:
``call.waiting`` when a wait begins (and when its reason changes), ``call.admitted`` when
it ends. `open_waits` folds a run's stored events (oldest first) into the waits still open:

- ``call.waiting`` opens a wait for its call, or changes the reason of the open one (its
  start stays the time the wait began);
- any later event naming the same call closes it (``call.admitted``, ``tool.started``,
  ``tool.failed``, ...);
- a step boundary or a change of holder closes every open wait (`_CLOSE_ALL`): the calls
  of a superstep are over once it is saved, and a worker that stopped waits no more.

Invariants:
- Only events that checked are read (`read_events` seals and opens each); one that did not
  (`RunEvent.problem`) says nothing.
- The read model asks only about a run that a live worker holds (`run.read.read_run`):
  the wait of a worker whose lease lapsed is no wait.
- Reading is bounded: a store keeps a run's newest `EVENTS_KEPT` events.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.run.events import RunEvent, read_events
from agentflow.exec.run.view import LimitWait
from agentflow.exec.seal import Sealer

#: Events after which no wait of the run is open: a step saved, the run claimed, ended, paused, or its lease lost.
_CLOSE_ALL: Final = frozenset(
    {"checkpoint.saved", "run.recovered", "run.finished", "run.paused", "run.cancelled", "lease.lost"}
)
#: How many events one read of the stream asks for.
_PAGE: Final = 1000


def _caller(data: dict[str, object]) -> str:
    """The tool a waiting call calls, or ``model <provider>`` for a tool loop's model call."""
    if data.get("tool") is not None:
        return str(data["tool"])
    return f"model {data.get('model') or ''}".rstrip()


def open_waits(events: Iterable[RunEvent]) -> list[LimitWait]:
    """The waits for a limit that `events` (a run's stream, oldest first) leave open, oldest first."""
    waits: dict[str, LimitWait] = {}
    for event in events:
        if event.problem is not None:
            continue
        if event.name in _CLOSE_ALL:
            waits.clear()
            continue
        call_id = event.data.get("call_id")
        if not isinstance(call_id, str):
            continue
        if event.name != "call.waiting":
            waits.pop(call_id, None)
            continue
        began = waits[call_id].since if call_id in waits else event.at
        limit, why = str(event.data.get("limit", "")), str(event.data.get("why", ""))
        waits[call_id] = LimitWait(call_id, _caller(event.data), limit, why, began)
    return sorted(waits.values(), key=lambda wait: wait.since)


async def read_limit_waits(store: CheckpointStore, sealer: Sealer, run_id: str) -> list[LimitWait]:
    """The run's calls waiting for a limit now, from its stored event stream (none if the store keeps none).

    Raises:
        CheckpointError: the store failed while reading the stream.
    """
    events: list[RunEvent] = []
    after: str | None = None
    while True:
        batch = await read_events(store, sealer, run_id, after, _PAGE)
        events += batch
        if len(batch) < _PAGE:
            return open_waits(events)
        after = batch[-1].cursor
