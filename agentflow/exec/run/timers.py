"""Durable timers: a paused run's signed wake time, and the rule for when a timer is due.

A run waits without holding anything: its paused checkpoint carries ``wake`` (signed with
the rest of the body): ``{"at": T, "for": "timer"}`` after a `Wait` node, or
``{"at": T, "for": "approval"}`` when every pending approval has a deadline. No worker,
thread, lease or broker message is kept for it. A sweeper (a Celery worker's recover_all
on the beat, or `agentflow.flow._timers` in process) finds paused runs whose timer is due
and wakes each through `RunProtocol.wake`: a ``wake`` claim (a compare-and-set on the next
step, so of two sweepers one wins), then the next superstep. Invariants:
- only a paused checkpoint carries a timer; every later checkpoint drops it, so a person
  who resumes the run first leaves the timer nothing to do;
- a wake before ``at`` is refused (`NotDue`): a forged or early message wakes nothing; a
  parent waiting for child runs (``{"for": "child", "runs": [...]}``) is due once one of
  them ended (`a_child_ended`);
- the wake is recorded in the claim (``woke``: when it was due, what for, and what a
  deadline decided), signed like any decision.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from agentflow._errors import CheckpointConflict, CheckpointNotFound, CheckpointStoreCorrupt
from agentflow._run_types import RunStatus
from agentflow.exec.checkpoints import CheckpointStore, SealedCheckpoint
from agentflow.exec.seal import Sealer

#: What a timer may wake a run for.
WAKES = ("timer", "approval", "child")

#: A run that ended: what a parent waiting for a child waits for.
ENDED = (RunStatus.DONE, RunStatus.FAILED, RunStatus.CANCELLED)


class NotDue(CheckpointConflict):
    """Raised when a run's timer is asked to wake it before it is due; nothing is done."""

    def __init__(self, run_id: str, at: float) -> None:
        super().__init__(run_id, at)
        self.run_id, self.at = run_id, at

    def __str__(self) -> str:
        return f"run {self.run_id!r} waits until {self.at:.3f} (seconds since the epoch): its timer is not due yet"


def wake_of(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The timer a checked paused checkpoint body carries (None: none).

    Raises:
        CheckpointStoreCorrupt: the field is malformed (signed, so written by a faulty writer).
    """
    wake = body.get("wake")
    if wake is None:
        return None
    at: Any = wake.get("at") if isinstance(wake, dict) else None
    ok = isinstance(at, int | float) and not isinstance(at, bool) and math.isfinite(at)
    if not ok or wake.get("for") not in WAKES:
        raise CheckpointStoreCorrupt(f"a checkpoint's timer is malformed: {wake!r}")
    if wake["for"] != "child":
        return {"at": float(at), "for": str(wake["for"])}
    runs = wake.get("runs")
    if not isinstance(runs, list) or not runs or not all(isinstance(r, str) for r in runs):
        raise CheckpointStoreCorrupt(f"a checkpoint's wait for child runs is malformed: {wake!r}")
    return {"at": float(at), "for": "child", "runs": list(runs)}


async def a_child_ended(store: CheckpointStore, sealer: Sealer, wake: Mapping[str, Any]) -> bool:
    """Whether a child run a parent waits for (``for: child``) has ended (its latest checkpoint checked)."""
    for run_id in wake["runs"]:
        try:
            row = await store.latest(run_id)
        except CheckpointNotFound:
            continue  # not started yet: the parent's wake reruns the node, which starts it
        sealer.open_checkpoint(row, run_id)
        if row.status in ENDED:
            return True
    return False


def due(wake: Mapping[str, Any]) -> float:
    """When a timer is due (seconds since the epoch)."""
    return float(wake["at"])


def due_at(row: SealedCheckpoint, body: Mapping[str, Any]) -> float | None:
    """When the run whose latest checked checkpoint is `row` should be woken (None: no timer waits)."""
    if row.status != RunStatus.PAUSED:
        return None
    wake = wake_of(body)
    return None if wake is None else due(wake)
