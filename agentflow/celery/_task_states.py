"""What Flower shows of a superstep task after the fact: the tasks a later task settles.

Flower keeps each task in the state its last event gave it. Two kinds of task would stay in a
state that stopped being true:

- A task that asked a person (``PAUSED``: an approval; ``NEEDS_DECISION``: calls in doubt)
  stays listed under that state after the person answered, so ``state:NEEDS_DECISION`` would
  list answered runs beside the ones that wait. So the task that asks leaves the marker
  ``asked/<run>`` (`agentflow.exec.run.markers`: signed, in the store) naming itself; the task
  that spends the answer (a ``resume``, a ``rerun`` of a decision, a ``retry``, a
  ``migrate``) takes the marker and moves the asking task to ``ANSWERED`` (an event for its
  id, and its result in the backend). A client that cancels the run sends
  ``agentflow.mark_answered`` instead, and the worker that takes it does the same once the
  run has ended (`answered_once_ended`; a message about a run that still waits moves
  nothing). What ``state:NEEDS_DECISION`` and ``state:PAUSED`` list is then what waits for a
  person now.
- A task whose worker was killed stays ``STARTED``: its message is handed out again only
  after the broker's visibility timeout (an hour on Redis). Each ``started`` record names
  the task it served (`agentflow.exec.context.delivering`) and the process that served it
  (the lease holder ``<node>:<pid>``), so the task that recovers the run (it replays or
  reruns the cut-off calls, or parks the run on them) moves each task named by those calls'
  ``started`` records, other than itself, to ``LOST``; its result names the worker it was
  lost on (``lost_on``: the node name Flower lists it under, and ``lost_pid``).

Whose name the settling event carries. Celery's event state, which Flower shows, files
every task event except ``task-sent`` under the worker named by its ``hostname``: it makes
that worker if it did not know it, counts it online for two heartbeat periods from the
event's arrival (two minutes for a name it never had a heartbeat from), and shows it in the
task's Worker column. So:

- The event is sent under the settling worker's own node name (``task.request.hostname``,
  as Celery's own task events are), never under Celery's anonymous ``gen<pid>@<host>``,
  which Flower would list as a worker, online for two minutes. The settling worker is
  alive: counting it online is true.
- It is never sent under the name of the worker that died: that would count a dead worker
  online again. So a ``LOST`` task's Worker column names the worker that marked it lost,
  and ``lost_on`` in its result names the one that died.
- A client (`FlowClient.cancel`, the CLI, the viewer) sends no Flower event: Celery's event
  state has no task event that a non-worker may send about a task that ran (``task-sent``
  sets no state past ``PENDING``), and any other would list the client as a worker. It
  sends the ``mark_answered`` message, and the worker that takes it settles the task.

No-op supersteps are apart too: ``SKIPPED`` (a duplicate or late message, a run held by
another worker or moved on, a message sent on to the queue of the run's flow version) and
``REFUSED`` (a message no signed decision backs). ``SUCCESS`` is left for supersteps that
moved a run.

Moving another task's state is one event and one backend write, best effort: a broker or
backend that fails here costs a stale line in Flower, never a run's progress (a WARNING says so).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import Any, Final

from celery import Celery

from agentflow._errors import CheckpointNotFound, CheckpointStoreCorrupt
from agentflow.exec.calls.read import read_log
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.checkpoints.records import ENDED
from agentflow.exec.run.checks import checked_latest
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


async def answered_once_ended(store: CheckpointStore, sealer: Sealer, markers: Markers, run_id: str) -> list[str]:
    """Take the run's note of the task that asked, if the run has ended; the ids of the tasks it named.

    Nothing while the run has not ended (or its head is unknown or fails its check): the note
    stays, for the task that spends the answer. So a message alone settles nothing that waits.
    """
    try:
        row, _ = await checked_latest(store, sealer, run_id)
    except (CheckpointNotFound, CheckpointStoreCorrupt):
        return []
    return await answered(markers, run_id) if row.status in ENDED else []


async def lost_tasks(
    store: CheckpointStore, sealer: Sealer, run_id: str, calls: Collection[str], own: str
) -> dict[str, str | None]:
    """The tasks, other than `own`, that logged a ``started`` of one of `calls` (a cut-off superstep's calls).

    Each with the process that served it, as its ``started`` records name it (``<node>:<pid>``; None: they do not).
    """
    if not calls:
        return {}
    found: dict[str, str | None] = {}
    for rec in await read_log(store, sealer, run_id):
        task, on = rec.body.get("task"), rec.body.get("on")
        if rec.kind == "started" and rec.body.get("call_id") in calls and isinstance(task, str) and task != own:
            found[task] = on if isinstance(on, str) else found.get(task)
    return found


def lost_on(holder: str | None) -> dict[str, Any]:
    """What a ``LOST`` task's result says of the process it was lost with (`holder`: ``<node>:<pid>``)."""
    if not holder:
        return {}
    node, _, pid = holder.rpartition(":")
    return {"lost_on": node, "lost_pid": int(pid)} if node and pid.isdigit() else {"lost_on": holder}


def settle(app: Celery, results: Mapping[str, dict[str, Any]], state: str, node: str | None) -> None:
    """Move each task of `results` to `state` with its result, in the result backend and in Flower (best effort).

    The Flower event is sent under `node`, the sending worker's own node name (see the module
    docstring); with none (a task body run outside a worker), no event is sent.
    """
    if not results:
        return
    try:
        for task_id, result in results.items():
            app.backend.store_result(task_id, result, state)
        if node:
            with app.events.default_dispatcher(hostname=node) as dispatcher:
                for task_id, result in results.items():
                    event = f"task-{state.lower()}"
                    dispatcher.send(event, uuid=task_id, result=repr(result), run_id=result.get("run_id"))
    except Exception as exc:  # a stale line in Flower, not a run's progress
        log.warning("could not mark tasks %s %s in Flower: %s", sorted(results), state, exc)
