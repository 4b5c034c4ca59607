"""The workers' retention: one tick of the ``agentflow.prune_finished`` beat task.

A tick prunes the finished runs that `WorkerSettings.retention_days` no longer keeps, then
trims those older than `WorkerSettings.retention_trim_days` (each keeps only its newest
checkpoint, its call records and listing; see `agentflow.exec.checkpoints.retention`),
each at most `WorkerSettings.retention_batches` batches (the rest waits for the next tick,
so a tick stays short however much piled up), holding the ``lock/prune`` marker
(`agentflow.exec.run.markers`): of several ticks at once (two beats, a slow tick overrunning
the next), one works and the others say so and do nothing. The marker is renewed while the
tick runs and lapses by itself if its worker dies. Pruning goes first, so no run is trimmed just before it goes.

The tick opens a store of its own from the workers' store factory, unwrapped: a wrapper
(timing, tracing) forwards `CheckpointStore` only, and the store's batched retention
(`RetentionStore`, `TrimStore`) is what keeps a tick cheap. A store that cannot trim
(no `TrimStore`) is still pruned; the tick says why it trimmed nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

from agentflow.celery._markers import LOCK, worker_markers
from agentflow.celery._settings import WorkerSettings
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.checkpoints.retention import RetentionPolicy, RowCheck, prune_finished, trim_finished
from agentflow.exec.run.markers import MarkerBusy
from agentflow.exec.seal import Sealer

log = logging.getLogger("agentflow.celery")

#: The marker that lets one prune tick at a time do the work: ``lock/prune``.
PRUNE_LOCK: Final = (LOCK, "prune")


async def prune_tick(
    store_factory: Callable[[], CheckpointStore], settings: WorkerSettings, owner: str, sealer: Sealer
) -> dict[str, Any]:
    """Prune, then trim, what the retention policy no longer keeps, in bounded batches; the task's result."""
    policy = settings.retention()
    if policy is None:
        return {"skipped": "no retention is set (retention_days, retention_trim_days)"}
    store = store_factory()
    try:
        async with worker_markers(store, sealer, settings).holding(*PRUNE_LOCK, owner, settings.recover_lock_s):
            result = await _work(store, policy, settings, owner, sealer.checkpoint_problem)
    except MarkerBusy as busy:
        return {"skipped": f"another worker is pruning ({busy.holder.body.get('owner')})"}
    finally:
        await store.aclose()
    return result


async def _work(
    store: CheckpointStore, policy: RetentionPolicy, settings: WorkerSettings, owner: str, check: RowCheck
) -> dict[str, Any]:
    """One tick's prune and trim, each bounded; what each did."""
    result: dict[str, Any] = {}
    if policy.keep_s is not None:
        pruned = await prune_finished(store, policy, check=check, owner=owner, max_batches=settings.retention_batches)
        _report_refused(pruned.refused)
        result |= {"pruned": len(pruned.run_ids), "rows": pruned.rows}
        if pruned.run_ids:
            log.info(
                "pruned %d finished run(s) (%d rows) last saved more than %s day(s) ago",
                len(pruned.run_ids),
                pruned.rows,
                settings.retention_days,
            )
    if policy.trim_after_s is not None:
        try:
            trimmed = await trim_finished(store, policy, check=check, max_batches=settings.retention_batches)
            _report_refused(trimmed.refused)
        except NotImplementedError as exc:
            log.warning("retention_trim_days is set, but the store cannot trim: %s", exc)
            return result | {"trim_skipped": str(exc)}
        result |= {"trimmed": len(trimmed.run_ids), "trimmed_rows": trimmed.rows}
        if trimmed.run_ids:
            log.info(
                "trimmed %d finished run(s) to their newest checkpoint (%d rows) last saved more than %s day(s) ago",
                len(trimmed.run_ids),
                trimmed.rows,
                settings.retention_trim_days,
            )
    return result


def _report_refused(refused: tuple[tuple[str, str], ...]) -> None:
    """Say which listed runs were left, and why (their newest checkpoint did not check, or their log went on)."""
    for run_id, why in refused:
        log.warning("retention left run %s: %s", run_id, why)
