"""Flows and tool loops refuse the same bad decisions with the same error: one rule, one home.

Each case runs against a paused flow run and a paused tool loop, through each kind's own
entry point (`FlowRunner.resume`; `run_tool_loop` with the run id, and `LoopRunner.resume`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _kit.tickets import KEY, REFUNDS, Refund, make_tickets

from agentflow import Executor, FlowRunner, RunContext
from agentflow._errors import IdentityMismatch
from agentflow.exec import LoopRunner, run_tool_loop
from agentflow.exec.checkpoints import CheckpointConflict, CheckpointStore, SQLiteCheckpointStore
from agentflow.models import Message, ScriptedModel, ToolCall

RUN = "decide-1"
ALICE = RunContext(user="alice", thread="t1")


@dataclass
class Paused:
    """A paused run of one kind, and how that kind takes a decision."""

    kind: str
    pending: list[str]
    decide: Callable[..., Awaitable[Any]]
    store: CheckpointStore


def _refund_reply() -> Message:
    return Message.assistant("", tool_calls=[ToolCall(id="c1", name="refund", arguments={"amount": 500})])


async def paused_flow(store: CheckpointStore) -> Paused:
    tickets = make_tickets()
    runner = FlowRunner(Executor(tickets.registry), checkpoints=store, checkpoint_key=KEY)
    result = await runner.run(REFUNDS, Refund(amount=500), run_id=RUN, ctx=ALICE)
    assert result.status == "paused"

    async def decide(approve: bool | Mapping[str, bool], ctx: RunContext | None = None) -> Any:
        return await runner.resume(REFUNDS, RUN, approve=approve, ctx=ctx)

    return Paused("flow", [p.call_id for p in result.pending], decide, store)


async def paused_loop(store: CheckpointStore) -> Paused:
    tickets = make_tickets()
    model = ScriptedModel([_refund_reply(), Message.assistant("done")])
    result = await run_tool_loop(
        model, tickets.registry, [Message.user("refund me")], run_id=RUN, checkpoints=store, checkpoint_key=KEY,
        ctx=ALICE,
    )  # fmt: skip
    assert result.status == "paused"

    async def decide(approve: bool | Mapping[str, bool], ctx: RunContext | None = None) -> Any:
        return await run_tool_loop(
            model, tickets.registry, run_id=RUN, checkpoints=store, checkpoint_key=KEY, approve=approve, ctx=ctx
        )

    return Paused("loop", [p.call_id for p in result.pending], decide, store)


@pytest.fixture(params=["flow", "loop"])
async def paused(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Paused]:
    store = SQLiteCheckpointStore(tmp_path / "runs.db")
    made = await (paused_flow if request.param == "flow" else paused_loop)(store)
    yield made
    await store.aclose()


async def test_an_approval_naming_a_call_that_is_not_pending_is_refused(paused):
    # When the decision names a call id the run is not waiting for
    with pytest.raises(ValueError, match=r"has no pending call\(s\) \['9/nope/0/x'\]"):
        await paused.decide({"9/nope/0/x": True, **{cid: True for cid in paused.pending}}, ALICE)
    # Then nothing was stored: the run is still paused at the same step
    assert (await paused.store.latest(RUN)).status == "paused"


async def test_an_approval_that_leaves_a_pending_call_undecided_is_refused(paused):
    with pytest.raises(ValueError, match="decide every pending call; missing"):
        await paused.decide({}, ALICE)
    assert (await paused.store.latest(RUN)).status == "paused"


async def test_a_decision_for_someone_else_is_refused(paused):
    with pytest.raises(IdentityMismatch):
        await paused.decide(True, RunContext(user="mallory", thread="t1"))
    assert (await paused.store.latest(RUN)).status == "paused"


async def test_a_second_decision_on_a_run_that_went_on_is_refused(paused):
    # Given a run whose decision was taken and spent
    first = await paused.decide(True, ALICE)
    assert first.status == "done"
    # When the same decision comes again
    # Then it is refused the same way for both kinds
    with pytest.raises(CheckpointConflict, match=r"is not paused \(done\)"):
        await paused.decide(True, ALICE)


async def test_flows_and_loops_word_a_refused_decision_the_same(tmp_path):
    # Given a paused flow and a paused loop, each decided with a call id that is not pending
    messages = {}
    for kind, make in (("flow", paused_flow), ("loop", paused_loop)):
        store = SQLiteCheckpointStore(tmp_path / f"{kind}.db")
        made = await make(store)
        with pytest.raises(ValueError) as caught:
            await made.decide({"9/nope/0/x": True}, ALICE)
        messages[kind] = str(caught.value).split(";")[0]
        await store.aclose()
    # Then both say the same thing
    assert messages["flow"] == messages["loop"]


async def test_a_loop_decision_stored_without_running_follows_the_same_rule(tmp_path):
    # Given a paused loop
    store = SQLiteCheckpointStore(tmp_path / "runs.db")
    made = await paused_loop(store)
    registry = make_tickets().registry
    # When the decision is stored for a worker with an unknown call id, then with the right ones
    deciding = LoopRunner(None, registry, checkpoints=store, checkpoint_key=KEY)
    with pytest.raises(ValueError, match="has no pending call"):
        await deciding.resume(RUN, approve={"x": True}, ctx=ALICE, max_supersteps=0)
    stored = await deciding.resume(RUN, approve={cid: True for cid in made.pending}, ctx=ALICE, max_supersteps=0)
    # Then it is stored with a claim (the run is running again, at the claim's step)
    assert stored.status == "running"
    assert (await store.latest(RUN)).step == stored.step
    await store.aclose()
