"""`FaultyStore`: one worker's view of any store, which crashes or fails at the Nth write of a chosen kind.

Writes are named by kind: ``save`` (a checkpoint) or the kind of a call record (``started``,
``done``, ``pending``, ``denied``, ``failed``, ``unrecordable``). A fault picks the Nth write
of a kind (optionally only of one step, tool or node) and fires ``before`` it reaches the
store or ``after`` it is stored:

    store = FaultyStore(inner).crash("save", step=2)                      # dies before saving step 2
    store = FaultyStore(inner, die=sigkill).crash("done", tool="charge_card", when="after")
    store = FaultyStore(inner).fail("started", CheckpointError("down"), nth=2)

A crash calls the store's ``die`` (`_kit.tickets.raise_crash` by default: `Crash`, which the
runner cannot catch; `_kit.tickets.sigkill` in a worker subprocess); a failure raises the
given exception. ``save_after_calls`` (records and a checkpoint in one atomic write) counts
as each of its records and then its save: a fault before any of them fires before the one
write, so nothing of it is stored; after any of them, after all of it is stored. With
``atomic_saves=False`` it is split into its records and then the save instead.

Every other member of the store is forwarded explicitly (no ``__getattr__``), so a member
the `CheckpointStore` protocol gains shows up here as missing when mypy checks `_conforms`
(``MYPYPATH=tests mypy -p _kit``).
The wrapper also logs what it wrote (`writes`), what the store refused (`refused`) and how
often each read ran (`reads`), and can make a worker wait for its rivals before its first
write (`rendezvous`), so that every racer has read the run before any of them claims it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from _kit.tickets import raise_crash
from agentflow.exec.checkpoints import CheckpointConflict, CheckpointStore, SealedCall, SealedCheckpoint
from agentflow.exec.checkpoints.records import Lease, Marker

#: The kinds of write a fault can pick.
WRITE_KINDS = ("save", "started", "done", "pending", "denied", "failed", "unrecordable")


@dataclasses.dataclass
class Fault:
    """One fault, armed until it fires."""

    write: str
    nth: int = 1
    when: str = "before"
    step: int | None = None
    tool: str | None = None
    node: str | None = None
    error: BaseException | None = None
    """None: a crash (the store's ``die``); else the exception to raise."""
    seen: int = 0

    def __post_init__(self) -> None:
        if self.write not in WRITE_KINDS:
            raise ValueError(f"unknown write kind {self.write!r}; known: {WRITE_KINDS}")
        if self.when not in ("before", "after"):
            raise ValueError(f"when must be 'before' or 'after', not {self.when!r}")
        if self.nth < 1:
            raise ValueError(f"nth counts from 1, not {self.nth!r}")


@dataclasses.dataclass(frozen=True)
class _Write:
    kind: str
    step: int | None = None
    tool: str | None = None
    node: str | None = None

    def __str__(self) -> str:
        if self.kind == "save":
            return f"save of step {self.step}"
        return f"{self.kind} record of {self.tool or '?'} ({self.node or '?'})"


def body(row: SealedCall | SealedCheckpoint) -> dict[str, Any]:
    """Decode a stored payload (tests only: the library decodes only after checking the signature)."""
    decoded: dict[str, Any] = json.loads(row.payload)
    return decoded


def node_of(record: SealedCall) -> str:
    """The node that made a call record (from its call id ``superstep/node/ordinal/digest``; '' if none)."""
    parts = str(body(record).get("call_id", "")).split("/")
    return parts[1] if len(parts) > 1 else ""


class FaultyStore:
    """Wraps one worker's store: injects faults at chosen writes, meets rivals, logs what happened."""

    def __init__(
        self,
        inner: CheckpointStore,
        *,
        die: Callable[[str], NoReturn] = raise_crash,
        trace: list[str] | None = None,
        atomic_saves: bool = True,
    ) -> None:
        """Wrap `inner`.

        Args:
            inner: the store every call goes to.
            die: what a crash does (`raise_crash`: raise `Crash`; `sigkill`: kill the process).
            trace: a list shared with the tools (`Tickets.trace`) to which writes are appended
                as ``save:<step>:<status>`` and ``record:<kind>:<node>``.
            atomic_saves: forward ``save_after_calls`` as the one atomic write it is; False
                splits it into its records and then the save, as the runner writes them to a
                store without it, so that a crash can fall between a ``done`` and its checkpoint.
        """
        self.inner = inner
        self.atomic_saves = atomic_saves
        self.die = die
        self.faults: list[Fault] = []
        #: Awaited once, before this worker's first write (set by `meet` or `file_rendezvous`).
        self.rendezvous: Callable[[], Awaitable[None]] | None = None
        #: Successful writes: ``save:<step>:<status>`` or ``record:<kind>:<node>``.
        self.writes: list[str] = []
        #: Writes the inner store refused with CheckpointConflict: (``save`` or ``record_call:<kind>``, message).
        self.refused: list[tuple[str, str]] = []
        #: How often each read method ran.
        self.reads: Counter[str] = Counter()
        #: A checkpoint read earlier: `latest` and `head` return it instead of what is stored (a slow worker).
        self.stale_latest: SealedCheckpoint | None = None
        self.trace = trace if trace is not None else []
        self._tool_of: dict[str, str] = {}
        self._split: set[tuple[str, int, int, str]] = set()
        #: Whether the wrapped store lives inside this process.
        self.in_process: bool = inner.in_process
        #: Act as if every rival's lease had lapsed (a frozen worker's): this worker's lease takes
        #: always succeed without asking the store, so racers meet at the claim (`meet`).
        self.rivals_lapsed = False

    @property
    def local_key(self) -> bytes | None:
        """The wrapped store's own signing key (the memory store's), else None."""
        return self.inner.local_key

    # -- arming ------------------------------------------------------------------------------

    def crash(
        self,
        write: str,
        *,
        nth: int = 1,
        when: str = "before",
        step: int | None = None,
        tool: str | None = None,
        node: str | None = None,
    ) -> FaultyStore:
        """Die at the `nth` write of kind `write` (of `step`, `tool`, `node` when given), `when` before or after it."""
        self.faults.append(Fault(write, nth, when, step, tool, node))
        return self

    def fail(
        self,
        write: str,
        error: BaseException,
        *,
        nth: int = 1,
        when: str = "before",
        step: int | None = None,
        tool: str | None = None,
        node: str | None = None,
    ) -> FaultyStore:
        """Raise `error` at the `nth` write of kind `write`, as a store that failed there would."""
        self.faults.append(Fault(write, nth, when, step, tool, node, error))
        return self

    # -- the fault machinery -----------------------------------------------------------------

    def _describe(self, record: SealedCall) -> _Write:
        decoded = body(record)
        call_id = str(decoded.get("call_id", ""))
        if record.kind == "started" and "tool" in decoded:
            self._tool_of[call_id] = str(decoded["tool"])
        return _Write(record.kind, None, self._tool_of.get(call_id), node_of(record))

    def _due(self, write: _Write) -> list[Fault]:
        """Count `write` against every armed fault it matches; return (and disarm) those whose turn it is."""
        due = []
        for fault in list(self.faults):
            if fault.write != write.kind:
                continue
            if fault.step is not None and fault.step != write.step:
                continue
            if (fault.tool is not None and fault.tool != write.tool) or (
                fault.node is not None and fault.node != write.node
            ):
                continue
            fault.seen += 1
            if fault.seen == fault.nth:
                self.faults.remove(fault)
                due.append(fault)
        return due

    def _fire(self, due: Sequence[tuple[Fault, _Write]], when: str) -> None:
        for fault, write in due:
            if fault.when == when:
                if fault.error is not None:
                    raise fault.error
                self.die(f"{when} the {write}")

    async def _meet(self) -> None:
        meet, self.rendezvous = self.rendezvous, None
        if meet is not None:
            await meet()

    def _log(self, entry: str) -> None:
        self.writes.append(entry)
        self.trace.append(entry)

    # -- writes --------------------------------------------------------------------------------

    async def save(self, run_id: str, step: int, checkpoint: SealedCheckpoint) -> None:
        """Forward `CheckpointStore.save`, with the faults armed for ``save``."""
        await self._meet()
        write = _Write("save", step)
        due = [(f, write) for f in self._due(write)]
        self._fire(due, "before")
        try:
            await self.inner.save(run_id, step, checkpoint)
        except CheckpointConflict as exc:
            self.refused.append(("save", str(exc)))
            raise
        self._log(f"save:{step}:{checkpoint.status}")
        self._fire(due, "after")

    async def record_call(self, run_id: str, record: SealedCall) -> None:
        """Forward `CheckpointStore.record_call`, with the faults armed for the record's kind."""
        if (run_id, record.segment, record.seq, record.sig) in self._split:
            # The runner stores a refused combined write's records on their own; a split one stored them already.
            self._split.discard((run_id, record.segment, record.seq, record.sig))
            return
        await self._meet()
        write = self._describe(record)
        due = [(f, write) for f in self._due(write)]
        self._fire(due, "before")
        try:
            await self.inner.record_call(run_id, record)
        except CheckpointConflict as exc:
            self.refused.append((f"record_call:{record.kind}", str(exc)))
            raise
        self._log(f"record:{record.kind}:{write.node}")
        self._fire(due, "after")

    async def save_after_calls(
        self, run_id: str, step: int, checkpoint: SealedCheckpoint, calls: Sequence[SealedCall]
    ) -> None:
        """Forward the atomic records-then-checkpoint write (each record, then the save, for the faults)."""
        if not self.atomic_saves:
            self._split.clear()
            for record in calls:
                await self.record_call(run_id, record)
            self._split = {(run_id, r.segment, r.seq, r.sig) for r in calls}
            await self.save(run_id, step, checkpoint)
            self._split.clear()
            return
        await self._meet()
        writes = [self._describe(r) for r in calls] + [_Write("save", step)]
        due = [(f, w) for w in writes for f in self._due(w)]
        self._fire(due, "before")
        try:
            await self.inner.save_after_calls(run_id, step, checkpoint, calls)
        except CheckpointConflict as exc:
            self.refused.append(("save", str(exc)))
            raise
        for record, write in zip(calls, writes, strict=False):
            self._log(f"record:{record.kind}:{write.node}")
        self._log(f"save:{step}:{checkpoint.status}")
        self._fire(due, "after")

    async def delete(self, run_id: str) -> None:
        """Forward `CheckpointStore.delete`."""
        await self.inner.delete(run_id)

    # -- reads ---------------------------------------------------------------------------------

    async def latest(self, run_id: str) -> SealedCheckpoint:
        """Forward `CheckpointStore.latest`."""
        self.reads["latest"] += 1
        if self.stale_latest is not None:
            return self.stale_latest
        return await self.inner.latest(run_id)

    async def head(self, run_id: str) -> tuple[SealedCheckpoint, Mapping[int, int]]:
        """Forward `CheckpointStore.head` (with `stale_latest`: that row, and the records counted now)."""
        self.reads["head"] += 1
        if self.stale_latest is None:
            return await self.inner.head(run_id)
        return self.stale_latest, Counter(r.segment for r in await self.inner.calls(run_id))

    async def history(self, run_id: str) -> Sequence[SealedCheckpoint]:
        """Forward `CheckpointStore.history`."""
        self.reads["history"] += 1
        return await self.inner.history(run_id)

    async def calls(self, run_id: str) -> Sequence[SealedCall]:
        """Forward `CheckpointStore.calls`."""
        self.reads["calls"] += 1
        return await self.inner.calls(run_id)

    async def list_unfinished(self, flow: str) -> Sequence[str]:
        """Forward `CheckpointStore.list_unfinished`."""
        self.reads["list_unfinished"] += 1
        return await self.inner.list_unfinished(flow)

    async def list_runs(self, flow: str | None = None, limit: int = 1000) -> Sequence[SealedCheckpoint]:
        """Forward `CheckpointStore.list_runs`."""
        self.reads["list_runs"] += 1
        return await self.inner.list_runs(flow, limit)

    async def stored_runs(self) -> Sequence[str]:
        """Forward `CheckpointStore.stored_runs`."""
        self.reads["stored_runs"] += 1
        return await self.inner.stored_runs()

    async def relist(self, run_id: str) -> SealedCheckpoint | None:
        """Forward `CheckpointStore.relist` (it writes only the listing index: not a write a fault picks)."""
        return await self.inner.relist(run_id)

    # -- leases (forwarded as they are: no fault, rendezvous or log picks them) --------------------

    async def take_lease(self, run_id: str, owner: str, token: str, ttl_s: float) -> Lease:
        """Forward `CheckpointStore.take_lease` (with `rivals_lapsed`: granted without asking the store)."""
        if self.rivals_lapsed:
            return Lease(run_id, owner, token, time.time() + ttl_s)
        return await self.inner.take_lease(run_id, owner, token, ttl_s)

    async def renew_lease(self, run_id: str, token: str, ttl_s: float) -> Lease | None:
        """Forward `CheckpointStore.renew_lease`."""
        if self.rivals_lapsed:
            return Lease(run_id, "racer", token, time.time() + ttl_s)
        return await self.inner.renew_lease(run_id, token, ttl_s)

    async def release_lease(self, run_id: str, token: str) -> bool:
        """Forward `CheckpointStore.release_lease`."""
        if self.rivals_lapsed:
            return True
        return await self.inner.release_lease(run_id, token)

    async def leases(self, run_ids: Sequence[str]) -> Mapping[str, Lease]:
        """Forward `CheckpointStore.leases`."""
        return await self.inner.leases(run_ids)

    # -- markers (forwarded as they are) -----------------------------------------------------------

    async def put_marker(self, key: str, value: str, token: str, ttl_s: float) -> Marker:
        """Forward `MarkerStore.put_marker`."""
        return await self.inner.put_marker(key, value, token, ttl_s)

    async def peek_markers(self, keys: Sequence[str]) -> Mapping[str, Marker]:
        """Forward `MarkerStore.peek_markers`."""
        return await self.inner.peek_markers(keys)

    async def take_marker(self, key: str, token: str) -> bool:
        """Forward `MarkerStore.take_marker`."""
        return await self.inner.take_marker(key, token)

    # -- life cycle ------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Forward `CheckpointStore.aclose`."""
        await self.inner.aclose()

    async def __aenter__(self) -> FaultyStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _conforms(store: FaultyStore) -> CheckpointStore:
    """Type-checked: a FaultyStore is a CheckpointStore (mypy names any protocol member it lacks)."""
    return store


# -- rendezvous -------------------------------------------------------------------------------


def meet(*stores: FaultyStore) -> None:
    """Make the workers of `stores` (one event loop) wait for each other before their first write.

    Racers that meet got past the run's lease, as a frozen worker's rival does once its lease
    lapsed (`rivals_lapsed`): what they prove is that the claim's compare-and-set and the
    fencing let exactly one of them act. That the lease itself keeps a second worker out is
    proved on its own (tests/protocol/test_ownership.py).
    """
    barrier = asyncio.Barrier(len(stores))

    async def wait() -> None:
        await barrier.wait()

    for store in stores:
        store.rendezvous = wait
        store.rivals_lapsed = True


def file_rendezvous(folder: Path, me: str, parties: int, timeout_s: float = 30.0) -> Callable[[], Awaitable[None]]:
    """A rendezvous across processes: touch ``folder/ready-<me>``, wait until `parties` files are there."""

    async def wait() -> None:
        (folder / f"ready-{me}").touch()
        async with asyncio.timeout(timeout_s):
            while len(list(folder.glob("ready-*"))) < parties:
                await asyncio.sleep(0.005)

    return wait


class WriteLog(FaultyStore):
    """A `FaultyStore` that also notes each write by method in `methods` (beside `FaultyStore.writes`).

    ``record:<kind>`` for `record_call`, ``save:<step>`` for `save`, ``both:<kinds>:<step>``
    for `save_after_calls` (the records that went with the checkpoint), after the write.
    """

    def __init__(self, inner: CheckpointStore) -> None:
        super().__init__(inner)
        self.methods: list[str] = []

    async def record_call(self, run_id: str, record: SealedCall) -> None:
        await super().record_call(run_id, record)
        self.methods.append(f"record:{record.kind}")

    async def save(self, run_id: str, step: int, checkpoint: SealedCheckpoint) -> None:
        await super().save(run_id, step, checkpoint)
        self.methods.append(f"save:{step}")

    async def save_after_calls(
        self, run_id: str, step: int, checkpoint: SealedCheckpoint, calls: Sequence[SealedCall]
    ) -> None:
        await super().save_after_calls(run_id, step, checkpoint, calls)
        self.methods.append(f"both:{','.join(c.kind for c in calls)}:{step}")
