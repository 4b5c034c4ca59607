"""Where a waiting command learns how its run moves: this process's events, or the run's stored rows.

- `moving_here`: while this process runs a run (``resume``, ``retry``, ``fork --run``,
  ``migrate --run``, ``recover``), the runner's event hub tells every step as it happens.
  The first checkpoint it saves for a run (the claim: the action was accepted) starts the
  wait's line; each ``checkpoint.saved`` gives the run's status and step, and the calls
  under way (``tool.started``, ``call.waiting``) feed the spinner. A command refused
  before it saves anything (a held run, a run not paused) says nothing here: its error is
  its one line.
- `polling_rows`: while a worker moves it (``--workers``), the run's newest checkpoint,
  read and checked every `POLL_S`: its status (``waiting for a decision`` when a worker
  parked it), its step and who saved it. Only progress comes from here: the wait beside it
  (`FlowClient.settle`) decides when the run has settled, and the read model reports it.

Neither holds the run nor writes anything.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Final

from agentflow._errors import AgentflowError
from agentflow._events import Event, Events
from agentflow.cli._progress import WAITING_FOR_DECISION, Progress
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.run.checks import checked_latest
from agentflow.exec.run.control import control_of, parked
from agentflow.exec.seal import Sealer

#: How often the run's newest checkpoint is read while a worker moves it (seconds).
POLL_S: Final = 0.25
#: What a command running the run here waits for.
HERE: Final = "it runs in this process, its tools too, until it ends, pauses or waits for a decision"
#: The events `moving_here` listens to.
_NAMES: Final = ("checkpoint.saved", "tool.started", "tool.finished", "tool.failed", "call.waiting", "call.admitted")


def _on_event(progress: Progress, event: Event) -> None:
    run_id, data = event.run_id, event.data
    if run_id is None:
        return
    if event.name == "checkpoint.saved":
        progress.waiting(run_id, HERE)
        step = data.get("step")
        progress.saw(run_id, str(data.get("status")), step if isinstance(step, int) else None)
    elif event.name == "tool.started":
        progress.doing(run_id, f"calling {data.get('tool')}")
    elif event.name == "call.waiting":
        caller = data.get("tool") or f"model {data.get('model') or ''}".rstrip()
        progress.doing(run_id, f"{caller} waits for limit {data.get('limit')} ({data.get('why')})")
    else:
        progress.doing(run_id, "")


@contextlib.asynccontextmanager
async def moving_here(events: Events, progress: Progress) -> AsyncIterator[None]:
    """Report on stderr each run this process moves while inside (the spinner too, on a terminal)."""
    unsubscribe = events.subscribe(lambda event: _on_event(progress, event), _NAMES)
    try:
        async with progress.spinning():
            yield
    finally:
        unsubscribe()


async def _poll(progress: Progress, store: CheckpointStore, sealer: Sealer, run_id: str, every_s: float) -> None:
    while True:
        try:
            row, body = await checked_latest(store, sealer, run_id)
            by = control_of(body).by or ""
        except (AgentflowError, OSError):  # the wait beside it reads the run and says what is wrong
            return
        progress.saw(run_id, WAITING_FOR_DECISION if parked(body) else row.status, row.step, by)
        await asyncio.sleep(every_s)


@contextlib.asynccontextmanager
async def polling_rows(
    progress: Progress, store: CheckpointStore, sealer: Sealer, run_id: str, *, every_s: float = POLL_S
) -> AsyncIterator[None]:
    """Report the run's status from its newest checkpoint while inside (the spinner too, on a terminal)."""
    task = asyncio.create_task(_poll(progress, store, sealer, run_id, every_s))
    try:
        async with progress.spinning():
            yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
