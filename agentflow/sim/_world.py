"""The world the runs act on: the tools, their flows, the ledger of real effects, and the invariants.

The ledger is the truth the invariants are checked against: every tool appends its effect
there (run, call id, tool) at the moment it happens, wherever it runs. The store writes are
observed in the order they took effect (`SimStore` reports each one), so the world knows
whether a call's ``started`` was stored before its effect and whether a cancel came first.

Invariants checked as the simulation goes (`World.violations`):
- a tool's effect follows its ``started`` record, stored in a segment the run had not
  ended or cancelled before it;
- a tool starts only on a worker that holds its run's lease at that moment (a worker
  stalled past its lease after ``started`` confirms its lease before the tool runs,
  `Tenure.confirm`; a stall inside the tool, once started, is the zombie window below);
  not checked once the store lost acknowledged writes (a failover may lose a lease);
- a non-idempotent call's effect happens at most once, plus once per signed grant to run
  it again stored before the effect: an operator's ``rerun`` decision (read from the
  signed claim checkpoints), or a retry of the run while the call stood failed with no
  ``done`` of its own in the log (an operator's "did not happen" fails a call; retrying
  the run runs it again; a stalled worker can still have the effect after that word, which
  only the tool's system can stop: docs/simulation.md, the zombie window).
and at the end of an episode (`_simulation.Episode.check_end`):
- every run ended (done, failed or cancelled): the operator finished every run that waited
  for a person, through the public API, and nothing is stuck or lost;
- a run that ended ``done`` has the state a run without faults has;
- ``verify`` (the audit read model) finds no problem in any run.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from agentflow._app import FlowApp, LoopSpec
from agentflow.exec import Registry, current_call
from agentflow.exec.checkpoints import CheckpointStore, SealedCall, SealedCheckpoint
from agentflow.exec.seal import Sealer
from agentflow.flow import Call, Child, Flow, Wait
from agentflow.models import Message, ToolCall
from agentflow.sim._history import History
from agentflow.sim._scheduler import ACTOR

#: The tools that must never run twice on their own.
NON_IDEMPOTENT = frozenset({"charge", "mail", "wire"})


class Order(BaseModel):
    """The state of every simulated flow."""

    order: str
    looked: str = ""
    checked: str = ""
    paid: str = ""
    mailed: str = ""
    wired: str = ""


@dataclass(frozen=True)
class Effect:
    """One real effect of a tool."""

    run_id: str
    call_id: str
    tool: str
    actor: str
    at: float


@dataclass
class World:
    """The ledger, what the store took in which order, and the invariants broken so far."""

    effects: list[Effect] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    #: (run, call id) -> the order number of the write that stored its newest ``started``.
    started: dict[tuple[str, str], int] = field(default_factory=dict)
    #: run -> the order number of the write that stored its first ``cancelled`` checkpoint.
    cancelled: dict[str, int] = field(default_factory=dict)
    writes: int = 0
    lost_writes: bool = False
    """Whether the store lost acknowledged writes (a failover): `verify` may then find what it reports."""
    #: Runs whose lost writes `verify` reported (they cannot go on; reporting them is what is owed).
    reported: set[str] = field(default_factory=set)
    #: (run, call id) -> retries the operator signed while that call stood failed.
    retries: Counter[tuple[str, str]] = field(default_factory=Counter)
    sim: Any = None
    """The running simulation (None: the tools run without points, as for the expected outcomes)."""
    store: CheckpointStore | None = None
    """The episode's store, unwrapped: the world reads it without points."""
    sealer: Sealer | None = None
    history: History = field(default_factory=History)
    """The accepted writes, checked against the stores' rules as they take effect (`_history`)."""

    # -- what the store tells the world --------------------------------------------------

    def wrote_call(self, run_id: str, record: SealedCall) -> None:
        self.writes += 1
        call_id = None
        if record.kind == "started":
            call_id = json.loads(record.payload)["call_id"]
            self.started[(run_id, call_id)] = self.writes
        self._judge(self.history.call(run_id, record, call_id))

    def wrote_checkpoint(self, run_id: str, row: SealedCheckpoint) -> None:
        self.writes += 1
        if row.status == "cancelled":
            self.cancelled.setdefault(run_id, self.writes)
        self._judge(self.history.checkpoint(run_id, row))

    def _judge(self, broken: str | None) -> None:
        """A write broke a store's rule (`_history`): an invariant broke, unless the store lost writes."""
        if broken is not None and not self.lost_writes:
            self.violations.append(broken)

    def verify_reports(self, run_id: str, problems: Sequence[str]) -> None:
        """`verify` found problems in a run: a broken invariant, unless the store lost writes (then it reports them)."""
        if self.lost_writes:
            self.reported.add(run_id)
        else:
            self.violations.append(f"verify reports {run_id}: {list(problems)}")

    # -- what the tools tell the world ---------------------------------------------------

    async def effect(self, tool: str) -> None:
        """A tool has its effect now: record it and check the invariants that concern it."""
        info = current_call()
        now = self.sim.clock.now if self.sim is not None else 0.0
        self.effects.append(Effect(info.run_id, info.call_id, tool, ACTOR.get(), now))
        if self.sim is None:
            return
        key = (info.run_id, info.call_id)
        started = self.started.get(key)
        if started is None:
            self.violations.append(
                f"{tool} {info.call_id} of {info.run_id} had its effect with no started record stored"
            )
        elif info.run_id in self.cancelled and started > self.cancelled[info.run_id]:
            self.violations.append(f"{tool} {info.call_id} of {info.run_id} started after the run was cancelled")
        if tool in NON_IDEMPOTENT:
            times = sum(1 for e in self.effects if (e.run_id, e.call_id) == key)
            if times > 1:
                allowed = 1 + await self.reruns_granted(info.run_id, info.call_id) + self.retries[key]
                if times > allowed:
                    self.violations.append(
                        f"{tool} {info.call_id} of {info.run_id} had its effect {times} times "
                        f"with {allowed - 1} signed grant(s) to run it again"
                    )

    async def starts(self, tool: str) -> None:
        """A tool starts now: check that its worker holds the run's lease (read here, without points), unclaimed since.

        Not checked once the store lost acknowledged writes: a failover may lose a lease's take
        or renewal (leases are advisory; what guards a run across a failover is its durable
        ``started`` records and claims).
        """
        assert self.store is not None
        if self.lost_writes:
            return
        info, actor = current_call(), ACTOR.get()
        lease = (await self.store.leases([info.run_id])).get(info.run_id)
        if lease is None or lease.owner.rpartition(":")[0] != actor:
            held = "nobody" if lease is None else lease.owner
            self.violations.append(
                f"{tool} {info.call_id} of {info.run_id} started on {actor}, which did not hold the run "
                f"(its lease: {held})"
            )
        # And nobody claimed the run since the call's `started` (a claim needs the lease: none can come between).
        newest, began = self.history.newest.get(info.run_id), self.history.started_in.get((info.run_id, info.call_id))
        if newest is not None and began is not None and newest[2] != began:
            self.violations.append(
                f"{tool} {info.call_id} of {info.run_id} started on {actor} after segment {newest[2]} claimed "
                f"the run from segment {began}, where its started is: it did not hold the run"
            )

    async def tool(self, name: str) -> None:
        """The body every simulated tool shares: a point at its start, its effect, a point before it returns."""
        if self.sim is not None:
            await self.starts(name)
            await self.sim.point(f"tool.{name}.start")
        await self.effect(name)
        if self.sim is not None:
            await self.sim.point(f"tool.{name}.return")

    async def reruns_granted(self, run_id: str, call_id: str) -> int:
        """How many signed claims stored so far decided that `call_id` runs again."""
        assert self.store is not None and self.sealer is not None
        granted = 0
        for row in await self.store.history(run_id):
            body = self.sealer.open_checkpoint(row, run_id)
            if call_id in (body.get("rerun") or ()):
                granted += 1
        return granted

    async def finished_calls(self, run_id: str) -> set[str]:
        """The calls of the run with a ``done`` record stored (decoded here, apart from the code under test)."""
        assert self.store is not None
        return {json.loads(r.payload)["call_id"] for r in await self.store.calls(run_id) if r.kind == "done"}

    def happened(self, run_id: str, call_id: str) -> bool:
        """Whether the call had its effect (what an operator checks at the tool's system)."""
        return any(e.run_id == run_id and e.call_id == call_id for e in self.effects)


class Shopper:
    """The tool loop's model: asks to look and to charge in one reply, then to wait, then answers.

    It decides from the conversation alone: the first reply asks for the look and the charge,
    the one after their results asks to check back later (a waiting tool: the loop pauses
    until then), the one after that answers.

    It keeps nothing between calls, so a worker that recovers the loop gets the same replies
    from its own instance: what a replayed model call needs.
    """

    async def complete(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> Message:
        if any(m.role == "tool" and m.tool_call_id == "later-1" for m in messages):
            return Message(role="assistant", content="all done")
        if any(m.role == "tool" for m in messages):
            return Message(role="assistant", tool_calls=(ToolCall(id="later-1", name="later", arguments={}),))
        order = messages[0].content
        calls = (
            ToolCall(id="look-1", name="look", arguments={"order": order}),
            ToolCall(id="charge-1", name="charge", arguments={"order": order}),
        )
        return Message(role="assistant", tool_calls=calls)


#: The tool loop of the simulation (its runs' column is ``loop:agent``).
LOOP = "agent"
#: The most model calls a simulated tool loop may make.
LOOP_STEPS = 4
#: How long the shop flow cools off between the charge and the mail, and the tool loop waits to check back.
COOL_OFF_S = 45.0
#: How long the wire flow's approval waits for the operator before its deadline denies it.
APPROVAL_DEADLINE_S = 90.0
#: The flows the client starts (the tool loop besides); ``notify`` runs only as the fan-out's child.
STARTED = ("shop", "fan", "wire")


def make_app(world: World) -> FlowApp:
    """The flows and the tool loop of the simulation, over tools that report to `world`."""
    registry = Registry()

    @registry.tool(idempotent=True)
    async def look(order: str) -> str:
        await world.tool("look")
        return f"looked {order}"

    @registry.tool
    async def charge(order: str) -> str:
        await world.tool("charge")
        return f"charged {order}"

    @registry.tool
    async def mail(order: str) -> str:
        await world.tool("mail")
        return f"mailed {order}"

    @registry.tool(approval=True)
    async def wire(order: str) -> str:
        await world.tool("wire")
        return f"wired {order}"

    @registry.tool(idempotent=True, waits=True)
    async def later() -> datetime:
        await world.tool("later")
        return datetime.fromtimestamp(time.time() + COOL_OFF_S, UTC)  # the virtual clock (datetime.now is not)

    async def check_then_pay(state: Order, handle: Any) -> dict[str, object]:
        # Two calls in one node: a worker stalled in the idempotent one can start the other late.
        checked = await handle.call("look", order=state.order + "/again")
        paid = await handle.call("charge", order=state.order)
        return {"checked": checked, "paid": paid}

    def of(state: Order) -> dict[str, object]:
        return {"order": state.order}

    shop = (
        Flow("shop", state=Order)
        .node("look", Call("look", args=of, into="looked"))
        .node("pay", check_then_pay)
        .node("cool_off", Wait(seconds=COOL_OFF_S))
        .node("mail", Call("mail", args=of, into="mailed"))
        .edge("look", "pay")
        .edge("pay", "cool_off")
        .edge("cool_off", "mail")
        .end("mail")
    )
    notify = Flow("notify", state=Order).node("mail", Call("mail", args=of, into="mailed")).end("mail")
    fan = (
        Flow("fan", state=Order)
        .node("look", Call("look", args=of, into="looked"))
        .node("charge", Call("charge", args=of, into="paid"))
        .node("mail", Child(notify, state=of, into="mailed", result=lambda child: child.mailed))
        .edge("look", "charge")
        .edge("look", "mail")
        .end("charge")
        .end("mail")
    )
    wire_flow = (
        Flow("wire", state=Order)
        .node("look", Call("look", args=of, into="looked"))
        .node("wire", Call("wire", args=of, into="wired", timeout_s=APPROVAL_DEADLINE_S, on_timeout="deny"))
        .edge("look", "wire")
        .end("wire")
    )
    loop = LoopSpec(model_factory=Shopper, registry=registry, max_steps=LOOP_STEPS)
    return FlowApp(registry, [shop, fan, wire_flow, notify], loops={LOOP: loop})


def expected_states(app: FlowApp, orders: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """The state each flow ends ``done`` with when nothing goes wrong, by flow name (for `orders`: run -> flow)."""
    out: dict[str, dict[str, Any]] = {}
    for run_id, flow in orders.items():
        state = Order(order=run_id)
        state.looked = f"looked {run_id}"
        if flow.startswith("loop:"):
            continue  # a loop's outcome is its conversation: checked by verify, not compared here
        if flow == "notify":  # a fan-out's child (run id ``<parent>.<node>.<superstep>``): the parent's order
            parent = run_id.split(".")[0]
            out[run_id] = Order(order=parent, mailed=f"mailed {parent}").model_dump()
            continue
        if flow == "shop":
            state.checked, state.paid, state.mailed = f"looked {run_id}/again", f"charged {run_id}", f"mailed {run_id}"
        elif flow == "fan":
            state.paid, state.mailed = f"charged {run_id}", f"mailed {run_id}"
        else:
            state.wired = f"wired {run_id}"
        out[run_id] = state.model_dump()
    return out


def tally(effects: list[Effect]) -> Counter[str]:
    """Effects per tool."""
    return Counter(e.tool for e in effects)
