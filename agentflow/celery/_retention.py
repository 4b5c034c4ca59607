"""The workers' retention: one tick of the ``agentflow.prune_finished`` beat task.

A tick prunes the finished runs that `WorkerSettings.retention_days` no longer keeps, at
most `WorkerSettings.retention_batches` batches of them (the rest waits for the next
tick, so a tick stays short however much piled up), under the ``agentflow/prune`` lease:
of several ticks at once (two beats, a slow tick overrunning the next), one prunes and
the others say so and do nothing. The lease is renewed while the tick runs and lapses by
itself if its worker dies.

The tick opens a store of its own from the workers' store factory, unwrapped: a wrapper
(timing, tracing) forwards `CheckpointStore` only, and the store's batched retention
(`RetentionStore`) is what keeps a tick cheap.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

from agentflow._errors import RunHeld
from agentflow.celery._settings import WorkerSettings
from agentflow.exec._run_lease import Ownership, holding
from agentflow.exec.checkpoints._protocol import CheckpointStore
from agentflow.exec.checkpoints._retention import prune_finished

log = logging.getLogger("agentflow.celery")

#: The lease that lets one prune tick at a time do the work (not a run id any run gets).
PRUNE_LEASE: Final = "agentflow/prune"


async def prune_tick(
    store_factory: Callable[[], CheckpointStore], settings: WorkerSettings, owner: str
) -> dict[str, Any]:
    """Prune what the retention policy no longer keeps, in bounded batches; the task's result."""
    policy = settings.retention()
    if policy is None:
        return {"skipped": "no retention is set (retention_days)"}
    store = store_factory()
    try:
        async with holding(store, PRUNE_LEASE, Ownership(owner, settings.recover_lock_s)):
            pruned = await prune_finished(store, policy, owner=owner, max_batches=settings.retention_batches)
    except RunHeld as held:
        return {"skipped": f"another worker is pruning ({held.owner})"}
    finally:
        await store.aclose()
    if pruned.run_ids:
        log.info(
            "pruned %d finished run(s) (%d rows) last saved more than %s day(s) ago",
            len(pruned.run_ids),
            pruned.rows,
            settings.retention_days,
        )
    return {"pruned": len(pruned.run_ids), "rows": pruned.rows}
