"""One recheck per held run: the marker that keeps many workers from watching the same lease.

A run found held is looked at again just after its lease ends (a ``recheck``
superstep). Many messages may find it held at once: every duplicate of a superstep's
message finds the run held too. Only the first of them sends a recheck; it sets the signed
marker ``recheck/<run_id>`` (`agentflow.exec.run.markers`) to lapse when that lease ends. The
recheck itself, due just after, finds the marker lapsed and may send the next one if the
run is still held at the same step. A put of a marker is atomic in every store, so of
racing senders exactly one sends.

A worker's start is the exception: its recover_all sends a recheck for every held run
whether or not the marker was free. A recheck is a delayed message, which the worker that
took it keeps unacknowledged until it is due; if that worker dies, the broker hands it out
again only after its visibility timeout (an hour), while the marker says a recheck is on
its way. A start comes after a worker died more often than not, so it does not trust the
marker: one message per held run per start, and the run moves again just after its lease
ends even when the recheck sent before went down with its worker.
"""

from __future__ import annotations

import time
from typing import Final

from agentflow.exec.run.markers import Markers

#: The marker's kind (``recheck/<run_id>``).
RECHECK: Final = "recheck"


async def first_to_watch(markers: Markers, run_id: str, owner: str, lease_ends: float) -> bool:
    """Whether this caller is the one to send the recheck of `run_id` (the marker was free, and is now its)."""
    ttl = max(0.5, lease_ends - time.time())
    return (await markers.put(RECHECK, run_id, {"owner": owner}, ttl))[0]
