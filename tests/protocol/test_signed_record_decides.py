"""What a call's signed ``started`` record says decides its recovery when the code deployed since says less.

A deploy between a crash and its recovery may change what the registry says of a tool. The
effect a call in doubt may have had was made by the code of its start, so recovery holds the
call to the stricter of its signed record and the registry deployed now
(`agentflow.exec.calls.read.needs_decision`): a tool declared idempotent since does not make an
old call safe to rerun, a tool that needed approval when its call started needs it again, and a
tool that is gone leaves its call to a person. Each rule runs on every store set-up.
"""

from __future__ import annotations

import pytest
from _kit.faults import body
from _kit.tickets import KEY, ORDER, TICKETS, WIRES, Crash, Refund, make_tickets, redeployed
from _kit.workers import Workers

from agentflow import DidNotHappen, Happened
from agentflow.exec import LoopRunner, recover_tool_loop, run_tool_loop
from agentflow.exec.checkpoints import RecoveryNeedsDecision
from agentflow.models import Message, ScriptedModel, ToolCall


async def charge_in_doubt(workers: Workers, run_id: str) -> None:
    """Run TICKETS under v1 (charge_card not idempotent) until its worker dies inside charge_card."""
    workers.tickets.crash_in.add("charge_card")
    with pytest.raises(Crash):
        await workers.runner().run(TICKETS, ORDER, run_id=run_id)
    assert workers.ran(run_id)["charge_card"] == 1


async def test_a_tool_declared_idempotent_since_its_call_started_does_not_rerun_it(workers):
    # Given a run cut off inside charge_card, which v1 declared not idempotent (the card was charged)
    await charge_in_doubt(workers, "order-1")
    # When v2, which declares charge_card idempotent, recovers the run
    v2 = redeployed(workers.tickets.registry, idempotent={"charge_card": True})
    with pytest.raises(RecoveryNeedsDecision) as asked:
        await workers.runner(registry=v2).recover(TICKETS, "order-1")
    # Then the call waits for a decision, saying why, and the card was charged once
    [(tool, why)] = asked.value.calls
    assert tool == "charge_card" and "not idempotent when the call started" in why
    assert workers.ran("order-1")["charge_card"] == 1
    # And once an operator says it happened, v2 finishes the run without charging again
    decision = {asked.value.call_ids[0]: Happened("charged 80 for Hamlet")}
    await workers.runner(registry=v2).decide_in_doubt(TICKETS, "order-1", calls=decision, operator="ada")
    result = await workers.runner(registry=v2).recover(TICKETS, "order-1")
    assert result.status == "done" and workers.ran("order-1")["charge_card"] == 1


async def test_a_decision_must_cover_a_call_whose_signed_record_says_not_idempotent(workers):
    # Given the same call in doubt, and a v2 that declares charge_card idempotent
    await charge_in_doubt(workers, "order-1")
    v2 = redeployed(workers.tickets.registry, idempotent={"charge_card": True})
    # When an operator's decision leaves the call out (as it may leave out an idempotent one)
    # Then it is refused: leaving it out would rerun it
    with pytest.raises(ValueError, match="decide every call in doubt"):
        await workers.runner(registry=v2).decide_in_doubt(TICKETS, "order-1", calls={}, operator="ada")
    assert workers.ran("order-1")["charge_card"] == 1


async def test_a_tool_declared_not_idempotent_since_holds_its_call_too(workers):
    # Given a run cut off inside hold_seats, which v1 declared idempotent
    workers.tickets.crash_in.add("hold_seats")
    with pytest.raises(Crash):
        await workers.runner().run(TICKETS, ORDER, run_id="order-1")
    # When v2, which declares hold_seats not idempotent, recovers it
    v2 = redeployed(workers.tickets.registry, idempotent={"hold_seats": False})
    with pytest.raises(RecoveryNeedsDecision) as asked:
        await workers.runner(registry=v2).recover(TICKETS, "order-1")
    # Then the stricter word (v2's) holds: the call waits for a decision
    assert [tool for tool, _ in asked.value.calls] == ["hold_seats"]
    assert workers.ran("order-1")["hold_seats"] == 1


async def test_a_call_that_needed_approval_when_it_started_needs_it_again_to_rerun(workers):
    # Given v1's wire, idempotent but needing approval (asked of a synchronous port), and a worker that
    # died while the port was asking: the call is logged started, nobody approved it
    def dying_approver(request):
        raise Crash("the worker died while the approver was waiting")

    v1 = redeployed(workers.tickets.registry, idempotent={"wire": True})
    with pytest.raises(Crash):
        await workers.runner(approver=dying_approver, registry=v1).run(WIRES, Refund(amount=10), run_id="wire-1")
    (started,) = [body(r) for r in await workers.calls("wire-1")]
    assert started["approval"] is True
    # When v2 declares wire free of approval, and recovers the run (it has no port)
    v2 = redeployed(v1, approval={"wire": False})
    result = await workers.runner(registry=v2).recover(WIRES, "wire-1")
    # Then the rerun waits for a person's approval, as the signed record asks; no money moved
    assert result.status == "paused"
    assert workers.ran("wire-1") == {}
    # And once approved, it runs once
    done = await workers.runner(registry=v2).resume(WIRES, "wire-1", approve=True)
    assert done.status == "done" and workers.ran("wire-1")["wire"] == 1


async def test_a_tool_gone_since_its_call_started_leaves_the_call_to_a_decision(store_setup):
    # Given a tool loop cut off inside email_tickets (v1 has it)
    tickets = make_tickets()
    tickets.crash_in.add("email_tickets")
    ask = Message.assistant("", tool_calls=[ToolCall(id="c1", name="email_tickets", arguments={"show": "Tosca"})])
    common = {"checkpoints": store_setup.raw, "checkpoint_key": KEY}
    with pytest.raises(Crash):
        await run_tool_loop(ScriptedModel([ask]), tickets.registry, [Message.user("mail it")], run_id="c-1", **common)
    # When v2, which renamed it away (every other tool is idempotent-safe to consider), recovers the loop
    v2 = redeployed(tickets.registry, gone={"email_tickets"})
    with pytest.raises(RecoveryNeedsDecision) as asked:
        await recover_tool_loop(ScriptedModel([]), v2, "c-1", **common)
    # Then the call waits for a person, and the message says the tool is not in this deployment
    [(tool, why)] = asked.value.calls
    assert tool == "email_tickets" and "not registered in this deployment" in why
    # And a result cannot be supplied for it (nothing here can check it), while "did not happen" is taken
    [call_id] = asked.value.call_ids
    deciding = LoopRunner(None, v2, **common)
    with pytest.raises(ValueError, match="not registered here"):
        await deciding.decide_in_doubt("c-1", calls={call_id: Happened("mailed Tosca")})
    decision = {call_id: DidNotHappen("the mail tool was retired")}
    await deciding.decide_in_doubt("c-1", calls=decision, operator="ada")
    result = await recover_tool_loop(ScriptedModel([Message.assistant("Sorry, no mail.")]), v2, "c-1", **common)
    assert result.status == "done" and tickets.ledger.counts()["email_tickets"] == 1


async def test_a_tool_loops_call_keeps_the_rule_its_record_signed(store_setup):
    # Given a tool loop cut off inside charge_card (not idempotent in v1)
    tickets = make_tickets()
    tickets.crash_in.add("charge_card")
    ask = Message.assistant(
        "", tool_calls=[ToolCall(id="c1", name="charge_card", arguments={"show": "Tosca", "seats": 1})]
    )
    common = {"checkpoints": store_setup.raw, "checkpoint_key": KEY}
    with pytest.raises(Crash):
        await run_tool_loop(ScriptedModel([ask]), tickets.registry, [Message.user("pay")], run_id="c-2", **common)
    # When v2 declares charge_card idempotent and recovers the loop
    v2 = redeployed(tickets.registry, idempotent={"charge_card": True})
    with pytest.raises(RecoveryNeedsDecision) as asked:
        await recover_tool_loop(ScriptedModel([Message.assistant("done")]), v2, "c-2", **common)
    # Then the charge waits for a decision and ran once
    assert [tool for tool, _ in asked.value.calls] == ["charge_card"]
    assert tickets.ledger.counts()["charge_card"] == 1
