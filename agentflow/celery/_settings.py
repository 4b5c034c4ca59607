"""`WorkerSettings`: how distributed runs are paced and guarded (leases, rechecks, recover_all, time limits, retention).

The settings every worker of a deployment shares; `agentflow.celery.Settings.worker` fills them
from ``AGENTFLOW_*`` variables for the apps `make_app` builds.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentflow.exec.checkpoints import RetentionPolicy


@dataclass(frozen=True)
class WorkerSettings:
    """How distributed runs are paced and guarded."""

    lease_s: float = 30.0
    """A run's lease lapses this long after its worker stopped renewing it."""
    stale_after_s: float = 10.0
    """recover_all leaves runs saved more recently than this alone (a handoff in flight)."""
    recover_lock_s: float = 10.0
    """The lease of recover_all's lock (and the prune tick's): renewed while the sweep works, so a holder
    that died blocks the next sweep at most this long."""
    recover_interval_s: float | None = 60.0
    """Beat period of recover_all (None: no beat entry)."""
    time_limit_s: int = 900
    """Hard time limit of one superstep task."""
    soft_time_limit_s: int = 840
    """Soft time limit of one superstep task."""
    queue: str = "agentflow"
    """Queue of the superstep tasks."""
    sweep_queue: str | None = None
    """Queue of recover_all's messages (beat's ticks, each worker's start); None: ``<queue>.sweep`` (`sweeps`).

    A queue of their own, so a sweep never waits behind a backlog of supersteps (nor expires
    there): every worker consumes it besides the queues ``-Q`` names (`_routing`).
    """
    max_retries: int = 3
    """Retries of a task whose pool process died."""
    recheck_margin_s: float = 1.0
    """A run found held is looked at again this long after its lease was due to end."""
    store_retries: int = 5
    """How many times a superstep the store could not confirm as durable (`StoreNotDurable`) is sent again.

    Each time after a back-off (`store_retry_s`, doubled each time); once they are spent the
    run is left to recover_all, which carries it on once the store answers.
    """
    store_retry_s: float = 1.0
    """The first back-off of such a retry (then 2x, 4x, ...; at most ten times `stale_after_s`)."""
    sweep_forgotten: bool = False
    """recover_all also scans the stored rows for runs the listing index forgot, and lists them again.

    The index is unsigned: someone who can write to the store can delete a run's entry and
    strand it silently. The scan reads every run id of the store (a Redis SCAN, a SQL
    ``SELECT DISTINCT``), so turn it on where that is cheap enough at the beat's interval.
    """

    retention_days: float | None = None
    """Finished runs (done, failed, cancelled) last saved longer ago than this are pruned (None: never).

    A beat task (``agentflow.prune_finished``, every `retention_interval_s`) prunes them in
    bounded batches, one worker at a time (the ``agentflow/prune`` lease). Running and
    paused runs are never pruned.
    """
    retention_trim_days: float | None = None
    """Finished runs last saved longer ago than this keep only their newest checkpoint (None: they keep all).

    The same beat task trims them, after its prune: each keeps its newest checkpoint, call
    records, lease and listing entries, so it still shows and can be retried; its older
    checkpoints (its past states) go. Shorter than `retention_days` when both are set. Tool
    loops are never trimmed.
    """
    retention_interval_s: float = 3600.0
    """Beat period of the prune task (when `retention_days` or `retention_trim_days` is set)."""
    retention_batches: int = 20
    """Batches one tick prunes, and then trims, at most (500 runs each); what is left waits for the next tick."""

    @property
    def sweeps(self) -> str:
        """The queue recover_all's messages go to: `sweep_queue`, or ``<queue>.sweep``."""
        return self.sweep_queue or f"{self.queue}.sweep"

    def store_backoff_s(self, retries: int) -> float:
        """The back-off before try `retries` + 1 of a superstep the store could not confirm as durable."""
        return float(min(self.store_retry_s * 2 ** min(retries, 30), max(self.store_retry_s, 10 * self.stale_after_s)))

    def retention(self) -> RetentionPolicy | None:
        """The retention policy of `retention_days` and `retention_trim_days`, or None when neither is set."""
        if self.retention_days is None and self.retention_trim_days is None:
            return None
        return RetentionPolicy.days(self.retention_days, trim_after_days=self.retention_trim_days)

    def __post_init__(self) -> None:
        if self.sweeps == self.queue:
            raise ValueError("sweep_queue must differ from queue: a sweep must not wait behind a backlog of supersteps")
        if self.soft_time_limit_s >= self.time_limit_s:
            raise ValueError("soft_time_limit_s must be below time_limit_s")
        if self.store_retries < 0 or not self.store_retry_s > 0:
            raise ValueError("store_retries must not be negative and store_retry_s must be positive")
        if self.lease_s <= 0 or self.recheck_margin_s < 0:
            raise ValueError("lease_s must be positive and recheck_margin_s not negative")
        if self.lease_s >= self.time_limit_s:
            raise ValueError("lease_s must be below time_limit_s (the lease is renewed while a superstep runs)")
        if self.retention_days is not None and not self.retention_days > 0:
            raise ValueError("retention_days must be positive, or None to keep finished runs")
        if self.retention_trim_days is not None and not self.retention_trim_days > 0:
            raise ValueError("retention_trim_days must be positive, or None to keep every checkpoint")
        self.retention()  # refuses a trim at or after the prune (RetentionPolicy says why)
        if self.retention_interval_s <= 0 or self.retention_batches < 1:
            raise ValueError("retention_interval_s must be positive and retention_batches at least 1")
