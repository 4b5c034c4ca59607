"""How long each kind of marker a worker sets may last, from its settings: the bounds its markers are read with.

A marker that counts is signed under the workers' key, but its ``until`` is what the signer
computed, and its expiry what the store keeps. A worker signs no marker for longer than its
kind ever lasts, and obeys none that says it lasts longer (`agentflow.exec.run.markers`):
so neither a captured marker written back with a far expiry nor a lease read from the store
with a far one makes a sweep or a recheck wait for years. The kinds and their longest:

- ``lock`` (recover_all's and the prune tick's): `WorkerSettings.recover_lock_s`;
- ``recheck``: `WorkerSettings.lease_s` (a recheck waits for one lease at most, `_rechecks`);
- ``recovering``: twice the back-off's cap (`_resends.longest_s`);
- ``store-wait``: the longest wait of a superstep the store could not confirm, its back-off's
  (`WorkerSettings.store_retries`, `store_retry_s`) or recover_all's, and two leases
  (`_store_waits.longest_s`);
- ``asked``, ``cancel``, ``quarantined``, ``unknown-flow``: fixed, their modules' lifetimes.

Every worker sharing a store shares these settings: a marker from a worker set up with a
longer one does not count for a worker with a shorter one (beyond the markers' `SKEW_S`).
"""

from __future__ import annotations

from agentflow._events import Events
from agentflow.celery._rechecks import RECHECK
from agentflow.celery._rechecks import longest_s as recheck_longest_s
from agentflow.celery._resends import RECOVERING, base_of
from agentflow.celery._resends import longest_s as recovering_longest_s
from agentflow.celery._settings import WorkerSettings
from agentflow.celery._store_waits import longest_s as store_wait_longest_s
from agentflow.celery._task_states import ASKED, ASKED_TTL_S
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.run import cancel, quarantine
from agentflow.exec.run.markers import Markers
from agentflow.exec.run.store_waits import KIND as STORE_WAIT
from agentflow.exec.seal import Sealer

#: The kind of the sweep's and the prune tick's locks (``lock/recover_all``, ``lock/prune``).
LOCK = "lock"


def longest(settings: WorkerSettings) -> dict[str, float]:
    """The longest each kind of marker a worker with `settings` sets may last (seconds), by kind."""
    return {
        **cancel.LONGEST,
        **quarantine.LONGEST,
        ASKED: ASKED_TTL_S,
        LOCK: settings.recover_lock_s,
        RECHECK: recheck_longest_s(settings.lease_s),
        RECOVERING: recovering_longest_s(base_of(settings)),
        STORE_WAIT: store_wait_longest_s(settings),
    }


def worker_markers(
    store: CheckpointStore, sealer: Sealer, settings: WorkerSettings, events: Events | None = None
) -> Markers:
    """The markers of `store` as a worker with `settings` sets and reads them."""
    return Markers(store, sealer, events, longest(settings))
