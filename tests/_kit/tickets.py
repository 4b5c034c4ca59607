"""The ticket order every durable-run test uses: its state, its tools, their ledger, its flows.

The seed's flow: ``hold`` (hold_seats, idempotent) -> ``pay`` (charge_card) -> ``send``
(email_tickets, a sync tool), one superstep each. `make_tickets` builds the tools on a new
`Registry` around a `Ledger` that records every real effect (one entry per invocation of a
tool body, with its run id and ``idempotency_key()``), so a test can assert that no effect
ran twice: ``tickets.ledger.repeated() == {}``.

A tool can be made to die right after its effect (``tickets.crash_in.add("charge_card")``):
in-process with `Crash` (the default), in a worker subprocess with SIGKILL (``die=sigkill``).
A file ledger (``Ledger(path)``) is shared by every process that writes it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NoReturn

from pydantic import BaseModel

from agentflow import Call, Flow, Registry, RunContext
from agentflow.exec import current_call, idempotency_key

#: Keys for the tests (32+ bytes). Never hard-code a key outside tests.
KEY = b"durable-tests-key-A-0123456789abcdef"
KEY_B = b"durable-tests-key-B-0123456789abcdef"
OTHER_KEY = b"durable-tests-key-X-0123456789abcdef"

#: The three tools of the ticket flow, in the order it calls them.
TOOLS = ("hold_seats", "charge_card", "email_tickets")
#: The ticket tools whose effect must never happen twice without a decision.
NON_IDEMPOTENT = frozenset({"charge_card", "email_tickets", "make_opaque", "refund", "wire", "wire_money"})


class Crash(BaseException):
    """A simulated process death (BaseException, so the runner cannot catch it and mark the run failed)."""


def raise_crash(where: str) -> NoReturn:
    """Die in-process: raise `Crash` (the run stays as a dead worker left it)."""
    raise Crash(f"the worker died {where}")


def sigkill(where: str) -> NoReturn:
    """Die like a worker the kernel killed: SIGKILL to this process, no cleanup, no flush, no finally."""
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable: SIGKILL was not delivered")


# -- the ledger ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Effect:
    """One real effect: a tool body ran (or a model was called), in the process `pid`."""

    tool: str
    run_id: str
    key: str
    """The call's ``idempotency_key()``, or a detail (a model call's number)."""
    pid: int = 0
    """The process that had the effect (which worker process ran the tool)."""


class Ledger:
    """Every real effect, in order; in memory, or in an append-only file that other processes share.

    A file ledger fsyncs each line before the tool returns, so an effect is counted even when
    the process is killed right after it.
    """

    def __init__(self, path: Path | str | None = None, *, env: str | None = None) -> None:
        """Keep effects in memory, in the file `path`, or in the file named by environment variable `env`."""
        self._path = Path(path) if path is not None else None
        self._env = env
        self._memory: list[Effect] = []

    @property
    def path(self) -> Path | None:
        """The file (read from the environment on each use when `env` was given)."""
        return Path(os.environ[self._env]) if self._env else self._path

    def record(self, tool: str, run_id: str = "", key: str = "") -> None:
        """Note one effect."""
        path = self.path
        if path is None:
            self._memory.append(Effect(tool, run_id, key, os.getpid()))
            return
        with path.open("a") as fh:
            fh.write(json.dumps([tool, run_id, key, os.getpid()]) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def entries(self) -> list[Effect]:
        """Every effect so far, oldest first."""
        path = self.path
        if path is None:
            return list(self._memory)
        if not path.exists():
            return []
        return [Effect(*json.loads(line)) for line in path.read_text().splitlines() if line.strip()]

    def counts(self, run_id: str | None = None) -> Counter[str]:
        """How often each tool's effect happened (in one run, or in all)."""
        return Counter(e.tool for e in self.entries() if run_id is None or e.run_id == run_id)

    def by_run(self) -> Counter[tuple[str, str]]:
        """How often each (tool, run id) effect happened."""
        return Counter((e.tool, e.run_id) for e in self.entries())

    def keys(self, tool: str) -> list[str]:
        """The idempotency keys `tool` ran with, in order."""
        return [e.key for e in self.entries() if e.tool == tool]

    def repeated(self, tools: Iterable[str] = NON_IDEMPOTENT) -> dict[tuple[str, str], int]:
        """The (tool, run id) effects of `tools` that happened more than once: ``{}`` when none ran twice."""
        wanted = set(tools)
        return {k: n for k, n in self.by_run().items() if n > 1 and k[0] in wanted}

    def clear(self) -> None:
        """Forget every effect."""
        self._memory.clear()
        path = self.path
        if path is not None and path.exists():
            path.unlink()


# -- the tools -------------------------------------------------------------------------------


class Opaque:
    """A value JSON cannot carry."""


@dataclasses.dataclass
class Tickets:
    """The ticket tools of one test (or one worker process) and what they did."""

    registry: Registry
    ledger: Ledger
    die: Callable[[str], NoReturn]
    #: Tools that die on their next invocation, right after their effect (once each).
    crash_in: set[str] = dataclasses.field(default_factory=set)
    #: The RunContext each approval policy of `audit` was asked with.
    seen_ctx: list[RunContext | None] = dataclasses.field(default_factory=list)
    #: Order of tool runs (``tool:<name>``); a `FaultyStore` given the same list adds its writes.
    trace: list[str] = dataclasses.field(default_factory=list)
    #: Seats added to charge_card's arguments in `switched_flow` (a test changes them "between crash and recovery").
    extra_seats: int = 0
    _gates: dict[str, tuple[asyncio.Event, asyncio.Event]] = dataclasses.field(default_factory=dict)

    def effect(self, tool: str) -> None:
        """Record `tool`'s effect, then die if the test asked for it."""
        info = current_call()
        self.ledger.record(tool, info.run_id, idempotency_key())
        self.trace.append(f"tool:{tool}")
        if tool in self.crash_in:
            self.crash_in.discard(tool)
            self.die(f"inside {tool}")

    def gate(self, tool: str) -> tuple[asyncio.Event, asyncio.Event]:
        """Make the next invocation of `tool` (slow_lookup) wait after its effect; return (release, entered)."""
        events = asyncio.Event(), asyncio.Event()
        self._gates[tool] = events
        return events

    async def wait_at_gate(self, tool: str) -> None:
        """Block here while `tool`'s gate is closed (once)."""
        gate = self._gates.pop(tool, None)
        if gate is not None:
            release, entered = gate
            entered.set()
            await release.wait()

    def counts(self, run_id: str | None = None) -> Counter[str]:
        """Shorthand for ``self.ledger.counts(run_id)``."""
        return self.ledger.counts(run_id)


async def _no_pause() -> None:
    return None


def make_tickets(
    ledger: Ledger | None = None,
    *,
    die: Callable[[str], NoReturn] = raise_crash,
    pause: Callable[[], Awaitable[None]] = _no_pause,
) -> Tickets:
    """The ticket tools on a new `Registry`, each recording its effect in `ledger`.

    Args:
        ledger: where effects go (a new in-memory one by default).
        die: how a tool in ``crash_in`` dies (`raise_crash`, or `sigkill` in a worker process).
        pause: awaited by the ticket tools before their effect (charge_card after it too), to
            spread concurrent workers out in time.
    """
    t = Tickets(Registry(), ledger or Ledger(), die)
    _order_tools(t, pause)
    _refund_tools(t)
    return t


def redeployed(
    registry: Registry,
    *,
    idempotent: Mapping[str, bool] | None = None,
    approval: Mapping[str, bool] | None = None,
    gone: Iterable[str] = (),
) -> Registry:
    """The same tool bodies as a later deploy declares them: some flags changed, some tools gone.

    Args:
        registry: the tools of the deploy before.
        idempotent: per tool name, its `idempotent` flag in the new deploy.
        approval: per tool name, whether it needs approval in the new deploy.
        gone: tools the new deploy no longer has (removed, or renamed away).
    """
    flags, asks, dropped = dict(idempotent or {}), dict(approval or {}), set(gone)
    new = Registry()
    for tool in registry:
        if tool.name in dropped:
            continue
        new.add(
            tool.fn,
            name=tool.name,
            idempotent=flags.get(tool.name, tool.idempotent),
            approval=asks.get(tool.name, tool.approval),
            retry=tool.retry,
            timeout_s=tool.timeout_s,
            description=tool.description,
            waits=tool.waits,
        )
    return new


def _order_tools(t: Tickets, pause: Callable[[], Awaitable[None]]) -> None:
    registry = t.registry

    @registry.tool(idempotent=True)
    async def hold_seats(show: str, seats: int) -> str:
        """Hold seats (safe to repeat)."""
        await pause()
        t.effect("hold_seats")
        return f"held {seats} for {show}"

    @registry.tool
    async def charge_card(show: str, seats: int) -> str:
        """Charge the card (not idempotent)."""
        await pause()
        t.effect("charge_card")
        await pause()
        return f"charged {seats * 40} for {show}"

    @registry.tool
    def email_tickets(show: str) -> str:
        """Mail the tickets (a sync tool, run on a thread; not idempotent)."""
        t.effect("email_tickets")
        return f"mailed {show}"

    @registry.tool(idempotent=True)
    async def slow_lookup(show: str) -> str:
        """A lookup a test can hold open with `Tickets.gate` (idempotent)."""
        t.effect("slow_lookup")
        await t.wait_at_gate("slow_lookup")
        return f"looked up {show}"

    @registry.tool(idempotent=True)
    async def slow_report(show: str, seconds: float) -> str:
        """A report that takes `seconds` before its effect (idempotent)."""
        await asyncio.sleep(seconds)
        t.effect("slow_report")
        return f"reported {show}"

    @registry.tool
    async def make_opaque(show: str) -> object:
        """Return something the call log cannot store (not idempotent)."""
        t.effect("make_opaque")
        return Opaque()

    @registry.tool(approval=True)
    async def wire_money(show: str, seats: int) -> str:
        """Wire money for the order; always needs approval."""
        t.effect("wire_money")
        return f"wired {seats * 40} for {show}"


def _refund_tools(t: Tickets) -> None:
    registry = t.registry

    @registry.tool(approval=lambda args, ctx: args["amount"] > 100)
    async def refund(amount: int) -> str:
        """Refund money; amounts over 100 need approval."""
        t.effect("refund")
        return f"refunded {amount}"

    @registry.tool(approval=True)
    async def wire(amount: int) -> str:
        """Wire money; always needs approval."""
        t.effect("wire")
        return f"wired {amount}"

    @registry.tool
    async def notify(amount: int) -> str:
        """Tell the customer the refund went out."""
        t.effect("notify")
        return f"notified {amount}"

    @registry.tool
    async def apologize(amount: int) -> str:
        """Tell the customer the refund was denied."""
        t.effect("apologize")
        return f"apologized {amount}"

    def audit_policy(args: Mapping[str, Any], ctx: RunContext | None) -> bool:
        t.seen_ctx.append(ctx)
        return False

    @registry.tool(idempotent=True, approval=audit_policy)
    async def audit(n: int) -> str:
        """An audited step: its approval policy records the RunContext it is asked with."""
        t.effect("audit")
        return f"audited {n}"


# -- state and flows -------------------------------------------------------------------------


class Order(BaseModel):
    """The seed's ticket order."""

    show: str = "Hamlet"
    seats: int = 2
    held: str = ""
    looked: str = ""
    paid: str = ""
    sent: str = ""
    wired: str = ""
    seconds: float = 0.0


ORDER = Order(show="Hamlet", seats=2)


def order_args(order: Order) -> dict[str, object]:
    """Arguments of hold_seats, charge_card and wire_money."""
    return {"show": order.show, "seats": order.seats}


def show_args(order: Order) -> dict[str, object]:
    """Arguments of email_tickets, slow_lookup and make_opaque."""
    return {"show": order.show}


def tickets_flow(
    *,
    name: str = "tickets",
    with_receipt: bool = False,
    pay_tool: str = "charge_card",
    state: type[Order] = Order,
    version: str = "1",
) -> Flow[Order]:
    """The seed's flow: hold -> pay -> send (supersteps 0, 1, 2).

    Args:
        name: the flow's name (a flow of another name is "another flow" to a store).
        with_receipt: add a ``receipt`` node after send (the same name, another graph digest).
        pay_tool: the tool the pay node calls (another one: another digest; an unknown one: a refused flow).
        state: the state model (a subclass of `Order` with other fields: another schema digest).
        version: the flow's version.
    """
    flow = (
        Flow(name, state=state, version=version)
        .node("hold", Call("hold_seats", args=order_args, into="held"))
        .node("pay", Call(pay_tool, args=order_args, into="paid"))
        .node("send", Call("email_tickets", args=show_args, into="sent"))
        .edge("hold", "pay")
        .edge("pay", "send")
    )
    if with_receipt:
        return (
            flow.node("receipt", Call("hold_seats", args=order_args, into="looked"))
            .edge("send", "receipt")
            .end("receipt")
        )
    return flow.end("send")


TICKETS = tickets_flow()


def switched_flow(tickets: Tickets) -> Flow[Order]:
    """pay -> send, where pay charges ``tickets.extra_seats`` more seats (read when the node runs)."""

    def switch_args(order: Order) -> dict[str, object]:
        return {"show": order.show, "seats": order.seats + tickets.extra_seats}

    return (
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

#: hold fans out to pay (runs at once) and wire (wire_money, waits for approval) in one superstep.
FANOUT = (
    Flow("fanout", state=Order)
    .node("hold", Call("hold_seats", args=order_args, into="held"))
    .node("pay", Call("charge_card", args=order_args, into="paid"))
    .node("wire", Call("wire_money", args=order_args, into="wired"))
    .edge("hold", "pay")
    .edge("hold", "wire")
    .end("pay", "wire")
)

#: report (slow_report, taking ``order.seconds``), alone.
SLOW = (
    Flow("slow", state=Order)
    .node("report", Call("slow_report", args=lambda o: {"show": o.show, "seconds": o.seconds}, into="held"))
    .end("report")
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
