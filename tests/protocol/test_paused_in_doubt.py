"""A paused run whose step holds a call in doubt is decided like a running one, and stays paused.

The sequence the simulation's deploys found: a tool loop's round asks for a call that needs
approval and for ``charge_card``; the round pends the first and its worker dies inside the
charge. An operator decides the charge ``Rerun``; the worker that spends the decision runs
code where ``charge_card`` is gone (renamed by a deploy), so the charge does not run again,
and the round pauses on the approval with the charge still in doubt. That paused run could be
neither resumed (``RecoveryNeedsDecision``) nor decided (a paused run was refused), so it
waited for ever. Now `decide_in_doubt` takes it, keeps its approvals waiting, and the resume
that follows carries the decision on until it is spent. The rule is the run protocol's
(`RunProtocol.decide_in_doubt`, `RunSteps.carried`): flows and tool loops alike (a durable
agent's run is a tool loop's). Each runs on every store set-up.
"""

from __future__ import annotations

from typing import Any

import pytest
from _kit.stores import StoreSetup
from _kit.tickets import KEY, ORDER, Crash, Order, Tickets, make_tickets, order_args, redeployed
from _kit.workers import Workers

from agentflow import Call, Flow, Happened, Rerun
from agentflow.errors import UnknownTool
from agentflow.exec import LoopRunner, recover_tool_loop, run_tool_loop
from agentflow.exec.checkpoints import RecoveryNeedsDecision
from agentflow.exec.run.read import read_run
from agentflow.exec.seal import Sealer
from agentflow.models import Message, ScriptedModel, ToolCall

PAY = Message.assistant(
    "",
    tool_calls=[
        ToolCall(id="w1", name="wire_money", arguments={"show": "Tosca", "seats": 1}),
        ToolCall(id="c1", name="charge_card", arguments={"show": "Tosca", "seats": 1}),
    ],
)
DONE = Message.assistant("paid and wired")


async def pay_if_deployed(order: Order, handle: Any) -> dict[str, object]:
    """Charge the card, or note that this deploy cannot (its charge_card is gone)."""
    try:
        return {"paid": await handle.call("charge_card", show=order.show, seats=order.seats)}
    except UnknownTool:
        return {"paid": "not charged here: charge_card is not deployed"}


#: hold fans out to pay (charge_card, if deployed) and wire (wire_money, waits for approval) in one superstep.
FANOUT = (
    Flow("fanout-deployed", state=Order)
    .node("hold", Call("hold_seats", args=order_args, into="held"))
    .node("pay", pay_if_deployed)
    .node("wire", Call("wire_money", args=order_args, into="wired"))
    .edge("hold", "pay")
    .edge("hold", "wire")
    .end("pay", "wire")
)


async def paused_with_charge_in_doubt(store_setup: StoreSetup, run_id: str) -> tuple[Tickets, str, dict[str, Any]]:
    """The found sequence, up to the paused checkpoint whose step holds the charge in doubt."""
    tickets = make_tickets()
    common: dict[str, Any] = {"checkpoints": store_setup.raw, "checkpoint_key": KEY}
    # The round pends wire_money (it needs approval) and its worker dies inside charge_card
    tickets.crash_in.add("charge_card")
    with pytest.raises(Crash):
        await run_tool_loop(ScriptedModel([PAY]), tickets.registry, [Message.user("pay")], run_id=run_id, **common)
    tickets.crash_in.clear()
    with pytest.raises(RecoveryNeedsDecision) as asked:
        await recover_tool_loop(ScriptedModel([]), tickets.registry, run_id, **common)
    [charge] = asked.value.call_ids
    # An operator decides it did not happen: run it again
    await LoopRunner(None, tickets.registry, **common).decide_in_doubt(run_id, calls={charge: Rerun()}, operator="ada")
    # The worker that spends the decision runs a deploy without charge_card: the charge does not run again
    v2 = redeployed(tickets.registry, gone={"charge_card"})
    paused = await recover_tool_loop(ScriptedModel([]), v2, run_id, **common)
    assert paused.status == "paused"
    assert tickets.ledger.counts()["charge_card"] == 1
    return tickets, charge, common


async def test_a_paused_runs_call_in_doubt_is_decided_and_the_run_stays_paused_for_its_approval(store_setup):
    # Given a tool loop paused on wire_money's approval while its charge is still in doubt
    tickets, charge, common = await paused_with_charge_in_doubt(store_setup, "loop-1")
    with pytest.raises(RecoveryNeedsDecision):  # the resume needs the charge decided first
        await run_tool_loop(ScriptedModel([DONE]), tickets.registry, run_id="loop-1", approve=True, **common)
    report = await read_run(store_setup.raw, Sealer(KEY), "loop-1")
    assert [c.call_id for c in report.in_doubt] == [charge]  # what runs show and the viewer offer to decide
    # When the operator, having checked the card, says the charge happened
    operator = LoopRunner(None, tickets.registry, **common)
    step = await operator.decide_in_doubt("loop-1", calls={charge: Happened("charged Tosca")}, operator="ada")
    # Then the run stays paused at that step, its approval still waiting
    held = await read_run(store_setup.raw, Sealer(KEY), "loop-1")
    assert held.status == "paused" and held.step == step
    assert [p["tool"] for p in held.pending] == ["wire_money"]
    # And the resume goes on to the end: the wire once, the card never charged again
    done = await run_tool_loop(ScriptedModel([DONE]), tickets.registry, run_id="loop-1", approve=True, **common)
    assert done.status == "done" and done.text == "paid and wired"
    assert tickets.ledger.counts()["charge_card"] == 1 and tickets.ledger.counts()["wire_money"] == 1


async def test_a_rerun_decided_on_a_paused_run_is_carried_to_the_worker_that_spends_its_resume(store_setup):
    # Given the paused loop, and an operator who finds the charge did not go through and decides a rerun
    tickets, charge, common = await paused_with_charge_in_doubt(store_setup, "loop-2")
    operator = LoopRunner(None, tickets.registry, **common)
    await operator.decide_in_doubt("loop-2", calls={charge: Rerun()}, operator="ada")
    # When the approval is stored (a worker spends it) and a worker with charge_card deployed again spends it
    stored = await operator.resume("loop-2", approve=True, operator="bob", max_supersteps=0)
    assert stored.status == "running"
    worker = LoopRunner(ScriptedModel([]), tickets.registry, **common)
    advanced = await worker.advance("loop-2", expected_step=stored.step, spend="resume")
    # Then the round finishes: the wire runs and the charge runs again, as the decision said
    assert advanced.status == "running"
    assert tickets.ledger.counts()["wire_money"] == 1 and tickets.ledger.counts()["charge_card"] == 2


async def test_a_paused_flow_runs_call_in_doubt_is_decided_alike(workers: Workers) -> None:
    # Given a flow whose superstep pays (charge_card) beside a wire waiting for approval; its worker
    # died inside charge_card, a rerun was decided, and the worker that spent it had no charge_card
    workers.tickets.crash_in.add("charge_card")
    with pytest.raises(Crash):
        await workers.runner().run(FANOUT, ORDER, run_id="fan-1")
    workers.tickets.crash_in.clear()
    with pytest.raises(RecoveryNeedsDecision) as asked:
        await workers.runner().recover(FANOUT, "fan-1")
    [charge] = asked.value.call_ids
    await workers.runner().decide_in_doubt(FANOUT, "fan-1", calls={charge: Rerun()}, operator="ada")
    v2 = redeployed(workers.tickets.registry, gone={"charge_card"})
    paused = await workers.runner(registry=v2).recover(FANOUT, "fan-1")
    assert paused.status == "paused" and workers.ran("fan-1")["charge_card"] == 1
    # When the operator says the charge happened
    await workers.runner().decide_in_doubt(FANOUT, "fan-1", calls={charge: Happened("charged")}, operator="ada")
    # Then the run is still paused on the wire, and its resume finishes it without charging again
    done = await workers.runner().resume(FANOUT, "fan-1", approve=True)
    assert (
        done.status == "done" and workers.ran("fan-1")["charge_card"] == 1 and workers.ran("fan-1")["wire_money"] == 1
    )
