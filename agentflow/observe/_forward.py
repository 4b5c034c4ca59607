"""`ForwardingStore`: a checkpoint store that forwards every operation to the one it wraps, and times it.

The observers of stores (`TimedStore` for metrics, `TracedStore` for traces) are made of it:
each forwards the `CheckpointStore` port unchanged (arguments, results, errors) and says
only what to do with an operation's duration (`_done`).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.checkpoints.records import Lease, SealedCall, SealedCheckpoint

T = TypeVar("T")


#: Parts of the port beyond `CheckpointStore` that a wrapper hands through untimed when the wrapped
#: store has them (`EventStore`: a run's event stream), so the wrapper is one exactly when it is.
#: The retention port is not among them: a prune opens an unwrapped store of its own.
PASSED_THROUGH = frozenset({"append_events", "read_events"})
#: Optional operations a wrapper has exactly when the wrapped store has them, timed under the
#: name of the port's operation they stand for (the Redis store's lease take that reads the head
#: too; `LeaseMoving`'s writes), or their own (`MarkerStore`'s).
TIMED_AS = {
    "take_lease_reading_head": "take_lease",
    "record_call_moving": "record_call",
    "save_after_calls_moving": "save_after_calls",
    **{name: name for name in ("put_marker", "peek_markers", "take_marker")},
}


class ForwardingStore(ABC):
    """Forwards every operation to `inner` and reports how long it took to `_done`."""

    def __init__(self, inner: CheckpointStore) -> None:
        self.inner = inner
        #: Whether the wrapped store lives inside this process.
        self.in_process: bool = inner.in_process

    def __getattr__(self, name: str) -> Any:
        """`PASSED_THROUGH` and `TIMED_AS` methods of the wrapped store (an AttributeError where it has none)."""
        if name in PASSED_THROUGH:
            return getattr(self.inner, name)
        if name in TIMED_AS:
            method = getattr(self.inner, name)  # an AttributeError where it has none
            return lambda *args, **kwargs: self._timed(TIMED_AS[name], method(*args, **kwargs))
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @abstractmethod
    def _done(self, op: str, duration_ns: int) -> None:
        """Operation `op` (a method name of the port) took `duration_ns` (it returned or raised)."""

    async def _timed(self, op: str, work: Awaitable[T]) -> T:
        began = time.perf_counter_ns()
        try:
            return await work
        finally:
            self._done(op, time.perf_counter_ns() - began)

    @property
    def local_key(self) -> bytes | None:
        """The wrapped store's own signing key (the memory store's), else None."""
        return self.inner.local_key

    async def save(self, run_id: str, step: int, checkpoint: SealedCheckpoint) -> None:
        """`CheckpointStore.save`, timed."""
        await self._timed("save", self.inner.save(run_id, step, checkpoint))

    async def save_after_calls(
        self, run_id: str, step: int, checkpoint: SealedCheckpoint, calls: Sequence[SealedCall]
    ) -> None:
        """`CheckpointStore.save_after_calls`, timed."""
        await self._timed("save_after_calls", self.inner.save_after_calls(run_id, step, checkpoint, calls))

    async def latest(self, run_id: str) -> SealedCheckpoint:
        """`CheckpointStore.latest`, timed."""
        return await self._timed("latest", self.inner.latest(run_id))

    async def head(self, run_id: str) -> tuple[SealedCheckpoint, Mapping[int, int]]:
        """`CheckpointStore.head`, timed."""
        return await self._timed("head", self.inner.head(run_id))

    async def history(self, run_id: str) -> Sequence[SealedCheckpoint]:
        """`CheckpointStore.history`, timed."""
        return await self._timed("history", self.inner.history(run_id))

    async def list_unfinished(self, flow: str) -> Sequence[str]:
        """`CheckpointStore.list_unfinished`, timed."""
        return await self._timed("list_unfinished", self.inner.list_unfinished(flow))

    async def list_runs(self, flow: str | None = None, limit: int = 1000) -> Sequence[SealedCheckpoint]:
        """`CheckpointStore.list_runs`, timed."""
        return await self._timed("list_runs", self.inner.list_runs(flow, limit))

    async def delete(self, run_id: str) -> None:
        """`CheckpointStore.delete`, timed."""
        await self._timed("delete", self.inner.delete(run_id))

    async def record_call(self, run_id: str, record: SealedCall) -> None:
        """`CheckpointStore.record_call`, timed."""
        await self._timed("record_call", self.inner.record_call(run_id, record))

    async def calls(self, run_id: str) -> Sequence[SealedCall]:
        """`CheckpointStore.calls`, timed."""
        return await self._timed("calls", self.inner.calls(run_id))

    async def stored_runs(self) -> Sequence[str]:
        """`CheckpointStore.stored_runs`, timed."""
        return await self._timed("stored_runs", self.inner.stored_runs())

    async def relist(self, run_id: str) -> SealedCheckpoint | None:
        """`CheckpointStore.relist`, timed."""
        return await self._timed("relist", self.inner.relist(run_id))

    async def take_lease(self, run_id: str, owner: str, token: str, ttl_s: float) -> Lease:
        """`CheckpointStore.take_lease`, timed."""
        return await self._timed("take_lease", self.inner.take_lease(run_id, owner, token, ttl_s))

    async def renew_lease(self, run_id: str, token: str, ttl_s: float) -> Lease | None:
        """`CheckpointStore.renew_lease`, timed."""
        return await self._timed("renew_lease", self.inner.renew_lease(run_id, token, ttl_s))

    async def release_lease(self, run_id: str, token: str) -> bool:
        """`CheckpointStore.release_lease`, timed."""
        return await self._timed("release_lease", self.inner.release_lease(run_id, token))

    async def leases(self, run_ids: Sequence[str]) -> Mapping[str, Lease]:
        """`CheckpointStore.leases`, timed."""
        return await self._timed("leases", self.inner.leases(run_ids))

    async def aclose(self) -> None:
        """Close the wrapped store (not timed: it is no operation on runs)."""
        await self.inner.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
