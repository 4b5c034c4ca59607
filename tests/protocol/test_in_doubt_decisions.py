"""An operator's word on a call in doubt: rerun it, it happened (with this result), or it did not happen.

Each rule runs on every store set-up (the ``workers`` fixture). A run dies inside the
non-idempotent ``email_tickets`` (after its effect, or right after its ``started``
record), so recovery needs a decision; the operator checks the mail system and says what
happened, through `FlowRunner.decide_in_doubt`; the next recovery spends it.
"""

from __future__ import annotations

import pytest
from _kit.faults import body
from _kit.tickets import KEY, ORDER, TICKETS, Crash, make_tickets
from _kit.workers import Workers, faulty

from agentflow import DidNotHappen, Happened, Rerun
from agentflow.exec import LoopRunner, recover_tool_loop, run_tool_loop
from agentflow.exec.calls.read import CallState
from agentflow.exec.checkpoints import CheckpointConflict, RecoveryNeedsDecision
from agentflow.exec.run.control import settle
from agentflow.models import Message, ScriptedModel, ToolCall


async def mail_in_doubt(workers: Workers, run_id: str, *, effect: bool) -> str:
    """Run TICKETS until its worker dies in email_tickets (after the mail went out, or before); return the call id."""
    first = workers.runner()
    if effect:
        workers.tickets.crash_in.add("email_tickets")
    else:
        faulty(first).crash("started", when="after", tool="email_tickets")
    with pytest.raises(Crash):
        await first.run(TICKETS, ORDER, run_id=run_id)
    with pytest.raises(RecoveryNeedsDecision):
        await workers.runner().recover(TICKETS, run_id)
    (started,) = [body(r) for r in await workers.calls(run_id) if body(r).get("tool") == "email_tickets"]
    return str(started["call_id"])


async def test_it_happened_supplies_the_result_and_the_call_never_runs_again(workers):
    # Given a run whose worker died after email_tickets sent the mail, before its result was logged
    call_id = await mail_in_doubt(workers, "order-1", effect=True)
    assert workers.ran()["email_tickets"] == 1
    # When the operator, having seen the mail in the mail system, says it happened with its result
    await workers.runner().decide_in_doubt(
        TICKETS, "order-1", calls={call_id: Happened("mailed Hamlet")}, operator="alice"
    )
    result = await workers.runner().recover(TICKETS, "order-1")
    # Then the run finishes with the supplied result, and the mail went out once
    assert result.status == "done" and result.state.sent == "mailed Hamlet"
    assert workers.ran()["email_tickets"] == 1
    # And the call log holds the supplied result as a signed done record naming alice
    (done,) = [body(r) for r in await workers.calls("order-1") if r.kind == "done" and body(r)["call_id"] == call_id]
    assert done["supplied"] == {"operator": "alice"} and done["result"] == "mailed Hamlet"


async def test_it_did_not_happen_fails_the_call_and_it_never_runs(workers):
    # Given a run whose worker died right after logging email_tickets as started (no mail went out)
    call_id = await mail_in_doubt(workers, "order-1", effect=False)
    # When the operator says it did not happen and must not run
    decision = {call_id: DidNotHappen("the customer cancelled")}
    await workers.runner().decide_in_doubt(TICKETS, "order-1", calls=decision, operator="bob")
    result = await workers.runner().recover(TICKETS, "order-1")
    # Then the node fails with an error naming bob and the reason; no mail was ever sent
    assert result.status == "failed"
    assert result.error is not None and "bob" in result.error and "the customer cancelled" in result.error
    assert workers.ran()["email_tickets"] == 0


async def test_rerun_runs_the_call_once_and_the_grant_is_spent(workers):
    # Given a run whose worker died right after logging email_tickets as started
    call_id = await mail_in_doubt(workers, "order-1", effect=False)
    # When the operator says to rerun it, and the recovering worker dies inside the rerun too
    await workers.runner().decide_in_doubt(TICKETS, "order-1", calls={call_id: Rerun()}, operator="carol")
    workers.tickets.crash_in.add("email_tickets")
    with pytest.raises(Crash):
        await workers.runner().recover(TICKETS, "order-1")
    # Then the mail went out once, and the second attempt is in doubt again: the grant was spent
    assert workers.ran()["email_tickets"] == 1
    with pytest.raises(RecoveryNeedsDecision):
        await workers.runner().recover(TICKETS, "order-1")


async def test_a_result_that_does_not_fit_the_tools_return_type_is_refused_and_nothing_is_stored(workers):
    # Given a run in doubt on email_tickets, which returns a str
    call_id = await mail_in_doubt(workers, "order-1", effect=True)
    before = (len(await workers.history("order-1")), len(await workers.calls("order-1")))
    # When the operator supplies a result of another type
    with pytest.raises(ValueError, match="does not fit 'email_tickets'"):
        await workers.runner().decide_in_doubt(TICKETS, "order-1", calls={call_id: Happened({"sent": True})})
    # Then nothing was stored
    assert (len(await workers.history("order-1")), len(await workers.calls("order-1"))) == before


async def test_every_call_in_doubt_must_be_decided_and_only_those(workers):
    call_id = await mail_in_doubt(workers, "order-1", effect=True)
    runner = workers.runner()
    # A call that is not in doubt is refused, naming the ones that are
    with pytest.raises(ValueError, match="has no call in doubt"):
        await runner.decide_in_doubt(TICKETS, "order-1", calls={"0/hold/0/x": Rerun(), call_id: Rerun()})
    # Leaving one out is refused too
    with pytest.raises(ValueError, match="decide every call in doubt"):
        await runner.decide_in_doubt(TICKETS, "order-1", calls={})


async def test_a_run_without_a_call_in_doubt_has_nothing_to_decide(workers):
    # Given a run that finished
    await workers.runner().run(TICKETS, ORDER, run_id="order-1")
    # When an operator decides on it, Then it is refused
    with pytest.raises(CheckpointConflict):
        await workers.runner().decide_in_doubt(TICKETS, "order-1")


async def test_a_tool_loops_call_in_doubt_can_be_supplied_too(store_setup):
    # Given a tool loop whose worker died after email_tickets sent the mail
    tickets = make_tickets()
    tickets.crash_in.add("email_tickets")
    ask = Message.assistant("", tool_calls=[ToolCall(id="c1", name="email_tickets", arguments={"show": "Tosca"})])
    common = {"checkpoints": store_setup.raw, "checkpoint_key": KEY}
    with pytest.raises(Crash):
        await run_tool_loop(
            ScriptedModel([ask]), tickets.registry, [Message.user("mail it")], run_id="chat-1", **common
        )
    (started,) = [body(r) for r in await store_setup.calls("chat-1") if r.kind == "started" and "tool" in body(r)]
    # When the operator says it happened, and the loop is recovered
    decision = {str(started["call_id"]): Happened("mailed Tosca")}
    await LoopRunner(None, tickets.registry, **common).decide_in_doubt("chat-1", calls=decision, operator="dana")
    model = ScriptedModel([Message.assistant("Your tickets are on their way.")])
    result = await recover_tool_loop(model, tickets.registry, "chat-1", **common)
    # Then the model reads the supplied result, and the mail went out once
    assert result.status == "done"
    assert [m.content for m in result.messages if m.role == "tool"] == ["mailed Tosca"]
    assert tickets.ledger.counts()["email_tickets"] == 1


def test_a_call_in_doubt_of_an_idempotent_tool_left_out_of_the_decision_reruns():
    # Given two calls in doubt in one superstep: hold_seats (idempotent) and charge_card (not)
    tickets = make_tickets()
    hold = CallState("0/a/0/x", "hold_seats", "a", {}, "started", superstep=0)
    charge = CallState("0/b/0/y", "charge_card", "b", {}, "started", superstep=0)
    # When the operator decides only on the charge (it happened)
    rerun, records = settle("r", [hold, charge], {charge.call_id: Happened("charged 80")}, tickets.registry, "gil")
    # Then the idempotent call reruns, and the charge is supplied
    assert rerun == [hold.call_id]
    assert records == [
        ("done", {"call_id": charge.call_id, "superstep": 0, "supplied": {"operator": "gil"}, "result": "charged 80"})
    ]
    # And leaving out the non-idempotent one is refused
    with pytest.raises(ValueError, match="decide every call in doubt"):
        settle("r", [hold, charge], {hold.call_id: Rerun()}, tickets.registry, "gil")
