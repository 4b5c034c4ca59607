"""`agentflow.runs.Runs`: one in-process transport acts on a flow run and a tool loop alike (it picks the kind).

Each test runs on every store set-up (`_kit.stores`). The app has one flow (``refunds``: a
refund that needs approval) and one tool loop (``support``: asks for the same refund, then
answers). What a person does through `Runs` is checked against the stored rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest
from _kit.runs_here import runs_here
from _kit.stores import StoreSetup
from pydantic import BaseModel

from agentflow import Call, Flow, FlowApp, LoopSpec, Registry, RunStatus
from agentflow.errors import CheckpointStoreCorrupt, FlowError
from agentflow.exec import LoopRunner
from agentflow.models import Message, ToolCall
from agentflow.runs import Runs

KEY = b"operate-test-key-0123456789abcdefghij"
REFUNDS: list[str] = []
MODELS_MADE: list[str] = []
registry = Registry()


@registry.tool(approval=True)
async def refund(order: str) -> str:
    """Refund an order (a person approves it first)."""
    REFUNDS.append(order)
    return f"refunded {order}"


class Refund(BaseModel):
    order: str
    note: str = ""


refunds = Flow("refunds", state=Refund).node("refund", Call("refund", args=lambda s: {"order": s.order}, into="note"))
refunds = refunds.end("refund")


class SupportModel:
    """Asks for the refund of A1, and answers once the refund's result is in the history."""

    async def complete(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> Message:
        if any(m.role == "tool" for m in messages):
            return Message.assistant("Refunded A1.")
        return Message.assistant(tool_calls=[ToolCall(id="c0", name="refund", arguments={"order": "A1"})])


def support_model() -> SupportModel:
    MODELS_MADE.append("support")
    return SupportModel()


app = FlowApp(registry, [refunds], loops={"support": LoopSpec(model_factory=support_model, registry=registry)})


@pytest.fixture(autouse=True)
def _reset() -> None:
    REFUNDS.clear()
    MODELS_MADE.clear()


async def paused_runs(store_setup: StoreSetup) -> Runs:
    """A paused refunds run ``flow-1`` and a paused support loop ``loop-1``; the operator over the same store."""
    runner = app.runner(store_setup.raw, KEY)
    assert (await runner.run(refunds, Refund(order="F1"), run_id="flow-1")).status == RunStatus.PAUSED
    loop = LoopRunner(support_model(), registry, checkpoints=store_setup.raw, checkpoint_key=KEY, name="support")
    assert (await loop.run([Message.user("Refund A1")], run_id="loop-1")).status == RunStatus.PAUSED
    MODELS_MADE.clear()
    return runs_here(app, store_setup.open(), [KEY], name="operator-test")


async def test_one_operator_resumes_a_flow_run_and_a_tool_loop_alike(store_setup: StoreSetup) -> None:
    operator = await paused_runs(store_setup)
    # When the operator approves both, without saying which kind each run is
    flow = await operator.resume("flow-1", approve=True, operator="erin")
    loop = await operator.resume("loop-1", approve=True, operator="erin")
    # Then both ran their refund once here and ended; the loop's model was made for it, once
    assert (flow.status, loop.status) == ("done", "done")
    assert sorted(REFUNDS) == ["A1", "F1"] and MODELS_MADE == ["support"]


async def test_an_operator_who_only_cancels_a_loop_never_makes_its_model(store_setup: StoreSetup) -> None:
    operator = await paused_runs(store_setup)
    acted = await operator.cancel("loop-1", reason="customer withdrew", operator="erin")
    assert acted.status == "cancelled" and MODELS_MADE == [] and REFUNDS == []
    assert (await store_setup.raw.latest("loop-1")).status == "cancelled"


@pytest.mark.parametrize("action", ["retry", "migrate"])
async def test_what_a_tool_loop_cannot_do_is_refused_with_the_reason_and_touches_nothing(
    store_setup: StoreSetup, action: str
) -> None:
    operator = await paused_runs(store_setup)
    before = await store_setup.raw.history("loop-1")
    run = await operator.open("loop-1")
    with pytest.raises(FlowError, match="is a tool loop"):
        if action == "retry":
            await operator.retry("loop-1", operator="erin")
        else:
            await run.migrate("loop-1", operator="erin")
    assert await store_setup.raw.history("loop-1") == before


async def test_an_operator_forks_a_tool_loop_as_it_forks_a_flow_run(store_setup: StoreSetup) -> None:
    # Given a paused loop and a paused flow run
    operator = await paused_runs(store_setup)
    before = await store_setup.raw.history("loop-1")
    # When the operator forks each from its step 0, by id alone
    loop = await operator.fork("loop-1", at_step=0, new_run_id="loop-2", operator="erin")
    flow = await operator.fork("flow-1", at_step=0, new_run_id="flow-2", operator="erin")
    # Then each new run went on here from its source's first checkpoint, to the same approval it waits for
    assert (loop.status, flow.status) == ("paused", "paused")
    assert [p.tool for p in loop.pending] == [p.tool for p in (await operator.loop("support").read("loop-1")).pending]
    assert await store_setup.raw.history("loop-1") == before


async def test_a_run_whose_newest_row_fails_its_check_is_not_acted_on(store_setup: StoreSetup) -> None:
    # Given a paused flow run whose newest row was changed behind agentflow's back
    operator = await paused_runs(store_setup)
    newest = await store_setup.raw.latest("flow-1")
    await store_setup.rows.put_checkpoint(newest, dataclasses.replace(newest, flow="loop:support"))
    # When the operator approves it, Then the row is refused before its column picks a kind, and nothing runs
    with pytest.raises(CheckpointStoreCorrupt):
        await operator.resume("flow-1", approve=True, operator="erin")
    assert REFUNDS == [] and MODELS_MADE == []


async def test_a_run_of_a_loop_the_app_lacks_names_the_loops_it_has(store_setup: StoreSetup) -> None:
    operator = await paused_runs(store_setup)
    bare = runs_here(FlowApp(registry, [refunds]), store_setup.open(), [KEY])
    with pytest.raises(FlowError, match=r"unknown tool loop 'support' \(this app has: none\)"):
        await bare.cancel("loop-1", reason="no", operator="erin")
    assert (await operator.open("loop-1")) is operator.loop("support")


def test_a_loop_runner_takes_an_owner_or_an_identity_not_both() -> None:
    with pytest.raises(ValueError, match="an owner or an identity, not both"):
        LoopRunner(None, registry, owner="a", identity="b")


async def test_a_loop_runner_built_without_a_model_says_so_when_asked_to_call_one() -> None:
    runner = LoopRunner(None, registry, name="support")
    with pytest.raises(RuntimeError, match="built without a model"):
        await runner.run([Message.user("Refund A1")])
