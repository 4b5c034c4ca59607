"""Reading a run that retention trimmed: where its stored history starts, and how readers say so.

A trim (`agentflow.exec.checkpoints.retention`) deletes every checkpoint of a finished run
but the newest; a run retried after a trim appends its new checkpoints after the kept one.
So the history of a trimmed run starts at a step k > 0 whose checkpoint ended the run (its
status, covered by its signature, is ``done``, ``failed`` or ``cancelled``). Readers accept
that start, and only that one (`kept_from`): a history that starts at a running or paused
checkpoint, or has a gap anywhere, still reports the missing checkpoints.

Such a start cannot be told from someone with write access to the store deleting the same
rows (a store signs nothing, and a trim needs no key). What a reader still proves of a
trimmed run is every kept checkpoint and the whole call log, which the kept checkpoint pins
(its log marker and pins): a record removed, reordered or replaced is still found. What it
cannot prove is the past states before step k. No finished call can run again because of
it: resume, retry and recovery read only the newest checkpoint and the call records.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentflow.exec.checkpoints.records import ENDED, SealedCheckpoint
from agentflow.exec.checkpoints.rules import trims


def kept_from(rows: Sequence[SealedCheckpoint]) -> int:
    """The step a run's stored history starts at: 0, or the ended checkpoint a retention trim kept.

    Only a flow run's: retention never trims a tool loop (`rules.trims`), so a loop whose
    history starts past 0 has lost checkpoints, and its readers say so.

    Args:
        rows: the run's checkpoint rows as stored, oldest first (`CheckpointStore.history`).
    """
    first = rows[0] if rows else None
    if first is not None and first.step > 0 and first.status in ENDED and trims(first.flow):
        return first.step
    return 0


def trimmed_text(kept: int) -> str:
    """What readers say of a history that starts at step `kept` (> 0) because a trim deleted the steps before."""
    before = "checkpoint 0 was" if kept == 1 else f"checkpoints 0 to {kept - 1} were"
    return (
        f"{before} trimmed by retention (a finished run keeps only its newest checkpoint); "
        f"the history starts at step {kept}, and every call record is kept"
    )


def no_checkpoint_text(run_id: str, step: int, rows: Sequence[SealedCheckpoint]) -> str:
    """Why the run has no checkpoint at `step`: never saved, or trimmed by retention (then from where to go on)."""
    kept = kept_from(rows)
    if 0 <= step < kept:
        return (
            f"run {run_id!r} has no checkpoint at step {step}: retention trimmed its checkpoints before step {kept} "
            f"(a finished run keeps only its newest); pick step {kept} or later"
        )
    return f"run {run_id!r} has no checkpoint at step {step}"
