"""Tool-loop runs (flow ``loop:<name>``) are listed, shown and verified like flow runs."""

from __future__ import annotations

import runs_kit
from runs_kit import one_line_error

from agentflow.exec import run_tool_loop
from agentflow.exec.checkpoints import SQLiteCheckpointStore
from agentflow.models._messages import Message, ToolCall
from agentflow.models.scripted import ScriptedModel


def add_loop(db) -> None:
    async def run() -> None:
        ask = Message(
            role="assistant", tool_calls=(ToolCall(id="c1", name="refund", arguments={"order": "o-5", "amount": 7}),)
        )
        async with SQLiteCheckpointStore(db) as store:
            result = await run_tool_loop(
                ScriptedModel([ask]), runs_kit.registry, [Message.user("refund o-5")],
                run_id="chat-1", checkpoints=store, checkpoint_key=runs_kit.KEY, name="support",
            )  # fmt: skip
            assert result.status == "paused"

    runs_kit.in_thread(run)


def test_a_paused_tool_loop_is_listed_shown_and_verified(agentflow, db):
    add_loop(db)
    listing = agentflow("runs", "list", "--flow", "loop:support").stdout
    assert "chat-1" in listing and "paused" in listing
    shown = agentflow("runs", "show", "chat-1")
    assert shown.exit_code == 0, shown.output
    assert '"stage": "model"' in shown.stdout and "refund" in shown.stdout and "pending" in shown.stdout
    assert "run_tool_loop(..., run_id='chat-1'" in shown.stdout
    assert agentflow("verify", "chat-1").exit_code == 0
    # a loop resumes through run_tool_loop, not through a FlowApp
    resumed = agentflow("resume", "chat-1", "--app", "runs_kit:app", "--approve")
    assert resumed.exit_code == 2
    assert "resume it with run_tool_loop" in one_line_error(resumed)
