"""`SimStore`: any checkpoint store, with a scheduling point before and after each of its operations.

The store underneath is the real one (the memory store, a SQLite file, the Redis scripts on
fakeredis with Lua, or a store of your own): the simulation adds points and faults, never a
model of the store. Each operation is atomic in the real store, so the two points around
it are the only places another actor can come between.

At the point before an operation the scheduler may make it fail (`StoreFault`): before it
takes effect (nothing happened), or after (it happened and the caller sees an error, as a
timeout after the server applied the write does). Both raise `CheckpointError`, what every
shipped store raises when its backend fails.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from agentflow._errors import CheckpointError
from agentflow.exec.checkpoints.protocol import CheckpointStore, EventStore, HeadReading, LeaseMoving
from agentflow.exec.checkpoints.records import (
    Lease,
    LeaseMove,
    Marker,
    SealedCall,
    SealedCheckpoint,
    SealedEvent,
    StoredEvent,
)

_T = TypeVar("_T")

#: What a store fault does: fail before the operation takes effect, or after.
StoreFault = str  # "before" | "after"


class Points:
    """What `SimStore` asks of the simulation at each operation."""

    async def point(self, name: str, run_id: str | None = None) -> None:  # pragma: no cover - the simulation's
        """Park at `name` until the scheduler picks this task (`run_id`: the run whose rows a write there writes)."""
        raise NotImplementedError

    def store_fault(self, op: str) -> StoreFault | None:  # pragma: no cover
        """Whether operation `op` fails now: ``before`` it takes effect, ``after``, or not (None)."""
        raise NotImplementedError

    def wrote(self, run_id: str, checkpoint: SealedCheckpoint | None, calls: Sequence[SealedCall]) -> None:
        """A write took effect in the store (called at once, before anything else runs)."""

    def took(self, run_id: str) -> None:
        """The current actor took the run's lease (called at once, as `wrote` is)."""


class SimStore:
    """A `CheckpointStore` whose every operation is surrounded by points and may fail (see the module docstring)."""

    def __init__(self, inner: CheckpointStore, points: Points) -> None:
        self.inner = inner
        self._points = points
        self.in_process = inner.in_process

    @property
    def local_key(self) -> bytes | None:
        return self.inner.local_key

    async def _op(
        self, op: str, call: Callable[[], Awaitable[_T]], wrote: Callable[[], None] | None = None, run_id: str = ""
    ) -> _T:
        await self._points.point(f"store.{op}", run_id or None)
        fault = self._points.store_fault(op)
        if fault == "before":
            raise CheckpointError(f"simulated store failure before {op} took effect")
        result = await call()
        if wrote is not None:
            wrote()
        if fault == "after":
            raise CheckpointError(f"simulated store failure after {op} took effect (the caller cannot tell)")
        await self._points.point(f"store.{op}.returned")
        return result

    async def save(self, run_id: str, step: int, checkpoint: SealedCheckpoint) -> None:
        await self._op(
            "save",
            lambda: self.inner.save(run_id, step, checkpoint),
            lambda: self._points.wrote(run_id, checkpoint, ()),
            run_id=run_id,
        )

    async def save_after_calls(
        self, run_id: str, step: int, checkpoint: SealedCheckpoint, calls: Sequence[SealedCall]
    ) -> None:
        await self._op(
            "save_after_calls",
            lambda: self.inner.save_after_calls(run_id, step, checkpoint, calls),
            lambda: self._points.wrote(run_id, checkpoint, calls),
            run_id=run_id,
        )

    async def latest(self, run_id: str) -> SealedCheckpoint:
        return await self._op("latest", lambda: self.inner.latest(run_id))

    async def history(self, run_id: str) -> Sequence[SealedCheckpoint]:
        return await self._op("history", lambda: self.inner.history(run_id))

    async def list_unfinished(self, flow: str) -> Sequence[str]:
        return await self._op("list_unfinished", lambda: self.inner.list_unfinished(flow))

    async def list_runs(self, flow: str | None = None, limit: int = 1000) -> Sequence[SealedCheckpoint]:
        return await self._op("list_runs", lambda: self.inner.list_runs(flow, limit))

    async def delete(self, run_id: str) -> None:
        await self._op("delete", lambda: self.inner.delete(run_id))

    async def record_call(self, run_id: str, record: SealedCall) -> None:
        await self._op(
            f"record_call.{record.kind}",
            lambda: self.inner.record_call(run_id, record),
            lambda: self._points.wrote(run_id, None, (record,)),
            run_id=run_id,
        )

    async def calls(self, run_id: str) -> Sequence[SealedCall]:
        return await self._op("calls", lambda: self.inner.calls(run_id))

    async def head(self, run_id: str) -> tuple[SealedCheckpoint, Mapping[int, int]]:
        return await self._op("head", lambda: self.inner.head(run_id))

    async def stored_runs(self) -> Sequence[str]:
        return await self._op("stored_runs", self.inner.stored_runs)

    async def relist(self, run_id: str) -> SealedCheckpoint | None:
        return await self._op("relist", lambda: self.inner.relist(run_id))

    async def take_lease(self, run_id: str, owner: str, token: str, ttl_s: float) -> Lease:
        return await self._op(
            "take_lease", lambda: self.inner.take_lease(run_id, owner, token, ttl_s), lambda: self._points.took(run_id)
        )

    async def renew_lease(self, run_id: str, token: str, ttl_s: float) -> Lease | None:
        return await self._op("renew_lease", lambda: self.inner.renew_lease(run_id, token, ttl_s))

    async def release_lease(self, run_id: str, token: str) -> bool:
        return await self._op("release_lease", lambda: self.inner.release_lease(run_id, token))

    async def leases(self, run_ids: Sequence[str]) -> Mapping[str, Lease]:
        return await self._op("leases", lambda: self.inner.leases(run_ids))

    async def put_marker(self, key: str, value: str, token: str, ttl_s: float) -> Marker:
        return await self._op("put_marker", lambda: self.inner.put_marker(key, value, token, ttl_s))

    async def peek_markers(self, keys: Sequence[str]) -> Mapping[str, Marker]:
        return await self._op("peek_markers", lambda: self.inner.peek_markers(keys))

    async def take_marker(self, key: str, token: str) -> bool:
        return await self._op("take_marker", lambda: self.inner.take_marker(key, token))

    async def aclose(self) -> None:
        await self.inner.aclose()


class SimEventStore(SimStore):
    """`SimStore` over a store that keeps event streams (so the runs keep theirs in the simulation too)."""

    inner: Any

    async def append_events(self, run_id: str, events: Sequence[SealedEvent]) -> None:
        await self._op("append_events", lambda: self.inner.append_events(run_id, events))

    async def read_events(self, run_id: str, after: str | None = None, limit: int = 1000) -> Sequence[StoredEvent]:
        return await self._op("read_events", lambda: self.inner.read_events(run_id, after, limit))


class SimHeadStore(SimEventStore):
    """`SimEventStore` over a store that takes a lease and reads the head in one operation (Redis)."""

    async def take_lease_reading_head(
        self, run_id: str, owner: str, token: str, ttl_s: float, marker: str | None = None
    ) -> tuple[Lease, tuple[SealedCheckpoint, Mapping[int, int]] | None, Marker | None]:
        result: tuple[Lease, tuple[SealedCheckpoint, Mapping[int, int]] | None, Marker | None] = await self._op(
            "take_lease_reading_head",
            lambda: self.inner.take_lease_reading_head(run_id, owner, token, ttl_s, marker),
            lambda: self._points.took(run_id),
        )
        return result


class _MovesLeases(SimStore):
    """The `LeaseMoving` writes, surrounded by points like the plain ones (mixed into a class below)."""

    inner: Any

    async def record_call_moving(self, run_id: str, record: SealedCall, move: LeaseMove) -> None:
        await self._op(
            f"record_call.{record.kind}",
            lambda: self.inner.record_call_moving(run_id, record, move),
            lambda: self._points.wrote(run_id, None, (record,)),
            run_id=run_id,
        )

    async def save_after_calls_moving(
        self,
        run_id: str,
        step: int,
        checkpoint: SealedCheckpoint,
        calls: Sequence[SealedCall],
        move: LeaseMove,
        events: Sequence[SealedEvent] = (),
    ) -> None:
        await self._op(
            "save_moving",
            lambda: self.inner.save_after_calls_moving(run_id, step, checkpoint, calls, move, events),
            lambda: self._points.wrote(run_id, checkpoint, calls),
            run_id=run_id,
        )


class SimMovingEventStore(_MovesLeases, SimEventStore):
    """`SimEventStore` over a store that moves leases with its writes (memory, SQLite)."""


class SimMovingHeadStore(_MovesLeases, SimHeadStore):
    """`SimHeadStore` over a store that moves leases with its writes (Redis)."""


def sim_store(inner: CheckpointStore, points: Points) -> CheckpointStore:
    """Wrap `inner` in the `SimStore` that forwards exactly the capabilities it has."""
    moves = isinstance(inner, LeaseMoving)
    if isinstance(inner, HeadReading) and isinstance(inner, EventStore):
        return SimMovingHeadStore(inner, points) if moves else SimHeadStore(inner, points)
    if isinstance(inner, EventStore):
        return SimMovingEventStore(inner, points) if moves else SimEventStore(inner, points)
    return SimStore(inner, points)
