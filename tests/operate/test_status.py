"""Reading a run whatever its kind, in process: `Runs.status`, `settle` and `result` (`agentflow.runs`).

A flow run, a tool loop and an agent run each die inside a charge (`Crash` after the card was
charged); a second process parks each for a decision (as a worker does: `advance(park=True)`).
Each view then says the same things the same way (`_kit.parked`), and once an operator says the
charge happened, each ends with its output.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _kit.agents import PROMPT, durable, make_agent
from _kit.leases import KILLED_LEASE_S, once_lapsed
from _kit.parked import PARKED, ChargeModel, check_no_result_yet, check_parked
from _kit.runs_here import runs_here
from _kit.stores import StoreSetup
from _kit.tickets import REFUNDS, TICKETS, Crash, Ledger, Order, Refund, make_tickets, raise_crash

from agentflow import Flow, FlowApp, Happened, LoopSpec, RunStatus
from agentflow._app import LoopHost
from agentflow.errors import CheckpointNotFound, RecoveryNeedsDecision, RunFailed, RunNotDone
from agentflow.exec import LoopRunner
from agentflow.integrations.pydantic_ai import AgentRunner
from agentflow.models import Message
from agentflow.runs import Runs

KEY = b"kind-blind-status-key-0123456789abcdef"


def app_for(ledger: Ledger, *, dies: bool) -> FlowApp:
    """The three kinds over one ledger; with `dies`, each one's charge dies right after its effect."""
    tickets = make_tickets(ledger)
    if dies:
        tickets.crash_in.update({"charge_card"})
    agent = make_agent(ledger, die_in="charge" if dies else None, die=raise_crash)
    loops: dict[str, LoopHost] = {
        "charges": LoopSpec(model_factory=ChargeModel, registry=tickets.registry),
        "orders": durable(agent),
    }
    return FlowApp(tickets.registry, [TICKETS], loops=loops)


async def start(runs: Runs, kind: str, run_id: str) -> Any:
    """Start a run of `kind` here, to its end or first pause (or its death)."""
    if kind == "flow":
        return await runs.runner.run(TICKETS, Order(show="parked"), run_id=run_id)
    if kind == "loop":
        loop = runs.loop("charges")
        assert isinstance(loop, LoopRunner)
        return await loop.run([Message.user("parked")], run_id=run_id)
    agent = runs.loop("orders")
    assert isinstance(agent, AgentRunner)
    return await agent.run(PROMPT, run_id=run_id)


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.jsonl")


async def parked_here(store_setup: StoreSetup, ledger: Ledger, kind: str) -> Runs:
    """A run ``<kind>-1`` whose process died inside its charge, parked by the next one; that one's operator."""
    dead_app = app_for(ledger, dies=True)
    dead = Runs(dead_app, dead_app.runner(store_setup.open(), KEY, lease_s=KILLED_LEASE_S, owner="dead"))
    with pytest.raises(Crash):
        await start(dead, kind, f"{kind}-1")
    operator = runs_here(app_for(ledger, dies=False), store_setup.open(), [KEY], name="w2")
    ops = await operator.open(f"{kind}-1")
    with pytest.raises(RecoveryNeedsDecision):
        await once_lapsed(lambda: ops.advance(f"{kind}-1", park=True))
    return operator


@pytest.mark.parametrize("kind", sorted(PARKED))
async def test_a_parked_run_of_any_kind_settles_into_the_same_view_naming_its_call_in_doubt(
    store_setup: StoreSetup, ledger: Ledger, kind: str
) -> None:
    # Given a run of this kind parked on its charge, in doubt (the card was charged once)
    operator = await parked_here(store_setup, ledger, kind)
    parked = PARKED[kind]
    run_id = f"{kind}-1"
    # When it is read, by id alone
    view = await operator.settle(run_id, timeout_s=10)
    # Then it names what it is, that it waits for a decision, and the call (id, tool, arguments)
    call_id = check_parked(view, parked)
    assert view == await operator.status(run_id)
    await check_no_result_yet(operator, run_id, parked)
    # When the operator, having checked the card, says the charge happened
    await operator.decide_in_doubt(run_id, calls={call_id: Happened(parked.charged)}, operator="erin")
    await operator.recover(run_id, operator="erin")
    # Then the run goes on here to its end, charged once, and its result is what the kind produces
    done = await operator.settle(run_id, timeout_s=10)
    assert (done.status, done.waiting) == (RunStatus.DONE, None)
    assert parked.output(await operator.result(run_id)) and parked.output(done.output)
    assert ledger.counts(run_id)[parked.tool] == 1


async def test_a_loop_and_an_agent_show_their_messages_and_a_flow_its_state(
    store_setup: StoreSetup, ledger: Ledger
) -> None:
    app = app_for(ledger, dies=False)
    operator = runs_here(app, store_setup.open(), [KEY], name="w1")
    for kind in sorted(PARKED):
        await start(operator, kind, f"{kind}-2")
    flow, loop, agent = [await operator.status(f"{kind}-2") for kind in ("flow", "loop", "agent")]
    # The flow run's state is its flow's model; the loop's messages are Messages; the agent's pydantic-ai's
    assert isinstance(flow.state, Order) and flow.output == flow.state and flow.messages == []
    assert [m.role for m in loop.messages] == ["user", "assistant", "tool", "assistant"]
    assert loop.output == "answer: charged 40 for parked" and loop.version is None
    assert type(agent.messages[0]).__name__ == "ModelRequest" and agent.engine == "pydantic-ai"
    assert (flow.kind, loop.kind, agent.kind) == ("flow", "loop", "agent")


async def test_a_run_read_by_an_app_without_its_loop_shows_what_is_stored(
    store_setup: StoreSetup, ledger: Ledger
) -> None:
    # Given a finished tool loop, read by an app that has no loop of that name
    made = runs_here(app_for(ledger, dies=False), store_setup.open(), [KEY], name="w1")
    await start(made, "loop", "loop-3")
    other = runs_here(FlowApp(make_tickets(ledger).registry, [TICKETS]), store_setup.open(), [KEY], name="w2")
    view = await other.status("loop-3")
    # Then its messages are the stored JSON, unchecked against a schema, and it still says what it is
    assert (view.kind, view.name, view.status) == ("loop", "charges", "done")
    assert [m["role"] for m in view.messages] == ["user", "assistant", "tool", "assistant"]


def _closed(refund: Refund) -> dict[str, str]:
    raise ValueError("the ledger is closed")


#: A flow whose one node raises: its runs end failed.
BROKEN = Flow("broken", state=Refund).node("close", _closed).end("close")


async def test_the_result_of_a_paused_a_cancelled_or_a_failed_run_is_refused_with_why(
    store_setup: StoreSetup, ledger: Ledger
) -> None:
    tickets = make_tickets(ledger)
    operator = runs_here(FlowApp(tickets.registry, [REFUNDS, BROKEN]), store_setup.open(), [KEY], name="w1")
    # A run that waits for a person's approval: the result names the call
    refund = await operator.runner.run(REFUNDS, {"amount": 500}, run_id="refund-1")
    assert refund.status == RunStatus.PAUSED
    view = await operator.status("refund-1")
    assert view.waiting is not None and view.waiting.what == "approval"
    assert [(c.tool, c.args) for c in view.waiting.calls] == [("refund", {"amount": 500})]
    with pytest.raises(RunNotDone, match="it is paused, waiting for an approval of refund"):
        await operator.result("refund-1")
    # A run cancelled: the result says who cancelled it and why
    await operator.cancel("refund-1", reason="customer withdrew", operator="erin")
    with pytest.raises(RunNotDone, match="it is cancelled, cancelled by erin: customer withdrew"):
        await operator.result("refund-1")
    # A run that failed: RunFailed with its error
    assert (await operator.runner.run(BROKEN, {"amount": 5}, run_id="fail-1")).status == RunStatus.FAILED
    with pytest.raises(RunFailed, match="run 'fail-1' failed: .*the ledger is closed"):
        await operator.result("fail-1")
    with pytest.raises(CheckpointNotFound):
        await operator.status("nobody")
