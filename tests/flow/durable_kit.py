"""Shared flows, tools, ledger and store set-ups for the durable-run tests of tests/flow/.

Imported as a sibling module (``import durable_kit``): pytest's default ``prepend`` import
mode puts tests/flow on ``sys.path`` before it imports a test module from there. The
cross-process race test runs it in a subprocess with tests/flow on ``PYTHONPATH``.

What lives here:
- `LEDGER`: how often each tool really ran (its side effect); `reset()` clears it per test.
- `Crash`: a simulated process death. It derives from BaseException, not Exception, so
  the runner cannot catch it and mark the run failed: the run stays as a dead worker left it.
- `FaultyStore`: wraps a store; it can raise `Crash` at a chosen write, hold two racing
  workers at a rendezvous, and logs what it refused.
- `Env`: one store set-up (memory or SQLite) with runners for "workers" and raw access
  to the stored rows for tamper tests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import json
import sqlite3
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager, closing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from agentflow import Call, Event, Events, Executor, Flow, FlowRunner, Registry, RunContext
from agentflow._errors import CheckpointConflict
from agentflow.exec.checkpoints import (
    CheckpointStore,
    MemoryCheckpointStore,
    SealedCall,
    SealedCheckpoint,
    idempotency_key,
)

#: Keys for the tests (32+ bytes). Never hard-code a key outside tests.
KEY = b"durable-tests-key-A-0123456789abcdef"
KEY_B = b"durable-tests-key-B-0123456789abcdef"
OTHER_KEY = b"durable-tests-key-X-0123456789abcdef"

#: The store set-ups every parametrized `env` fixture runs.
STORE_KINDS = ["memory", "sqlite"]


class Crash(BaseException):
    """A simulated process death (BaseException, so the runner does not mark the run failed)."""


# -- the ledger: what really ran ---------------------------------------------------------

#: How often each tool's side effect happened (one count per invocation of the tool body).
LEDGER: Counter[str] = Counter()
#: (tool, idempotency_key()) for every invocation of a tool that records its key.
KEYS: list[tuple[str, str]] = []
#: The RunContext each approval policy of the `audit` tool was asked with.
SEEN_CTX: list[RunContext | None] = []
#: Order of tool runs and store writes: ``tool:<name>``, ``record:<kind>:<node>``, ``save:<step>:<status>``.
TRACE: list[str] = []
#: Tools that raise `Crash` on their next invocation, right after their side effect.
CRASH_IN: set[str] = set()
#: Tools whose next invocation blocks on this event (after setting ENTERED[name]).
GATES: dict[str, asyncio.Event] = {}
ENTERED: dict[str, asyncio.Event] = {}
#: Node arguments read from here, so a test can change them "between crash and recovery".
SWITCH: dict[str, int] = {"extra_seats": 0}


def reset() -> None:
    """Forget everything a previous test left in the module-level ledgers and switches."""
    LEDGER.clear()
    KEYS.clear()
    SEEN_CTX.clear()
    TRACE.clear()
    CRASH_IN.clear()
    GATES.clear()
    ENTERED.clear()
    SWITCH["extra_seats"] = 0


def _effect(name: str) -> None:
    LEDGER[name] += 1
    TRACE.append(f"tool:{name}")
    if name in CRASH_IN:
        CRASH_IN.discard(name)
        raise Crash(f"the worker died inside {name}")


async def _maybe_wait(name: str) -> None:
    gate = GATES.pop(name, None)
    if gate is not None:
        ENTERED.setdefault(name, asyncio.Event()).set()
        await gate.wait()


def gate(name: str) -> tuple[asyncio.Event, asyncio.Event]:
    """Make the next invocation of tool `name` block; return (release, entered) events."""
    release, entered = asyncio.Event(), asyncio.Event()
    GATES[name] = release
    ENTERED[name] = entered
    return release, entered


# -- tools --------------------------------------------------------------------------------

REGISTRY = Registry()


@REGISTRY.tool(idempotent=True)
async def hold_seats(show: str, seats: int) -> str:
    """Hold seats (safe to repeat)."""
    _effect("hold_seats")
    return f"held {seats} for {show}"


@REGISTRY.tool
async def charge_card(show: str, seats: int) -> str:
    """Charge the card (not idempotent: records its idempotency key)."""
    KEYS.append(("charge_card", idempotency_key()))
    _effect("charge_card")
    return f"charged {seats * 40} for {show}"


@REGISTRY.tool
def email_tickets(show: str) -> str:
    """Mail the tickets (a sync tool, run on a thread; not idempotent)."""
    _effect("email_tickets")
    return f"mailed {show}"


@REGISTRY.tool(idempotent=True)
async def slow_lookup(show: str) -> str:
    """A lookup that a test can hold open with `gate` (idempotent)."""
    _effect("slow_lookup")
    await _maybe_wait("slow_lookup")
    return f"looked up {show}"


class Opaque:
    """A value JSON cannot carry."""


@REGISTRY.tool
async def make_opaque(show: str) -> object:
    """Return something the call log cannot store (not idempotent)."""
    _effect("make_opaque")
    return Opaque()


@REGISTRY.tool(approval=lambda args, ctx: args["amount"] > 100)
async def refund(amount: int) -> str:
    """Refund money; amounts over 100 need approval."""
    _effect("refund")
    return f"refunded {amount}"


@REGISTRY.tool(approval=True)
async def wire(amount: int) -> str:
    """Wire money; always needs approval."""
    _effect("wire")
    return f"wired {amount}"


@REGISTRY.tool
async def notify(amount: int) -> str:
    """Tell the customer the refund went out."""
    _effect("notify")
    return f"notified {amount}"


@REGISTRY.tool
async def apologize(amount: int) -> str:
    """Tell the customer the refund was denied."""
    _effect("apologize")
    return f"apologized {amount}"


def _audit_policy(args: Mapping[str, Any], ctx: RunContext | None) -> bool:
    SEEN_CTX.append(ctx)
    return False


@REGISTRY.tool(idempotent=True, approval=_audit_policy)
async def audit(n: int) -> str:
    """An audited step: its approval policy records the RunContext it is asked with."""
    _effect("audit")
    return f"audited {n}"


# -- flows --------------------------------------------------------------------------------


class Order(BaseModel):
    """The seed's ticket order."""

    show: str
    seats: int
    held: str = ""
    looked: str = ""
    paid: str = ""
    sent: str = ""


ORDER = Order(show="Hamlet", seats=2)


def order_args(order: Order) -> dict[str, object]:
    """Arguments of hold_seats and charge_card."""
    return {"show": order.show, "seats": order.seats}


def show_args(order: Order) -> dict[str, object]:
    """Arguments of email_tickets and slow_lookup."""
    return {"show": order.show}


def switch_args(order: Order) -> dict[str, object]:
    """Like `order_args`, but a test can change the seats through `SWITCH`."""
    return {"show": order.show, "seats": order.seats + SWITCH["extra_seats"]}


def tickets_flow(*, with_receipt: bool = False) -> Flow[Order]:
    """The seed's flow: hold -> pay -> send (supersteps 0, 1, 2). `with_receipt` changes its graph."""
    flow = (
        Flow("tickets", state=Order)
        .node("hold", Call("hold_seats", args=order_args, into="held"))
        .node("pay", Call("charge_card", args=order_args, into="paid"))
        .node("send", Call("email_tickets", args=show_args, into="sent"))
        .edge("hold", "pay")
        .edge("pay", "send")
    )
    if with_receipt:
        flow.node("receipt", Call("hold_seats", args=order_args, into="looked")).edge("send", "receipt")
        return flow.end("receipt")
    return flow.end("send")


TICKETS = tickets_flow()

#: pay -> send, where pay's arguments depend on `SWITCH`.
SWITCHED = (
    Flow("switched", state=Order)
    .node("pay", Call("charge_card", args=switch_args, into="paid"))
    .node("send", Call("email_tickets", args=show_args, into="sent"))
    .edge("pay", "send")
    .end("send")
)


async def batch_node(order: Order, handle: Any) -> dict[str, object]:
    """One node, three calls in order: hold_seats, slow_lookup, charge_card."""
    held = await handle.call("hold_seats", show=order.show, seats=order.seats)
    looked = await handle.call("slow_lookup", show=order.show)
    paid = await handle.call("charge_card", show=order.show, seats=order.seats)
    return {"held": held, "looked": looked, "paid": paid}


#: batch (three calls in one node) -> send.
BATCH = (
    Flow("batch", state=Order)
    .node("batch", batch_node)
    .node("send", Call("email_tickets", args=show_args, into="sent"))
    .edge("batch", "send")
    .end("send")
)

#: look (slow_lookup, one call) -> pay -> send.
LOOKUP = (
    Flow("lookup", state=Order)
    .node("look", Call("slow_lookup", args=show_args, into="looked"))
    .node("pay", Call("charge_card", args=order_args, into="paid"))
    .node("send", Call("email_tickets", args=show_args, into="sent"))
    .edge("look", "pay")
    .edge("pay", "send")
    .end("send")
)


async def opaque_node(order: Order, handle: Any) -> dict[str, object]:
    """Call make_opaque; the state only keeps a note that it ran."""
    await handle.call("make_opaque", show=order.show)
    return {"looked": "opaque"}


#: opaque (result cannot be stored) -> send.
OPAQUE = (
    Flow("opaque", state=Order)
    .node("opaque", opaque_node)
    .node("send", Call("email_tickets", args=show_args, into="sent"))
    .edge("opaque", "send")
    .end("send")
)

#: first -> second, both `audit` calls whose policy records the RunContext.
AUDITED = (
    Flow("audited", state=Order)
    .node("first", Call("audit", args={"n": 1}, into="held"))
    .node("second", Call("audit", args={"n": 2}, into="paid"))
    .edge("first", "second")
    .end("second")
)


class Refund(BaseModel):
    """A refund request."""

    amount: int
    outcome: str = ""
    after: str = ""


def amount_args(req: Refund) -> dict[str, object]:
    """Arguments of refund, wire, notify, apologize."""
    return {"amount": req.amount}


def was_denied(req: Refund) -> bool:
    """The refund node stored `on_deny`'s value."""
    return req.outcome == "denied"


def went_out(req: Refund) -> bool:
    """The refund node stored a real result."""
    return req.outcome != "denied"


#: refund (approval over 100, on_deny="denied") -> notify | apologize.
REFUNDS = (
    Flow("refunds", state=Refund)
    .node("refund", Call("refund", args=amount_args, into="outcome", on_deny="denied"))
    .node("notify", Call("notify", args=amount_args, into="after"))
    .node("apologize", Call("apologize", args=amount_args, into="after"))
    .edge("refund", "notify", when=went_out)
    .edge("refund", "apologize", when=was_denied)
    .end("notify", "apologize")
)

#: wire (always needs approval, no on_deny) -> notify.
WIRES = (
    Flow("wires", state=Refund)
    .node("wire", Call("wire", args=amount_args, into="outcome"))
    .node("notify", Call("notify", args=amount_args, into="after"))
    .edge("wire", "notify")
    .end("notify")
)


# -- store wrapper ----------------------------------------------------------------------


def body(row: SealedCall | SealedCheckpoint) -> dict[str, Any]:
    """Decode a stored payload (tests only: the library decodes only after checking the signature)."""
    decoded: dict[str, Any] = json.loads(row.payload)
    return decoded


def node_of(record: SealedCall) -> str:
    """The node that made a call record (from its call id ``superstep/node/ordinal/digest``)."""
    return str(body(record)["call_id"]).split("/")[1]


@dataclasses.dataclass
class _Fault:
    op: str
    when: str
    step: int | None
    kind: str | None
    node: str | None

    def matches(self, op: str, when: str, step: int | None, record: SealedCall | None) -> bool:
        if (op, when) != (self.op, self.when):
            return False
        if self.step is not None and step != self.step:
            return False
        if record is not None and self.kind is not None and record.kind != self.kind:
            return False
        return record is None or self.node is None or node_of(record) == self.node


class FaultyStore:
    """A store wrapper for one worker: crashes on cue, meets a rival at a rendezvous, logs refusals."""

    def __init__(self, inner: CheckpointStore) -> None:
        self.inner = inner
        self.in_process = inner.in_process
        self.local_key = getattr(inner, "local_key", None)
        self.faults: list[_Fault] = []
        #: Shared by two racing workers: each waits here after reading the call log, before claiming.
        self.rendezvous: asyncio.Barrier | None = None
        #: Writes the inner store refused with CheckpointConflict: (op, detail).
        self.refused: list[tuple[str, str]] = []
        #: Successful writes: ``save:<step>:<status>`` or ``record:<kind>:<node>``.
        self.writes: list[str] = []

    def crash(
        self,
        op: str,
        *,
        when: str = "before",
        step: int | None = None,
        kind: str | None = None,
        node: str | None = None,
    ) -> FaultyStore:
        """Raise `Crash` once, `when` ("before" or "after") the matching `op` ("save" or "record_call")."""
        self.faults.append(_Fault(op, when, step, kind, node))
        return self

    def _trip(self, op: str, when: str, step: int | None = None, record: SealedCall | None = None) -> None:
        for fault in self.faults:
            if fault.matches(op, when, step, record):
                self.faults.remove(fault)
                raise Crash(f"the worker died {when} {op} (step={step})")

    async def save(self, run_id: str, step: int, checkpoint: SealedCheckpoint) -> None:
        self._trip("save", "before", step)
        try:
            await self.inner.save(run_id, step, checkpoint)
        except CheckpointConflict as exc:
            self.refused.append(("save", str(exc)))
            raise
        self.writes.append(f"save:{step}:{checkpoint.status}")
        TRACE.append(f"save:{step}:{checkpoint.status}")
        self._trip("save", "after", step)

    async def record_call(self, run_id: str, record: SealedCall) -> None:
        self._trip("record_call", "before", None, record)
        try:
            await self.inner.record_call(run_id, record)
        except CheckpointConflict as exc:
            self.refused.append((f"record_call:{record.kind}", str(exc)))
            raise
        self.writes.append(f"record:{record.kind}:{node_of(record)}")
        TRACE.append(f"record:{record.kind}:{node_of(record)}")
        self._trip("record_call", "after", None, record)

    async def calls(self, run_id: str) -> Any:
        rows = await self.inner.calls(run_id)
        meet, self.rendezvous = self.rendezvous, None
        if meet is not None:
            await meet.wait()
        return rows

    async def latest(self, run_id: str) -> SealedCheckpoint:
        return await self.inner.latest(run_id)

    async def history(self, run_id: str) -> Any:
        return await self.inner.history(run_id)

    async def list_unfinished(self, flow: str) -> Any:
        return await self.inner.list_unfinished(flow)

    async def list_runs(self, flow: str | None = None, limit: int = 1000) -> Any:
        return await self.inner.list_runs(flow, limit)

    async def delete(self, run_id: str) -> None:
        await self.inner.delete(run_id)

    async def aclose(self) -> None:
        await self.inner.aclose()


# -- store set-ups ------------------------------------------------------------------------


def sqlite_store_class() -> Any:
    """`SQLiteCheckpointStore`, or skip the test while agentflow/exec/checkpoints/sqlite.py is not written."""
    qualified = "agentflow.exec.checkpoints.sqlite"
    try:
        module = importlib.import_module(qualified)
    except ModuleNotFoundError as exc:
        if exc.name != qualified:  # the module exists but something it imports is missing: a real failure
            raise
        pytest.skip(f"SQLite store not written yet ({qualified} does not exist)")
    if not hasattr(module, "SQLiteCheckpointStore"):
        pytest.skip(f"SQLite store not written yet ({qualified} has no SQLiteCheckpointStore)")
    return module.SQLiteCheckpointStore


@dataclasses.dataclass
class Env:
    """One store set-up: runners ("workers") over shared storage, and raw access to its rows."""

    kind: str
    path: Path | None
    make: Callable[[], CheckpointStore]
    raw: CheckpointStore
    """The storage as a test reads it (never wrapped)."""
    hub: Events = dataclasses.field(default_factory=Events)
    events: list[Event] = dataclasses.field(default_factory=list)
    opened: list[CheckpointStore] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.hub.subscribe(self.events.append)

    def store(self) -> FaultyStore:
        """A new worker's store: a new connection for SQLite, the one shared dict for memory."""
        inner = self.make()
        if inner is not self.raw:
            self.opened.append(inner)
        return FaultyStore(inner)

    def runner(
        self,
        *,
        key: bytes | list[bytes] = KEY,
        approver: Callable[..., Any] | None = None,
        store: FaultyStore | None = None,
    ) -> FlowRunner:
        """A new worker: its own executor and store object over the shared storage."""
        executor = Executor(REGISTRY, approver=approver, events=self.hub)
        return FlowRunner(executor, checkpoints=store or self.store(), checkpoint_key=key)

    def named(self, name: str) -> list[Event]:
        """The events called `name`, in order."""
        return [e for e in self.events if e.name == name]

    # -- raw rows (for tamper tests) ------------------------------------------------------

    async def calls(self, run_id: str) -> list[SealedCall]:
        return list(await self.raw.calls(run_id))

    async def history(self, run_id: str) -> list[SealedCheckpoint]:
        return list(await self.raw.history(run_id))

    def _sql(self, sql: str, params: tuple[Any, ...]) -> int:
        assert self.path is not None
        with closing(sqlite3.connect(self.path)) as conn, conn:
            return conn.execute(sql, params).rowcount

    def put_call(self, at: SealedCall, new: SealedCall) -> None:
        """Overwrite the stored record at `at`'s place (run, segment, seq) with every field of `new`."""
        if isinstance(self.raw, MemoryCheckpointStore):
            seg = self.raw._calls[at.run_id][at.segment]
            seg[next(i for i, r in enumerate(seg) if r.seq == at.seq)] = new
            return
        changed = self._sql(
            "UPDATE calls SET run_id=?, segment=?, seq=?, kind=?, payload=?, kid=?, sig=? "
            "WHERE run_id=? AND segment=? AND seq=?",
            (*dataclasses.astuple(new), at.run_id, at.segment, at.seq),
        )
        assert changed == 1

    def drop_call(self, at: SealedCall) -> None:
        """Delete one stored call record."""
        if isinstance(self.raw, MemoryCheckpointStore):
            seg = self.raw._calls[at.run_id][at.segment]
            seg.remove(next(r for r in seg if r.seq == at.seq))
            return
        changed = self._sql("DELETE FROM calls WHERE run_id=? AND segment=? AND seq=?", (at.run_id, at.segment, at.seq))
        assert changed == 1

    def put_checkpoint(self, at: SealedCheckpoint, new: SealedCheckpoint) -> None:
        """Overwrite the stored checkpoint at `at`'s place (run, step) with every field of `new`."""
        if isinstance(self.raw, MemoryCheckpointStore):
            rows = self.raw._checkpoints[at.run_id]
            rows[next(i for i, r in enumerate(rows) if r.step == at.step)] = new
            return
        changed = self._sql(
            "UPDATE checkpoints SET run_id=?, step=?, flow=?, status=?, segment=?, saved_at=?, payload=?, kid=?, sig=? "
            "WHERE run_id=? AND step=?",
            (*dataclasses.astuple(new), at.run_id, at.step),
        )
        assert changed == 1

    def drop_checkpoint(self, at: SealedCheckpoint) -> None:
        """Delete one stored checkpoint (the listing row of SQLite's ``runs`` table is left as it was)."""
        if isinstance(self.raw, MemoryCheckpointStore):
            rows = self.raw._checkpoints[at.run_id]
            rows.remove(next(r for r in rows if r.step == at.step))
            return
        changed = self._sql("DELETE FROM checkpoints WHERE run_id=? AND step=?", (at.run_id, at.step))
        assert changed == 1

    def stored_bytes(self) -> bytes:
        """Every byte the store holds: the database files for SQLite, every row's fields for memory."""
        if isinstance(self.raw, MemoryCheckpointStore):
            rows: list[Any] = [r for rs in self.raw._checkpoints.values() for r in rs]
            rows += [r for segs in self.raw._calls.values() for seg in segs.values() for r in seg]
            return b"\n".join(repr(r).encode() + b"\n" + r.payload for r in rows)
        assert self.path is not None
        files = [self.path, *self.path.parent.glob(self.path.name + "-*")]  # the file plus its -wal / -shm
        return b"".join(f.read_bytes() for f in files if f.exists())


@asynccontextmanager
async def open_env(kind: str, tmp_path: Path) -> AsyncIterator[Env]:
    """Fresh storage of one kind, every store opened on it closed afterwards; the ledgers reset."""
    reset()
    if kind == "memory":
        shared = MemoryCheckpointStore()
        env = Env(kind, None, lambda: shared, shared)
    elif kind == "sqlite":
        store_class = sqlite_store_class()
        path = tmp_path / "runs.db"
        raw = store_class(path)
        env = Env(kind, path, lambda: store_class(path), raw)
        env.opened.append(raw)
    else:
        raise ValueError(f"unknown store kind {kind!r}")
    try:
        yield env
    finally:
        for store in env.opened:
            await store.aclose()
        reset()


def snapshot() -> Counter[str]:
    """A copy of the ledger, to compare before and after an operation that must run nothing."""
    return Counter(LEDGER)


# -- the cross-process racer --------------------------------------------------------------


class _FileRendezvous(FaultyStore):
    """A store that, after reading the call log, waits until `parties` processes have read it too."""

    def __init__(self, inner: CheckpointStore, meet_dir: Path, me: str, parties: int) -> None:
        super().__init__(inner)
        self.meet_dir, self.me, self.parties = meet_dir, me, parties

    async def calls(self, run_id: str) -> Any:
        rows = await super().calls(run_id)
        (self.meet_dir / f"read-{self.me}").touch()
        async with asyncio.timeout(30):
            while len(list(self.meet_dir.glob("read-*"))) < self.parties:
                await asyncio.sleep(0.01)
        return rows


async def race_recover(path: str, run_id: str, me: str, meet_dir: str) -> dict[str, Any]:
    """One worker process of the cross-process race: recover `run_id` of TICKETS from the SQLite file.

    Prints ``ready`` once connected, waits for a line on stdin, then recovers; every racer reads the
    call log before any of them claims. Returns the outcome (``won`` or ``conflict``), what its
    tools did and what it wrote.
    """
    import sys

    store = _FileRendezvous(sqlite_store_class()(Path(path)), Path(meet_dir), me, 2)
    runner = FlowRunner(Executor(REGISTRY), checkpoints=store, checkpoint_key=KEY)
    try:
        await store.latest(run_id)  # connect before the race starts
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        try:
            result = await runner.recover(TICKETS, run_id)
            outcome, status = "won", str(result.status)
        except CheckpointConflict:
            outcome, status = "conflict", None
    finally:
        await store.aclose()
    return {"outcome": outcome, "status": status, "ledger": dict(LEDGER), "writes": store.writes}
