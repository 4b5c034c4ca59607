"""Runs waiting for their store's durability: the ``store-wait/<run>`` marker a worker leaves.

A superstep whose durable write (a non-idempotent call's ``started``, a claim) the store
could not confirm in time (`StoreNotDurable`) stopped before what needed it; its task is
sent again after a back-off, and once its retries are spent the run is left to
``recover_all``. Nothing in the run's rows says so: the worker leaves a signed marker
(`run.markers`) naming the step it stopped at, why, and when the next try is due, and the
read model (`run.read.read_run`) reports it as `StoreWait` while the run is still there.

Invariants:
- The marker only informs: nothing fences or decides on it, and a forged or stale one
  does not count (`Markers` checks its signature and its signed ``until``).
- It is shown only while the run is ``running`` at the step it names or the one after it
  (a claim that was not acknowledged may have stored that one); it lapses on its own.
"""

from __future__ import annotations

from typing import Final

from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.run.markers import Markers
from agentflow.exec.run.view import StoreWait
from agentflow.exec.seal import Sealer

#: The kind of marker that says a run waits for its store's durability.
KIND: Final = "store-wait"


async def note_store_wait(
    markers: Markers, run_id: str, step: int, why: str, retry_at: float | None, ttl_s: float
) -> None:
    """Leave the run's marker: it stopped at `step` for `why`, tried again at `retry_at` (None: by recover_all)."""
    for note in (await markers.peek(KIND, [run_id])).values():
        await markers.take(note)
    await markers.put(KIND, run_id, {"step": step, "why": why, "retry_at": retry_at}, ttl_s)


async def clear_store_wait(markers: Markers, run_id: str) -> None:
    """Remove the run's marker, if it has one (its superstep ran)."""
    await markers.take_all(KIND, [run_id])


async def read_store_wait(store: CheckpointStore, sealer: Sealer, run_id: str, step: int) -> StoreWait | None:
    """The run's wait for its store's durability, if its marker counts and names `step` or the step before it."""
    notes = await Markers(store, sealer).peek(KIND, [run_id])
    note = notes.get(run_id)
    if note is None:
        return None
    body = note.body
    stopped, why, retry_at = body.get("step"), body.get("why"), body.get("retry_at")
    if type(stopped) is not int or not isinstance(why, str) or step not in (stopped, stopped + 1):
        return None
    due = float(retry_at) if isinstance(retry_at, int | float) and not isinstance(retry_at, bool) else None
    return StoreWait(stopped, why, note.at, due)
