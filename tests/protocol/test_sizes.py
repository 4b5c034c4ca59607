"""A checkpoint over the run's size limit is refused before it is signed or stored, naming what is large."""

from __future__ import annotations

import pytest
from _kit.tickets import KEY, ORDER, TICKETS, make_tickets
from pydantic import BaseModel

from agentflow import Call, Executor, Flow, FlowRunner
from agentflow.errors import CheckpointTooLarge, RecoveryNeedsDecision
from agentflow.exec.checkpoints import SQLiteCheckpointStore

LIMIT = 64 * 1024


class Bulky(BaseModel):
    name: str = "x"
    blob: str = ""
    result: str = ""


async def test_a_state_over_the_limit_is_refused_before_anything_is_stored(tmp_path):
    # Given a runner whose checkpoints may be 64 KiB at most
    store = SQLiteCheckpointStore(tmp_path / "runs.db")
    tickets = make_tickets()
    runner = FlowRunner(Executor(tickets.registry), checkpoints=store, checkpoint_key=KEY, max_checkpoint_bytes=LIMIT)
    flow = Flow("bulky", state=Bulky).node("hold", Call("hold_seats", args={"show": "x", "seats": 1}, into="result"))
    # When a run starts with a 200 KB field in its state
    with pytest.raises(CheckpointTooLarge) as caught:
        await runner.run(flow.end("hold"), Bulky(blob="b" * 200_000), run_id="big-1")
    # Then the error names the run, the large field and the setting, and nothing ran or was stored
    message = str(caught.value)
    assert "run 'big-1'" in message and "state.blob" in message and "max_checkpoint_bytes (65536)" in message
    assert tickets.counts() == {}
    assert await store.stored_runs() == []
    await store.aclose()


async def test_a_tool_result_over_the_limit_leaves_its_call_in_doubt(tmp_path):
    # Given a runner with a 64 KiB limit and a non-idempotent tool that returns 200 KB
    store = SQLiteCheckpointStore(tmp_path / "runs.db")
    tickets = make_tickets()

    @tickets.registry.tool(name="export")
    async def export(show: str) -> str:
        tickets.effect("export")
        return "r" * 200_000

    runner = FlowRunner(Executor(tickets.registry), checkpoints=store, checkpoint_key=KEY, max_checkpoint_bytes=LIMIT)
    flow = Flow("exports", state=Bulky).node("go", Call("export", args={"show": "x"}, into="result")).end("go")
    # When it runs, the result cannot be kept in the call log (nor in the state after it)
    with pytest.raises(CheckpointTooLarge):
        await runner.run(flow, Bulky(), run_id="big-2")
    # Then the call is logged as unrecordable: a recovery asks for a decision instead of running it again
    with pytest.raises(RecoveryNeedsDecision, match="could not be stored"):
        await runner.recover(flow, "big-2")
    assert tickets.counts() == {"export": 1}
    await store.aclose()


def test_a_limit_below_a_kibibyte_is_refused():
    with pytest.raises(ValueError, match="max_checkpoint_bytes must be at least 1024"):
        FlowRunner(Executor(make_tickets().registry), max_checkpoint_bytes=10)


async def test_the_default_limit_lets_ordinary_runs_through(tmp_path):
    store = SQLiteCheckpointStore(tmp_path / "runs.db")
    runner = FlowRunner(Executor(make_tickets().registry), checkpoints=store, checkpoint_key=KEY)
    assert (await runner.run(TICKETS, ORDER, run_id="small")).status == "done"
    await store.aclose()
