"""The world the runs act on: the tools, their flows, the ledger of real effects, and the invariants.

The ledger is the truth the invariants are checked against: every tool appends its effect
there (run, call id, tool) at the moment it happens, wherever it runs. The store writes are
observed in the order they took effect (`SimPoints` reports each one), so the world knows
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
  only the tool's system can stop: docs/simulation.md, the zombie window); "non-idempotent"
  is what the tool was declared as when the call started, in its worker's code (`Effect.declared`):
  each effect after one declared so needs a grant, however the tool is declared since;
- a call whose tool needed an approval when it started has its effect only after a stored
  checkpoint approved it;
- a fork's calls are new calls: none has its effect under the idempotency key of another
  run's call, and the operator's fork writes nothing of the run it forks;
- a ``migrate`` claim is stored only at a step boundary: no call of the step the run goes on
  with had a ``started`` or ``done`` stored before it (docs/versioning.md).
- a call whose ``started`` signed it not idempotent is started again only on such a signed
  grant, stored before (`_grants`): checked at each ``started``, whether or not the effect
  then happens (a crash or a withheld tool after ``started`` hides a rerun from the ledger);
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
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from agentflow._app import FlowApp, LoopSpec
from agentflow.exec import Registry, current_call
from agentflow.exec.checkpoints import CheckpointStore, SealedCall, SealedCheckpoint
from agentflow.exec.seal import Sealer
from agentflow.flow import Call, Child, Flow, Wait
from agentflow.models import Message, ToolCall
from agentflow.sim._deploys import RENAMED, Code, Declared
from agentflow.sim._grants import Grants
from agentflow.sim._history import History
from agentflow.sim._scheduler import ACTOR

#: What a tool's result says it did (an operator who declares that a call happened says the same).
PAST = {"look": "looked", "charge": "charged", "mail": "mailed", "wire": "wired", RENAMED: "charged"}


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
    declared: Declared
    """What the tool was declared as when this attempt of the call started (its worker's code)."""
    key: str
    """The call's idempotency key: its identity as the tool's system sees it."""


@dataclass
class World:
    """The ledger, what the store took in which order, and the invariants broken so far."""

    effects: list[Effect] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    #: (run, call id) -> the order number of the write that stored its newest ``started``.
    started: dict[tuple[str, str], int] = field(default_factory=dict)
    #: run -> the order number of the write that stored its newest claim.
    claimed: dict[str, int] = field(default_factory=dict)
    #: (run, actor) -> the order number of the newest write when that actor last took the run's lease.
    taken: dict[tuple[str, str], int] = field(default_factory=dict)
    #: run -> the order number of the write that stored its first ``cancelled`` checkpoint.
    cancelled: dict[str, int] = field(default_factory=dict)
    writes: int = 0
    lost_writes: bool = False
    """Whether the store lost acknowledged writes (a failover): `verify` may then find what it reports."""
    #: Runs whose lost writes `verify` reported (they cannot go on; reporting them is what is owed).
    reported: set[str] = field(default_factory=set)
    #: (run, call id) -> retries the operator signed while that call stood failed.
    retries: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: idempotency key -> the run whose call had an effect under it first (a fork's calls have keys of their own).
    identities: dict[str, str] = field(default_factory=dict)
    #: fork -> the run it was forked from (its state's order names the first run of the line).
    forks: dict[str, str] = field(default_factory=dict)
    #: The runs the operator is forking right now: nothing of theirs may be written by it meanwhile.
    forking: set[str] = field(default_factory=set)
    #: run -> call id -> the kind of its last record stored (``done`` stays: a call's own done is its last word).
    calls: dict[str, dict[str, str]] = field(default_factory=dict)
    #: (run, call id) of every call a stored checkpoint approved.
    approvals: set[tuple[str, str]] = field(default_factory=set)
    migrations: int = 0
    """The migrate claims stored (each checked)."""
    sim: Any = None
    """The running simulation (None: the tools run without points, as for the expected outcomes)."""
    store: CheckpointStore | None = None
    """The episode's store, unwrapped: the world reads it without points."""
    sealer: Sealer | None = None
    history: History = field(default_factory=History)
    """The accepted writes, checked against the stores' rules as they take effect (`_history`)."""
    grants: Grants = field(default_factory=Grants)
    """The signed grants to rerun a call, spent by each ``started`` of a call started before (`_grants`)."""

    # -- what the store tells the world --------------------------------------------------

    def wrote_call(self, run_id: str, record: SealedCall) -> None:
        self.writes += 1
        self._forked_from(run_id)
        body = json.loads(record.payload)
        call_id = body.get("call_id")
        if record.kind == "started":
            self.started[(run_id, call_id)] = self.writes
        if call_id is not None and self.calls.setdefault(run_id, {}).get(call_id) != "done":
            self.calls[run_id][call_id] = record.kind  # a call's own done is its last word
        self._judge(self.history.call(run_id, record, call_id if record.kind == "started" else None))
        self._judge(self.grants.call(run_id, record.kind, body))

    def wrote_checkpoint(self, run_id: str, row: SealedCheckpoint) -> None:
        self.writes += 1
        self._forked_from(run_id)
        if row.status == "cancelled":
            self.cancelled.setdefault(run_id, self.writes)
        self._judge(self.history.checkpoint(run_id, row))
        body = json.loads(row.payload)
        for call_id, decision in (body.get("decisions") or {}).items():
            if decision.get("approve"):
                self.approvals.add((run_id, call_id))
        if body.get("claim") == "migrate":
            self.migrated(run_id, body)
        self.grants.checkpoint(run_id, body)
        if "claim" in body:
            self.claimed[run_id] = self.writes

    def took(self, run_id: str) -> None:
        """The current actor took the run's lease: after every write so far."""
        self.taken[(run_id, ACTOR.get())] = self.writes

    def _judge(self, broken: str | None) -> None:
        """A write broke a store's rule (`_history`): an invariant broke, unless the store lost writes."""
        if broken is not None and not self.lost_writes:
            self.violations.append(broken)

    def migrated(self, run_id: str, body: dict[str, Any]) -> None:
        """A migrate claim was stored: the step the run goes on with had no call finished or in doubt before it."""
        prefix = f"{body.get('superstep')}/"
        acted = sorted(
            c for c, kind in self.calls.get(run_id, {}).items() if c.startswith(prefix) and kind in ("started", "done")
        )
        self.migrations += 1
        if acted:
            self.violations.append(
                f"{run_id} was migrated to {body.get('migrated')} with calls finished or in doubt in the step "
                f"it goes on with: {acted}"
            )

    def _forked_from(self, run_id: str) -> None:
        """The operator's fork writes nothing of the run it forks (the new run is a run of its own)."""
        if run_id in self.forking and ACTOR.get() == "operator":
            self.violations.append(f"forking {run_id} wrote to {run_id} itself")

    def verify_reports(self, run_id: str, problems: Sequence[str]) -> None:
        """`verify` found problems in a run: a broken invariant, unless the store lost writes (then it reports them)."""
        if self.lost_writes:
            self.reported.add(run_id)
        else:
            self.violations.append(f"verify reports {run_id}: {list(problems)}")

    # -- what the tools tell the world ---------------------------------------------------

    async def effect(self, tool: str, declared: Declared) -> None:
        """A tool has its effect now: record it and check the invariants that concern it.

        `declared` is what the tool was declared as when this attempt started (its worker's
        code): an effect that follows one declared not idempotent needs a signed grant, however
        the tool is declared now or was declared for this attempt.
        """
        info = current_call()
        now = self.sim.clock.now if self.sim is not None else 0.0
        key = (info.run_id, info.call_id)
        before = [e for e in self.effects if (e.run_id, e.call_id) == key]
        self.effects.append(Effect(info.run_id, info.call_id, tool, ACTOR.get(), now, declared, info.idempotency_key))
        if self.sim is None:
            return
        started = self.started.get(key)
        if started is None:
            self.violations.append(
                f"{tool} {info.call_id} of {info.run_id} had its effect with no started record stored"
            )
        elif info.run_id in self.cancelled and started > self.cancelled[info.run_id]:
            self.violations.append(f"{tool} {info.call_id} of {info.run_id} started after the run was cancelled")
        owner = self.identities.setdefault(info.idempotency_key, info.run_id)
        if owner != info.run_id:
            self.violations.append(
                f"{tool} {info.call_id} of {info.run_id} had its effect under the identity of a call of {owner}"
            )
        if declared.approval and key not in self.approvals:
            self.violations.append(
                f"{tool} {info.call_id} of {info.run_id} needed an approval when it started and had its effect "
                "with none signed"
            )
        following = sum(1 for e in before if not e.declared.idempotent)
        if following:
            granted = await self.reruns_granted(info.run_id, info.call_id) + self.retries[key]
            if following > granted:
                flags = ", ".join("idempotent" if e.declared.idempotent else "not idempotent" for e in before)
                self.violations.append(
                    f"{tool} {info.call_id} of {info.run_id} had its effect {len(before) + 1} times "
                    f"with {granted} signed grant(s) to run it again (declared at each earlier start: {flags}; "
                    f"at this one: {'idempotent' if declared.idempotent else 'not idempotent'})"
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
        # And the worker did not take the lease back over a claim that came since the call's `started`. (A
        # claimer that stalled past its own lease may still land its claim after this worker took the
        # lease back and checked the head: the claim then counts the log again and parks on this call,
        # which the grants and the ledger judge; that claim is no sign this worker did not hold the run.)
        started, claimed = self.started.get((info.run_id, info.call_id)), self.claimed.get(info.run_id)
        taken = self.taken.get((info.run_id, actor), 0)
        if started is not None and claimed is not None and started < claimed <= taken:
            newest, began = (
                self.history.newest.get(info.run_id),
                self.history.started_in.get((info.run_id, info.call_id)),
            )
            self.violations.append(
                f"{tool} {info.call_id} of {info.run_id} started on {actor} after segment "
                f"{newest[2] if newest else '?'} claimed the run from segment {began}, where its started is, "
                "and it took the lease back over that claim: it did not hold the run"
            )

    async def tool(self, name: str, declared: Declared) -> None:
        """The body every simulated tool shares: a point at its start, its effect, a point before it returns."""
        if self.sim is not None:
            await self.starts(name)
            await self.sim.point(f"tool.{name}.start")
        await self.effect(name, declared)
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
        offered = {tool["name"] for tool in tools}  # a deploy may have renamed or removed a tool
        charge = RENAMED if RENAMED in offered else "charge"
        calls = (
            *([ToolCall(id="look-1", name="look", arguments={"order": order})] if "look" in offered else []),
            ToolCall(id="charge-1", name=charge, arguments={"order": order}),
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
#: Whether a deploy's approval flips reach the tool loop's tools. Off until a paused run's calls in
#: doubt could be decided (a round paused on an approval while a call of it granted a rerun had
#: not run again: docs/simulation.md); on since.
LOOP_APPROVALS = True
#: The flows the client starts (the tool loop besides); ``notify`` runs only as the fan-out's child.
STARTED = ("shop", "fan", "wire")


def make_app(world: World, code: Code | None = None) -> FlowApp:
    """The flows and the tool loop of the simulation as deployed by `code`, over tools that report to `world`.

    Each tool reports what it was declared as in this deploy (`Declared`) with its effect:
    the declaration in force when its call started (its worker's code).
    """
    code = code if code is not None else Code()
    flags = code.flags
    registry, loop_tools = Registry(), Registry()

    def tool(name: str, body: Any, *, into: tuple[Registry, ...], waits: bool = False) -> None:
        for where in into:
            declared = flags[name]
            if where is loop_tools and not LOOP_APPROVALS:  # a tool loop's tools need no approval
                declared = replace(declared, approval=False)
            where.tool(
                body(declared),
                name=code.loop_charge if where is loop_tools and name == "charge" else name,
                idempotent=declared.idempotent,
                approval=declared.approval,
                waits=waits,
            )

    def reporting(name: str) -> Any:
        def made(declared: Declared) -> Any:
            async def act(order: str) -> str:
                await world.tool(name, declared)
                return f"{PAST[name]} {order}"

            return act

        return made

    def later(declared: Declared) -> Any:
        async def act() -> datetime:
            await world.tool("later", declared)
            return datetime.fromtimestamp(time.time() + COOL_OFF_S, UTC)  # the virtual clock (datetime.now is not)

        return act

    tool("look", reporting("look"), into=(registry, loop_tools) if code.loop_look else (registry,))
    tool("charge", reporting("charge"), into=(registry, loop_tools))
    tool("mail", reporting("mail"), into=(registry,))
    tool("wire", reporting("wire"), into=(registry,))
    tool("later", later, into=(loop_tools,), waits=True)

    async def check_then_pay(state: Order, handle: Any) -> dict[str, object]:
        # Two calls in one node: a worker stalled in the idempotent one can start the other late.
        checked = await handle.call("look", order=state.order + "/again")
        paid = await handle.call("charge", order=state.order)
        return {"checked": checked, "paid": paid}

    def of(state: Order) -> dict[str, object]:
        return {"order": state.order}

    notify = Flow("notify", state=Order).node("mail", Call("mail", args=of, into="mailed")).end("mail")
    flows: list[Flow[Any]] = []
    for number in range(1, code.versions + 1):
        version = str(number)
        cool_off = COOL_OFF_S if number == 1 else COOL_OFF_S * 2 / 3  # a later version cools off for less
        shop = (
            Flow("shop", state=Order, version=version)
            .node("look", Call("look", args=of, into="looked"))
            .node("pay", check_then_pay)
            .node("cool_off", Wait(seconds=cool_off))
            .node("mail", Call("mail", args=of, into="mailed"))
            .edge("look", "pay")
            .edge("pay", "cool_off")
            .edge("cool_off", "mail")
            .end("mail")
        )
        fan = (
            Flow("fan", state=Order, version=version)
            .node("look", Call("look", args=of, into="looked"))
            .node("charge", Call("charge", args=of, into="paid"))
            .node("mail", Child(notify, state=of, into="mailed", result=lambda child: child.mailed))
            .edge("look", "charge")
            .edge("look", "mail")
            .end("charge")
            .end("mail")
        )
        deadline = Call("wire", args=of, into="wired", timeout_s=APPROVAL_DEADLINE_S, on_timeout="deny")
        wire_flow = (
            Flow("wire", state=Order, version=version)
            .node("look", Call("look", args=of, into="looked"))
            .node("wire", deadline)
            .edge("look", "wire")
            .end("wire")
        )
        flows += [shop, fan, wire_flow]
    flows.append(notify)  # last, as the simulation always had it (a sweep reads the flows in order)
    loop = LoopSpec(model_factory=Shopper, registry=loop_tools, max_steps=LOOP_STEPS)
    return FlowApp(registry, flows, loops={LOOP: loop})


def expected_states(orders: Mapping[str, str], forks: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """The state each run of `orders` (run -> flow) ends ``done`` with when nothing goes wrong.

    A fork (`forks`: fork -> the run it was forked from) carries its source's order, so it ends
    as the first run of its line would; a fan-out's child (run id ``<parent>.<node>.<superstep>``)
    mails its parent's order.
    """

    def order_of(run_id: str) -> str:
        while run_id in forks:
            run_id = forks[run_id]
        return run_id

    out: dict[str, dict[str, Any]] = {}
    for run_id, flow in orders.items():
        if flow.startswith("loop:"):
            continue  # a loop's outcome is its conversation: checked by verify, not compared here
        if flow == "notify":
            parent = order_of(run_id.split(".")[0])
            out[run_id] = Order(order=parent, mailed=f"mailed {parent}").model_dump()
            continue
        order = order_of(run_id)
        state = Order(order=order, looked=f"looked {order}")
        if flow == "shop":
            state.checked, state.paid, state.mailed = f"looked {order}/again", f"charged {order}", f"mailed {order}"
        elif flow == "fan":
            state.paid, state.mailed = f"charged {order}", f"mailed {order}"
        else:
            state.wired = f"wired {order}"
        out[run_id] = state.model_dump()
    return out


def tally(effects: list[Effect]) -> Counter[str]:
    """Effects per tool."""
    return Counter(e.tool for e in effects)
