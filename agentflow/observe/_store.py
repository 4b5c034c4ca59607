"""`StoreTimer`: the store hook that times each operation, for metrics and for traces.

A `ForwardingStore` runs it around every operation of the store it wraps
(`Metrics.store_hook`, `Tracing.store_hook`); each operation is reported under its port
method's name (`LABELS`), the optional ones under the name of the operation they stand for.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: The operations timed: every async method of the `CheckpointStore` port but `aclose`, and the markers'.
OPS = (
    "save", "save_after_calls", "latest", "head", "history", "list_unfinished", "list_runs", "delete",
    "record_call", "calls", "stored_runs", "relist", "take_lease", "renew_lease", "release_lease", "leases",
    "put_marker", "peek_markers", "take_marker",
)  # fmt: skip
#: The name each timed operation is reported under: its own, or for an optional one the port's operation
#: it stands for (the Redis store's lease take that reads the head too; `LeaseMoving`'s writes). Others
#: (event streams, confirming durability, packing, bookkeeping) go untimed.
LABELS = {
    **{op: op for op in OPS},
    "take_lease_reading_head": "take_lease",
    "record_call_moving": "record_call",
    "save_after_calls_moving": "save_after_calls",
}


class StoreTimer:
    """A `StoreHook` that hands each timed operation's name and duration to `done`."""

    def __init__(self, done: Callable[[str, int], None]) -> None:
        """Report to `done(label, duration in ns)` when an operation returned or raised."""
        self._done = done

    async def __call__(self, op: str, proceed: Callable[..., Awaitable[T]], args: tuple[Any, ...]) -> T:
        label = LABELS.get(op)
        if label is None:
            return await proceed(*args)
        began = time.perf_counter_ns()
        try:
            return await proceed(*args)
        finally:
            self._done(label, time.perf_counter_ns() - began)
