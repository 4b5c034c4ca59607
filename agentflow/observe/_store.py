"""`TimedStore`: a checkpoint store that times every operation of the store it wraps.

The stores stay as they are: the wrapper forwards each method of the `CheckpointStore`
port unchanged (arguments, results, errors; `ForwardingStore`) and observes how long it
took, labelled by the operation's name. It passes the stores' conformance suite (tests/observe).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import Histogram

from agentflow.exec.checkpoints import CheckpointStore
from agentflow.observe._forward import ForwardingStore


class TimedStore(ForwardingStore):
    """Forwards every operation to `inner` and observes its duration in `histogram` (label ``op``)."""

    def __init__(self, inner: CheckpointStore, histogram: Histogram) -> None:
        super().__init__(inner)
        self._histogram = histogram
        self._op = {op: histogram.labels(op) for op in OPS}  # resolved once, not per call

    def _done(self, op: str, duration_ns: int) -> None:
        self._op[op].observe(duration_ns / 1e9)


#: The operations timed: every async method of the `CheckpointStore` port but `aclose`, and the markers'.
OPS = (
    "save", "save_after_calls", "latest", "head", "history", "list_unfinished", "list_runs", "delete",
    "record_call", "calls", "stored_runs", "relist", "take_lease", "renew_lease", "release_lease", "leases",
    "put_marker", "peek_markers", "take_marker",
)  # fmt: skip


def timed(factory: Callable[[], CheckpointStore], histogram: Histogram) -> Callable[[], CheckpointStore]:
    """A store factory whose stores are `TimedStore`s over `factory`'s."""
    return lambda: TimedStore(factory(), histogram)
