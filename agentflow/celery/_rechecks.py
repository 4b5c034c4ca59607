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

The lease's end comes from the store, where anyone who can write it can put a lease that
ends in twenty years: the marker lasts until that end, but never longer than one lease of
this worker's own (`WorkerSettings.lease_s`), so a worker signs no marker that keeps the
next recheck away for longer than a real lease could.
"""

from __future__ import annotations

import time
from typing import Final

from agentflow.exec.run.markers import Markers

#: The marker's kind (``recheck/<run_id>``).
RECHECK: Final = "recheck"


#: The shortest a recheck marker lasts (seconds): a lease that ends now still keeps duplicates out that long.
SHORTEST_S: Final = 0.5


def longest_s(lease_s: float) -> float:
    """The longest a recheck marker of a worker whose leases last `lease_s` may last (seconds)."""
    return max(SHORTEST_S, lease_s)


async def first_to_watch(markers: Markers, run_id: str, owner: str, lease_ends: float, lease_s: float) -> bool:
    """Whether this caller is the one to send the recheck of `run_id` (the marker was free, and is now its).

    The marker lasts until `lease_ends`, at most `lease_s` from now (the lease of this worker's own).
    """
    ttl = max(SHORTEST_S, min(lease_ends - time.time(), lease_s))
    return (await markers.put(RECHECK, run_id, {"owner": owner}, ttl))[0]
