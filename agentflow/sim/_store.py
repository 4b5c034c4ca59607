"""`SimPoints`: the store hook that puts a scheduling point before and after each store operation.

The store underneath is the real one (the memory store, a SQLite file, the Redis scripts on
fakeredis with Lua, or a store of your own), wrapped in a `ForwardingStore` with this hook:
the simulation adds points and faults, never a model of the store. Each operation is atomic
in the real store, so the two points around it are the only places another actor can come
between.

At the point before an operation the scheduler may make it fail (`StoreFault`): before it
takes effect (nothing happened), or after (it happened and the caller sees an error, as a
timeout after the server applied the write does). Both raise `CheckpointError`, what every
shipped store raises when its backend fails.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from agentflow._errors import CheckpointError
from agentflow.exec.checkpoints.forwarding import ForwardingStore
from agentflow.exec.checkpoints.protocol import CheckpointStore, EventStore, HeadReading, LeaseMoving
from agentflow.exec.checkpoints.records import SealedCall, SealedCheckpoint

_T = TypeVar("_T")

#: What a store fault does: fail before the operation takes effect, or after.
StoreFault = str  # "before" | "after"


class Points:
    """What `SimPoints` asks of the simulation at each operation."""

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


#: The optional parts the simulation forwards (where the store has them). The schedules its seeds
#: pin were drawn over these: confirming durability, packing streams and bookkeeping are left out.
SIM_PARTS = (EventStore, HeadReading, LeaseMoving)


class SimPoints:
    """The simulation's `StoreHook`: points around each operation, which may fail (see the module docstring)."""

    def __init__(self, points: Points) -> None:
        self._points = points

    async def __call__(self, op: str, proceed: Callable[..., Awaitable[_T]], args: tuple[Any, ...]) -> _T:
        name, run_id, wrote = self._what(op, args)
        await self._points.point(f"store.{name}", run_id)
        fault = self._points.store_fault(name)
        if fault == "before":
            raise CheckpointError(f"simulated store failure before {name} took effect")
        result = await proceed(*args)
        if wrote is not None:
            wrote()
        if fault == "after":
            raise CheckpointError(f"simulated store failure after {name} took effect (the caller cannot tell)")
        await self._points.point(f"store.{name}.returned")
        return result

    def _what(self, op: str, args: tuple[Any, ...]) -> tuple[str, str | None, Callable[[], None] | None]:
        """The operation's name at its points, the run whose rows it writes, and what to report once it took effect.

        A call record is named by its kind (``record_call.started``), a save that moves the
        lease ``save_moving``; a lease take reports the take, a write what it wrote.
        """
        points = self._points
        if op in ("save", "save_after_calls", "save_after_calls_moving"):
            run_id, checkpoint = args[0], args[2]
            calls: Sequence[SealedCall] = args[3] if op != "save" else ()
            name = "save_moving" if op == "save_after_calls_moving" else op
            return name, run_id, lambda: points.wrote(run_id, checkpoint, calls)
        if op in ("record_call", "record_call_moving"):
            run_id, record = args[0], args[1]
            return f"record_call.{record.kind}", run_id, lambda: points.wrote(run_id, None, (record,))
        if op in ("take_lease", "take_lease_reading_head"):
            return op, None, lambda: points.took(args[0])
        return op, None, None


def sim_store(inner: CheckpointStore, points: Points) -> CheckpointStore:
    """`inner`, with `SimPoints` around each operation (and the optional parts of `SIM_PARTS` it has)."""
    return ForwardingStore(inner, [SimPoints(points)], parts=SIM_PARTS)
