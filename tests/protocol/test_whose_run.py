"""A runner acts only on runs of its own kind and name (`RunDriver.owns`), and says whose a run is.

Every driver checks one rule before it rebuilds anything from a checkpoint: the signed
body says the driver's kind and engine, and the row is stored under the driver's column.
A refused run is left as it was, and the error names what the run is and what the runner
wanted. Each test runs on every store set-up (`_kit.stores`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from _kit.stores import StoreSetup
from pydantic import BaseModel

from agentflow import Call, Flow, FlowRunner, Registry, RunStatus
from agentflow.errors import CheckpointConflict
from agentflow.exec import Executor, LoopRunner
from agentflow.models import Message, ToolCall

KEY = b"whose-run-test-key-0123456789abcdefghij"
registry = Registry()


@registry.tool(approval=True)
async def refund(order: str) -> str:
    """Refund an order (a person approves it first)."""
    return f"refunded {order}"


class Refund(BaseModel):
    order: str
    note: str = ""


def refund_flow(name: str) -> Flow[Refund]:
    flow = Flow(name, state=Refund).node("refund", Call("refund", args=lambda s: {"order": s.order}, into="note"))
    return flow.end("refund")


class AsksForARefund:
    async def complete(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> Message:
        return Message.assistant(tool_calls=[ToolCall(id="c0", name="refund", arguments={"order": "A1"})])


def loop_named(store_setup: StoreSetup, name: str) -> LoopRunner:
    return LoopRunner(AsksForARefund(), registry, checkpoints=store_setup.open(), checkpoint_key=KEY, name=name)


def flow_runner(store_setup: StoreSetup) -> FlowRunner:
    return FlowRunner(Executor(registry), checkpoints=store_setup.open(), checkpoint_key=KEY)


async def test_a_flow_runner_refuses_a_tool_loops_run(store_setup: StoreSetup) -> None:
    # Given a tool loop "support" paused on its refund's approval
    paused = await loop_named(store_setup, "support").run([Message.user("refund A1")], run_id="r1")
    assert paused.status == RunStatus.PAUSED
    before = await store_setup.history("r1")

    # When a flow runner resumes it as a run of flow "support"
    # Then it refuses, naming both, and the run is as it was
    with pytest.raises(CheckpointConflict, match="run 'r1' is a tool loop named 'support', not a flow named 'support'"):
        await flow_runner(store_setup).resume(refund_flow("support"), "r1", approve=True)
    assert await store_setup.history("r1") == before


async def test_a_tool_loop_refuses_a_flow_run(store_setup: StoreSetup) -> None:
    # Given a paused run of flow "refunds"
    paused = await flow_runner(store_setup).run(refund_flow("refunds"), Refund(order="A1"), run_id="r1")
    assert paused.status == RunStatus.PAUSED

    # When a tool loop reads it, Then it refuses, naming both
    with pytest.raises(CheckpointConflict, match="run 'r1' is a flow named 'refunds', not a tool loop named 'refunds'"):
        await loop_named(store_setup, "refunds").read("r1")


async def test_a_tool_loop_refuses_another_loops_run(store_setup: StoreSetup) -> None:
    await loop_named(store_setup, "support").run([Message.user("refund A1")], run_id="r1")
    with pytest.raises(CheckpointConflict, match="is a tool loop named 'support', not a tool loop named 'sales'"):
        await loop_named(store_setup, "sales").read("r1")


async def test_a_flow_refuses_another_flows_run(store_setup: StoreSetup) -> None:
    # Given a paused run of flow "refunds"
    runner = flow_runner(store_setup)
    await runner.run(refund_flow("refunds"), Refund(order="A1"), run_id="r1")
    before = await store_setup.history("r1")

    # When it is resumed as a run of flow "returns", Then that is refused and nothing is written
    with pytest.raises(CheckpointConflict, match="is a flow named 'refunds', not a flow named 'returns'"):
        await runner.resume(refund_flow("returns"), "r1", approve=True)
    assert await store_setup.history("r1") == before
