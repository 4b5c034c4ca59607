"""How long a worker's ``store-wait`` marker lasts (`agentflow.exec.run.store_waits`), from its settings.

A worker leaves the marker when its superstep stopped because the store could not confirm a
write as durable (`StoreNotDurable`). It says when the superstep is tried again: after the
back-off of its next try (`WorkerSettings.store_backoff_s`), or, once its `store_retries` are
spent, when recover_all next looks (`stale_after_s` after the run's last save, on the beat's
period). The marker lasts that long and two of the worker's leases more (the try itself), and
never longer: so its kind's longest (`longest_s`, `_markers`) follows from the same settings,
and a marker signed for longer than a worker with them ever signs does not count there.
"""

from __future__ import annotations

from agentflow.celery._settings import WorkerSettings

#: The shortest wait a marker is set for (seconds): one due now still shows for a moment.
SHORTEST_S = 1.0


def _sweep_s(settings: WorkerSettings) -> float:
    """How long a run whose tries are spent waits for recover_all at most (seconds)."""
    return settings.stale_after_s + (settings.recover_interval_s or 0.0)


def ttl_s(settings: WorkerSettings, retry_in_s: float | None) -> float:
    """How long the marker of a superstep tried again in `retry_in_s` lasts (None: left to recover_all)."""
    wait = _sweep_s(settings) if retry_in_s is None else retry_in_s
    return max(SHORTEST_S, wait) + 2 * settings.lease_s


def longest_s(settings: WorkerSettings) -> float:
    """The longest a store-wait marker of a worker with `settings` may last (seconds).

    The longest of its back-offs (the last try's: each doubles, up to its cap) or of the wait
    for recover_all, with the same margin as `ttl_s`.
    """
    backoff = settings.store_backoff_s(settings.store_retries - 1) if settings.store_retries else 0.0
    return ttl_s(settings, max(backoff, _sweep_s(settings)))
