"""One recheck per held run: the marker that keeps many workers from watching the same lease.

A run found held is looked at again just after its lease ends (a ``recheck``
superstep). Several workers may find it held at once: each worker that starts runs a
recover_all that sees every held run, and every duplicate message finds the run held too.
Only the first of them sends a recheck; it marks the run with a lease on
``agentflow/recheck/<run_id>`` (see `agentflow.exec._run_quarantine.marker`) that lapses
when that lease ends. The recheck itself, due just after, finds the marker lapsed and may
send the next one if the run is still held at the same step. Leases are atomic in every
store, so of racing senders exactly one sends.
"""

from __future__ import annotations

import secrets
import time
from typing import Final

from agentflow.exec._run_quarantine import marker
from agentflow.exec.checkpoints._protocol import CheckpointStore

#: The marker's kind (its lease id is ``agentflow/recheck/<run_id>``).
RECHECK: Final = "recheck"


async def first_to_watch(store: CheckpointStore, run_id: str, owner: str, lease_ends: float) -> bool:
    """Whether this caller is the one to send the recheck of `run_id` (the marker was free, and is now its)."""
    ttl = max(0.5, lease_ends - time.time())
    token = secrets.token_hex(8)
    taken = await store.take_lease(marker(run_id, RECHECK), owner, token, ttl)
    return taken.token == token
