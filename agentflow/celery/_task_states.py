"""What Flower shows of a superstep task after the fact: the tasks a later task settles.

Flower keeps each task in the state its last event gave it. Two kinds of task would stay in a
state that stopped being true:

- A task that asked a person (``PAUSED``: an approval; ``NEEDS_DECISION``: calls in doubt)
  stays listed under that state after the person answered, so ``state:NEEDS_DECISION`` would
  list answered runs beside the ones that wait. So the task that asks leaves the marker
  ``asked/<run>`` (`agentflow.exec.run.markers`: signed, in the store) naming itself; the task
  that spends the answer (a ``resume``, a ``rerun`` of a decision, a ``retry``, a
  ``migrate``), or the client that cancels the run, takes the marker and moves the asking
  task to ``ANSWERED`` (an event for its id, and its result in the backend). What
  ``state:NEEDS_DECISION`` and ``state:PAUSED`` list is then what waits for a person now.
- A task whose worker was killed stays ``STARTED``: its message is handed out again only
  after the broker's visibility timeout (an hour on Redis). Each ``started`` record names
  the task it served (`agentflow.exec.context.delivering`), so the task that recovers the
  run (it replays or reruns the cut-off calls, or parks the run on them) moves each task
  named by those calls' ``started`` records, other than itself, to ``LOST``.

No-op supersteps are apart too: ``SKIPPED`` (a duplicate or late message, a run held by
another worker or moved on, a message sent on to the queue of the run's flow version) and
``REFUSED`` (a message no signed decision backs). ``SUCCESS`` is left for supersteps that
moved a run.

Moving another task's state is one event and one backend write, best effort: a broker or
backend that fails here costs a stale line in Flower, never a run's progress (a WARNING says so).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any, Final

from celery import Celery

from agentflow.exec.calls.read import read_log
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.run.markers import Markers
from agentflow.exec.seal import Sealer

log = logging.getLogger("agentflow.celery")

#: The states a superstep ends in that say nothing moved.
SKIPPED, REFUSED = "SKIPPED", "REFUSED"
#: The states a later task gives a task: its question was answered; its worker died in it.
ANSWERED, LOST = "ANSWERED", "LOST"
#: The marker of the task that asked a person about a run: ``asked/<run>``.
ASKED: Final = "asked"
#: How long the marker waits for an answer (then the asking task stays as it is).
ASKED_TTL_S: Final = 90 * 24 * 3600.0
#: The causes of a superstep that spends a person's answer.
ANSWERING: Final = frozenset({"resume", "rerun", "retry", "migrate"})


async def asked(markers: Markers, run_id: str, task_id: str, state: str) -> None:
    """Note that task `task_id` asked a person about `run_id` (it ends in `state`), replacing an older note."""
    await markers.take_all(ASKED, [run_id])
    await markers.put(ASKED, run_id, {"task": task_id, "state": state}, ASKED_TTL_S)


async def answered(markers: Markers, run_id: str) -> list[str]:
    """Take the run's note of the task that asked; the ids of the tasks it named (none: nobody asked)."""
    return [str(note.body.get("task")) for note in await markers.take_all(ASKED, [run_id]) if note.body.get("task")]


async def lost_tasks(store: CheckpointStore, sealer: Sealer, run_id: str, calls: Collection[str], own: str) -> set[str]:
    """The tasks, other than `own`, that logged a ``started`` of one of `calls` (a cut-off superstep's calls)."""
    if not calls:
        return set()
    found = set()
    for rec in await read_log(store, sealer, run_id):
        task = rec.body.get("task")
        if rec.kind == "started" and rec.body.get("call_id") in calls and isinstance(task, str) and task != own:
            found.add(task)
    return found


def settle(app: Celery, task_ids: Collection[str], state: str, result: dict[str, Any]) -> None:
    """Move each task of `task_ids` to `state` in Flower (an event) and in the result backend (best effort)."""
    if not task_ids:
        return
    try:
        with app.events.default_dispatcher() as dispatcher:
            for task_id in task_ids:
                app.backend.store_result(task_id, result, state)
                dispatcher.send(f"task-{state.lower()}", uuid=task_id, result=repr(result), run_id=result.get("run_id"))
    except Exception as exc:  # a stale line in Flower, not a run's progress
        log.warning("could not mark tasks %s %s in Flower: %s", sorted(task_ids), state, exc)
