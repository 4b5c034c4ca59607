"""`ForwardingStore`: a checkpoint store that hands every operation to the store it wraps, through hooks.

Whoever watches or steers a store from outside (metrics time each operation, traces note it
on a span, the simulation parks it and makes it fail) writes a `StoreHook`, never a wrapper:
the port is forwarded here, once, so a method added to the port is forwarded in one place.

Invariants:
- Arguments, results and errors pass unchanged, unless a hook changes them; with no hook
  the wrapper only forwards.
- Each operation runs through the hooks in the order given (the first is the outermost),
  named by its method's name; `aclose`, `local_key` and `in_process` are no operations on
  runs and skip them.
- An optional part of the port (`PARTS`: event streams, lease moves, the head read with a
  take, confirming durability, packing streams, bookkeeping) is the wrapper's exactly when
  the wrapped store has it, and among the `parts` asked for. Retention and trimming never
  are: a prune or a trim opens the store itself.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar

from agentflow.exec.checkpoints.protocol import (
    BookkeepingReading,
    CheckpointStore,
    DurabilityConfirming,
    EventCompacting,
    EventStore,
    HeadReading,
    LeaseMoving,
)
from agentflow.exec.checkpoints.records import Lease, Marker, SealedCall, SealedCheckpoint

T = TypeVar("T")

#: The optional parts of the port a wrapper forwards by default (when the wrapped store has them).
PARTS: tuple[type, ...] = (
    EventStore, LeaseMoving, HeadReading, DurabilityConfirming, EventCompacting, BookkeepingReading,
)  # fmt: skip


class StoreHook(Protocol):
    """What runs around each store operation of a `ForwardingStore`."""

    def __call__(self, op: str, proceed: Callable[..., Awaitable[T]], args: tuple[Any, ...]) -> Awaitable[T]:
        """Run the operation `op` (its method's name) by awaiting `proceed(*args)` (its positional arguments).

        `proceed` runs the hooks after this one, then the wrapped store's method; a hook
        returns what it returns (or raises) and may act before and after it. Keyword
        arguments (only an optional method may be given any) are bound into `proceed`.
        """
        ...


def _direct(op: str, proceed: Callable[..., Awaitable[T]], args: tuple[Any, ...]) -> Awaitable[T]:
    """No hook: the operation itself."""
    return proceed(*args)


def _chained(outer: StoreHook, inner: StoreHook) -> StoreHook:
    """One hook that runs `outer` around `inner`."""

    def both(op: str, proceed: Callable[..., Awaitable[T]], args: tuple[Any, ...]) -> Awaitable[T]:
        return outer(op, lambda *given: inner(op, proceed, given), args)

    return both


def _methods(part: type) -> tuple[str, ...]:
    """The methods an optional part of the port declares."""
    return tuple(name for name, value in vars(part).items() if callable(value) and not name.startswith("_"))


class ForwardingStore:
    """A `CheckpointStore` that forwards every operation to `inner` through `hooks` (see the module docstring)."""

    def __init__(
        self, inner: CheckpointStore, hooks: Sequence[StoreHook] = (), *, parts: Collection[type] = PARTS
    ) -> None:
        """Wrap `inner`.

        Args:
            inner: the store that does the work.
            hooks: what runs around each operation, outermost first.
            parts: the optional parts of the port forwarded when `inner` has them (`PARTS`).
        """
        self.inner = inner
        self.hooks = tuple(hooks)
        #: Whether the wrapped store lives inside this process.
        self.in_process: bool = inner.in_process
        self._optional = frozenset(name for part in parts for name in _methods(part))
        # The hooks as one, composed once here: an operation with one hook allocates nothing for it.
        hook: StoreHook = _direct
        for outer in reversed(self.hooks):
            hook = outer if hook is _direct else _chained(outer, hook)
        self._hook = hook

    def __getattr__(self, name: str) -> Any:
        """An optional method of the wrapped store, through the hooks (an AttributeError where it has none)."""
        if name.startswith("_") or name not in self._optional:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        method = getattr(self.inner, name)  # an AttributeError where it has none

        def forward(*args: Any, **kwargs: Any) -> Awaitable[Any]:
            return self._hook(name, functools.partial(method, **kwargs) if kwargs else method, args)

        self.__dict__[name] = forward  # looked up once per wrapper
        return forward

    @property
    def local_key(self) -> bytes | None:
        """The wrapped store's own signing key (the memory store's), else None."""
        return self.inner.local_key

    async def save(self, run_id: str, step: int, checkpoint: SealedCheckpoint) -> None:
        """`CheckpointStore.save`."""
        await self._hook("save", self.inner.save, (run_id, step, checkpoint))

    async def save_after_calls(
        self, run_id: str, step: int, checkpoint: SealedCheckpoint, calls: Sequence[SealedCall]
    ) -> None:
        """`CheckpointStore.save_after_calls`."""
        await self._hook("save_after_calls", self.inner.save_after_calls, (run_id, step, checkpoint, calls))

    async def latest(self, run_id: str) -> SealedCheckpoint:
        """`CheckpointStore.latest`."""
        return await self._hook("latest", self.inner.latest, (run_id,))

    async def head(self, run_id: str) -> tuple[SealedCheckpoint, Mapping[int, int]]:
        """`CheckpointStore.head`."""
        return await self._hook("head", self.inner.head, (run_id,))

    async def history(self, run_id: str) -> Sequence[SealedCheckpoint]:
        """`CheckpointStore.history`."""
        return await self._hook("history", self.inner.history, (run_id,))

    async def list_unfinished(self, flow: str) -> Sequence[str]:
        """`CheckpointStore.list_unfinished`."""
        return await self._hook("list_unfinished", self.inner.list_unfinished, (flow,))

    async def list_runs(self, flow: str | None = None, limit: int = 1000) -> Sequence[SealedCheckpoint]:
        """`CheckpointStore.list_runs`."""
        return await self._hook("list_runs", self.inner.list_runs, (flow, limit))

    async def delete(self, run_id: str) -> None:
        """`CheckpointStore.delete`."""
        await self._hook("delete", self.inner.delete, (run_id,))

    async def record_call(self, run_id: str, record: SealedCall) -> None:
        """`CheckpointStore.record_call`."""
        await self._hook("record_call", self.inner.record_call, (run_id, record))

    async def calls(self, run_id: str) -> Sequence[SealedCall]:
        """`CheckpointStore.calls`."""
        return await self._hook("calls", self.inner.calls, (run_id,))

    async def stored_runs(self) -> Sequence[str]:
        """`CheckpointStore.stored_runs`."""
        return await self._hook("stored_runs", self.inner.stored_runs, ())

    async def relist(self, run_id: str) -> SealedCheckpoint | None:
        """`CheckpointStore.relist`."""
        return await self._hook("relist", self.inner.relist, (run_id,))

    async def take_lease(self, run_id: str, owner: str, token: str, ttl_s: float) -> Lease:
        """`CheckpointStore.take_lease`."""
        return await self._hook("take_lease", self.inner.take_lease, (run_id, owner, token, ttl_s))

    async def renew_lease(self, run_id: str, token: str, ttl_s: float) -> Lease | None:
        """`CheckpointStore.renew_lease`."""
        return await self._hook("renew_lease", self.inner.renew_lease, (run_id, token, ttl_s))

    async def release_lease(self, run_id: str, token: str) -> bool:
        """`CheckpointStore.release_lease`."""
        return await self._hook("release_lease", self.inner.release_lease, (run_id, token))

    async def leases(self, run_ids: Sequence[str]) -> Mapping[str, Lease]:
        """`CheckpointStore.leases`."""
        return await self._hook("leases", self.inner.leases, (run_ids,))

    async def put_marker(self, key: str, value: str, token: str, ttl_s: float) -> Marker:
        """`MarkerStore.put_marker`."""
        return await self._hook("put_marker", self.inner.put_marker, (key, value, token, ttl_s))

    async def peek_markers(self, keys: Sequence[str]) -> Mapping[str, Marker]:
        """`MarkerStore.peek_markers`."""
        return await self._hook("peek_markers", self.inner.peek_markers, (keys,))

    async def take_marker(self, key: str, token: str) -> bool:
        """`MarkerStore.take_marker`."""
        return await self._hook("take_marker", self.inner.take_marker, (key, token))

    async def aclose(self) -> None:
        """Close the wrapped store (no operation on runs: no hook runs)."""
        await self.inner.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
