"""Operator actions on a run that no worker holds: cancel it, or fork a new run from any of its checkpoints.

Cancelling a run a live worker holds is `test_cancel_live.py`.

Every rule runs on every store set-up (the ``workers`` fixture).
"""

from __future__ import annotations

import pytest
from _kit.faults import FaultyStore, body
from _kit.tickets import KEY, KEY_B, ORDER, REFUNDS, TICKETS, Crash, Refund, make_tickets
from _kit.workers import Workers, faulty
from pydantic import BaseModel

from agentflow import Call, Executor, Flow, FlowRunner, Registry, RunStatus
from agentflow._errors import (
    CheckpointConflict,
    CheckpointNotFound,
    CheckpointStoreCorrupt,
    FlowError,
    RecoveryNeedsDecision,
)
from agentflow.exec import LoopRunner, recover_tool_loop, run_tool_loop
from agentflow.exec.checkpoints import idempotency_key
from agentflow.exec.run.read import read_run
from agentflow.exec.run.view import Lineage
from agentflow.exec.seal import Sealer
from agentflow.models import Message, ScriptedModel, ToolCall


class Bill(BaseModel):
    amount: int
    receipt: str = ""


# -- cancel -------------------------------------------------------------------------------


async def test_a_paused_run_is_cancelled_at_once_and_its_pending_call_never_runs(workers):
    # Given a refund paused for approval
    await workers.runner().run(REFUNDS, Refund(amount=500), run_id="refund-1")
    # When an operator cancels it
    result = await workers.runner().cancel(REFUNDS, "refund-1", reason="duplicate request", operator="alice")
    # Then it is cancelled, says who and why, and nothing can resume or recover it
    assert result.status == RunStatus.CANCELLED
    assert result.error == "cancelled by alice: duplicate request"
    with pytest.raises(CheckpointConflict, match="cancelled"):
        await workers.runner().resume(REFUNDS, "refund-1", approve=True)
    with pytest.raises(CheckpointConflict, match="already ended"):
        await workers.runner().recover(REFUNDS, "refund-1")
    assert workers.ran() == {}


async def test_a_stranded_run_is_cancelled_and_never_recovered(workers):
    # Given a run whose worker died between supersteps
    first = workers.runner()
    faulty(first).crash("save", step=2)
    with pytest.raises(Crash):
        await first.run(TICKETS, ORDER, run_id="order-1")
    before = workers.ran()
    # When an operator cancels it
    await workers.runner().cancel(TICKETS, "order-1", reason="customer left", operator="bob")
    # Then it is final: not listed as unfinished, recover refuses it, no save or started record is taken
    assert "order-1" not in await workers.raw.list_unfinished("tickets")
    with pytest.raises(CheckpointConflict, match="cancelled"):
        await workers.runner().recover(TICKETS, "order-1")
    assert workers.ran() == before
    latest = (await workers.history("order-1"))[-1]
    assert latest.status == "cancelled" and latest.segment == latest.step
    assert body(latest)["claim"] == "cancel" and body(latest)["operator"] == "bob"
    assert body(latest)["reason"] == "customer left"


async def test_an_ended_run_cannot_be_cancelled_and_a_reason_is_required(workers):
    await workers.runner().run(TICKETS, ORDER, run_id="order-1")
    with pytest.raises(CheckpointConflict, match="already ended"):
        await workers.runner().cancel(TICKETS, "order-1", reason="late")
    with pytest.raises(ValueError, match="say why"):
        await workers.runner().cancel(TICKETS, "order-1", reason=" ")


async def test_a_tool_loop_is_cancelled_too(store_setup):
    # Given a tool loop paused on a refund that needs approval
    tickets = make_tickets()
    ask = Message.assistant("", tool_calls=[ToolCall(id="c1", name="refund", arguments={"amount": 500})])
    common = {"checkpoints": store_setup.raw, "checkpoint_key": KEY}
    paused = await run_tool_loop(
        ScriptedModel([ask]), tickets.registry, [Message.user("refund")], run_id="c-1", **common
    )
    assert paused.status == "paused"
    # When it is cancelled, Then it is final
    cancelled = await LoopRunner(None, tickets.registry, **common).cancel("c-1", reason="not needed", operator="erin")
    assert cancelled.status == RunStatus.CANCELLED
    with pytest.raises(CheckpointConflict):
        await recover_tool_loop(ScriptedModel([]), tickets.registry, "c-1", **common)
    assert tickets.ledger.counts() == {}


# -- fork ---------------------------------------------------------------------------------


async def test_a_fork_from_step_1_with_a_patched_state_runs_its_calls_anew(workers):
    # Given a finished run
    done = await workers.runner().run(TICKETS, ORDER, run_id="order-1")
    assert done.status == "done"
    # When an operator forks it from step 1 (after hold_seats) with two more seats
    runner = workers.runner()
    forked = await runner.fork(TICKETS, "order-1", at_step=1, new_run_id="order-1b", patch={"seats": 4}, operator="fay")
    # Then the new run goes on from pay with the patched state: its calls are new, the old run is untouched
    assert forked.status == "done" and forked.state.seats == 4
    assert "charged 160" in str(forked.state.paid)
    assert workers.ran("order-1b") == {"charge_card": 1, "email_tickets": 1}
    assert workers.ran("order-1") == {"hold_seats": 1, "charge_card": 1, "email_tickets": 1}
    # And its step 0 is signed with its lineage, which the read model shows
    first = (await workers.history("order-1b"))[0]
    assert body(first)["forked_from"] == {"run": "order-1", "step": 1, "operator": "fay"}
    report = await read_run(workers.raw, Sealer(KEY), "order-1b")
    assert not report.problems
    assert report.forked_from == Lineage("order-1", 1, "fay")
    assert (await read_run(workers.raw, Sealer(KEY), "order-1")).forked_from is None


async def test_a_forked_runs_calls_have_new_idempotency_keys(workers):
    # Given a one-node flow whose tool records the idempotency key it is given
    keys: list[str] = []
    registry = Registry()

    @registry.tool
    async def charge(amount: int) -> str:
        keys.append(idempotency_key())
        return "ok"

    flow = Flow("bill", state=Bill).node("pay", Call("charge", args=lambda b: {"amount": b.amount}, into="receipt"))
    runner = FlowRunner(Executor(registry), checkpoints=workers.raw, checkpoint_key=KEY)
    await runner.run(flow.end("pay"), Bill(amount=5), run_id="bill-1")
    # When it is forked from step 0, the same call runs again in the new run
    await runner.fork(flow.end("pay"), "bill-1", at_step=0, new_run_id="bill-2")
    # Then the external system sees another idempotency key: a new request, not a duplicate
    assert len(keys) == 2 and keys[0] != keys[1]


async def test_a_patch_that_does_not_fit_the_state_model_is_refused_and_nothing_is_saved(workers):
    await workers.runner().run(TICKETS, ORDER, run_id="order-1")
    with pytest.raises(FlowError, match="does not fit"):
        await workers.runner().fork(TICKETS, "order-1", at_step=1, new_run_id="bad", patch={"seats": "many"})
    with pytest.raises(CheckpointNotFound):
        await workers.raw.latest("bad")


async def test_a_patch_naming_a_field_the_state_lacks_is_refused_and_nothing_is_saved(workers):
    # Given a finished run, and a patch with a typo (seat for seats): without this check the fork
    # would keep the old seats, rerun the card charge and the e-mail, and the fix would be lost
    await workers.runner().run(TICKETS, ORDER, run_id="order-1")
    with pytest.raises(FlowError, match=r"the patch names 'seat', which Order does not have \(its fields: show, seats"):
        await workers.runner().fork(TICKETS, "order-1", at_step=1, new_run_id="typo", patch={"seat": 4})
    with pytest.raises(CheckpointNotFound):
        await workers.raw.latest("typo")


async def test_a_fork_from_a_step_that_does_not_exist_is_not_found(workers):
    await workers.runner().run(TICKETS, ORDER, run_id="order-1")
    with pytest.raises(CheckpointNotFound, match="no checkpoint at step 9"):
        await workers.runner().fork(TICKETS, "order-1", at_step=9)


async def test_a_fork_may_patch_with_a_function_of_the_state(workers: Workers) -> None:
    await workers.runner().run(TICKETS, ORDER, run_id="order-1")

    def fewer(order: object) -> None:
        order.seats = 1  # type: ignore[attr-defined]

    forked = await workers.runner().fork(TICKETS, "order-1", at_step=1, patch=fewer, max_supersteps=0)
    assert forked.status == "running" and forked.state.seats == 1
    # And a worker with another key cannot fork the signed run: the checkpoint fails its check
    stranger = FlowRunner(Executor(workers.tickets.registry), checkpoints=workers.raw, checkpoint_key=KEY_B)
    with pytest.raises(CheckpointStoreCorrupt):
        await stranger.fork(TICKETS, "order-1", at_step=1)


# -- retry --------------------------------------------------------------------------------


class Flaky:
    """A payment tool that raises until it is told not to, counting its attempts and its charges."""

    def __init__(self) -> None:
        self.broken = True
        self.attempts = 0
        self.charged = 0
        self.holds = 0
        self.registry = Registry()

        @self.registry.tool(idempotent=True)
        async def hold(amount: int) -> str:
            self.holds += 1
            return "held"

        @self.registry.tool
        async def pay(amount: int) -> str:
            self.attempts += 1
            if self.broken:
                raise RuntimeError("the payment API is down")
            self.charged += 1
            return f"paid {amount}"

        self.flow = (
            Flow("billing", state=Bill)
            .node("hold", Call("hold", args=lambda b: {"amount": b.amount}, into="receipt"))
            .node("pay", Call("pay", args=lambda b: {"amount": b.amount}, into="receipt"))
            .edge("hold", "pay")
            .end("pay")
        )


async def test_a_failed_run_is_retried_from_the_superstep_that_failed(workers):
    # Given a run that failed in pay (the payment API was down), after hold finished
    flaky = Flaky()
    runner = FlowRunner(Executor(flaky.registry), checkpoints=workers.raw, checkpoint_key=KEY)
    failed = await runner.run(flaky.flow, Bill(amount=9), run_id="bill-1")
    assert failed.status == "failed" and "the payment API is down" in str(failed.error)
    # When the API is back and an operator retries it
    flaky.broken = False
    again = FlowRunner(Executor(flaky.registry), checkpoints=workers.raw, checkpoint_key=KEY)
    result = await again.retry(flaky.flow, "bill-1", operator="hal")
    # Then pay runs again and the run finishes; hold did not run again
    assert result.status == "done" and result.state.receipt == "paid 9"
    assert (flaky.holds, flaky.attempts, flaky.charged) == (1, 2, 1)
    claim = next(r for r in await workers.history("bill-1") if body(r).get("claim") == "retry")
    assert body(claim)["operator"] == "hal"
    # And a run that did not fail is not retried
    with pytest.raises(CheckpointConflict, match="only a failed run can be retried"):
        await again.retry(flaky.flow, "bill-1")


async def test_a_retry_cut_off_inside_the_call_leaves_it_in_doubt(workers):
    # Given a failed run, retried by a worker that dies inside the retried (not idempotent) call
    flaky = Flaky()
    runner = FlowRunner(Executor(flaky.registry), checkpoints=workers.raw, checkpoint_key=KEY)
    await runner.run(flaky.flow, Bill(amount=9), run_id="bill-1")
    flaky.broken = False
    store = FaultyStore(workers.setup.open())
    store.crash("done", tool="pay", when="before")
    cut = FlowRunner(Executor(flaky.registry), checkpoints=store, checkpoint_key=KEY)
    with pytest.raises(Crash):
        await cut.retry(flaky.flow, "bill-1")
    # Then the retried call is in doubt (not replayed as the old failure): a decision is needed
    with pytest.raises(RecoveryNeedsDecision):
        await runner.recover(flaky.flow, "bill-1")
    assert flaky.charged == 1
