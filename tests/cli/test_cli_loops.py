"""Tool-loop runs (flow ``loop:<name>``) are listed, shown and verified like flow runs."""

from __future__ import annotations

from pathlib import Path

import runs_kit
from runs_kit import one_line_error

from agentflow.exec import run_tool_loop
from agentflow.exec.checkpoints import SQLiteCheckpointStore
from agentflow.models._messages import Message, ToolCall
from agentflow.models.scripted import ScriptedModel


def add_loop(db: Path) -> None:
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
    assert shown.stdout.startswith("run chat-1   tool loop support   status paused")
    assert '"stage": "model"' in shown.stdout and "refund" in shown.stdout and "pending" in shown.stdout
    assert "agentflow resume chat-1 --app module:attr --approve|--deny" in shown.stdout
    assert agentflow("verify", "chat-1").exit_code == 0
    # a loop resumes with the app's tool loop of its name: an app without it is named, and nothing is touched
    resumed = agentflow("resume", "chat-1", "--app", "runs_kit:app", "--approve")
    assert resumed.exit_code == 2
    assert "unknown tool loop 'support' (this app has: none)" in one_line_error(resumed)
    assert agentflow("verify", "chat-1").exit_code == 0


def test_the_read_model_knows_a_loop_by_its_kind_not_by_its_column(db):
    from agentflow import RunKind
    from agentflow.exec.run.read import read_run
    from agentflow.exec.run.view import RunReport
    from agentflow.exec.seal import Sealer

    add_loop(db)

    async def read() -> tuple[RunReport, RunReport]:
        async with SQLiteCheckpointStore(db) as store:
            sealer = Sealer(runs_kit.KEY)
            return await read_run(store, sealer, "chat-1"), await read_run(store, sealer, "refund-1")

    loop, flow = runs_kit.in_thread(read)

    assert (loop.kind, loop.name, loop.flow) == (RunKind.LOOP, "support", "loop:support")
    assert (flow.kind, flow.name, flow.flow) == (RunKind.FLOW, "refunds", "refunds")


def test_a_loop_in_doubt_is_told_to_recover_with_the_same_command_as_a_flow_run():
    from agentflow import RunKind
    from agentflow.cli._show import run_text
    from agentflow.exec.run.view import IN_DOUBT, CallView, CheckpointView, RunReport

    # Given a tool loop whose current turn has a call in doubt (as the read model reports it)
    report = RunReport("chat-9", "loop:support", RunKind.LOOP, "running", 3, 0.0)
    report.checkpoints = [CheckpointView(3, 0.0, "running", 0, superstep=1, what="superstep")]
    report.calls = [CallView("1/tools/0/ab", "refund", "tools", 1, "started", state=IN_DOUBT)]

    # When it is shown, Then the way on is the command any run takes (the app given has the loop)
    text = run_text(report)
    assert "in doubt: refund" in text
    assert "agentflow decide chat-9 --app ... --call CALL_ID=rerun|happened:JSON|not:REASON --as NAME" in text
    assert "then agentflow recover chat-9 --app ..." in text and "--rerun-in-doubt" not in text
