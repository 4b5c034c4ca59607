"""Storage of a tool loop grows linearly with the conversation, not with its square.

Each checkpoint keeps only the messages added since the one before (plus the history's
length and a digest chain), so the bytes of one ``model`` or ``tools`` checkpoint do not
depend on how long the conversation already is. These are size assertions, not timings.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentflow import Event, Events, Registry
from agentflow.exec import run_tool_loop
from agentflow.exec.checkpoints import CheckpointStore, MemoryCheckpointStore, SQLiteCheckpointStore
from agentflow.models import Message, ScriptedModel, ToolCall

KEY = b"tool-loop-storage-key-0123456789abcdef"
#: What the tool returns every time: about 100 bytes.
RESULT = "x" * 100

registry = Registry()


@registry.tool(idempotent=True)
async def fetch(page: int) -> str:
    """Fetch one page of a document."""
    return RESULT


def turns_for(messages: int) -> int:
    """Tool turns giving a history of `messages`: the user's, two per turn, and the final answer."""
    return (messages - 2) // 2


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[CheckpointStore]:
    if request.param == "memory":
        made: CheckpointStore = MemoryCheckpointStore()
    else:
        made = SQLiteCheckpointStore(tmp_path / "loops.db", synchronous="NORMAL")
    yield made
    await made.aclose()


async def measure(store: CheckpointStore, messages: int) -> dict[str, Any]:
    """Run a loop whose history reaches `messages`; return the stored bytes by stage and in total."""
    turns = turns_for(messages)
    script = [
        Message.assistant(tool_calls=[ToolCall(id=f"call-{n}", name="fetch", arguments={"page": n})])
        for n in range(turns)
    ]
    events = Events()
    stage_of: dict[int, str] = {}

    def on_saved(event: Event) -> None:
        if event.name == "checkpoint.saved":
            stage_of[event.data["step"]] = event.data["stage"]

    events.subscribe(on_saved)
    run_id = f"doc-{messages}"
    result = await run_tool_loop(
        ScriptedModel([*script, Message.assistant("read it all")]),
        registry,
        [Message.user("Read the whole document.")],
        run_id=run_id,
        checkpoints=store,
        checkpoint_key=KEY,
        max_steps=turns + 1,
        events=events,
    )
    assert result.status == "done" and len(result.messages) == messages
    rows = await store.history(run_id)
    sizes: dict[str, list[int]] = {"model": [], "tools": []}
    for row in rows:
        if stage_of[row.step] in sizes:
            sizes[stage_of[row.step]].append(len(row.payload))
    calls = [len(rec.payload) for rec in await store.calls(run_id)]
    return {
        "model": statistics.mean(sizes["model"]),
        "tools": statistics.mean(sizes["tools"]),
        "largest": max(len(row.payload) for row in rows),
        "total": sum(len(row.payload) for row in rows),
        "calls_per_turn": sum(calls) / (turns + 1),
    }


async def test_checkpoint_size_per_stage_is_flat_and_total_storage_grows_linearly(store):
    # Given loops whose histories reach 10, 100 and 1,000 messages (one ~100-byte tool result per turn)
    sizes = {n: await measure(store, n) for n in (10, 100, 1000)}
    report = {n: {k: round(v, 1) for k, v in s.items()} for n, s in sizes.items()}
    print(json.dumps(report, indent=1))
    # Then one model checkpoint and one tools checkpoint cost the same at 1,000 messages as at 10
    for stage in ("model", "tools"):
        assert sizes[1000][stage] <= 1.5 * sizes[10][stage], (stage, report)
    # And no single checkpoint holds the whole conversation
    assert sizes[1000]["largest"] <= 1.5 * sizes[10]["largest"], report
    # And the total stored grows linearly: ten times the messages, about ten times the bytes
    assert sizes[1000]["total"] / sizes[100]["total"] < 12, report
    assert sizes[1000]["total"] > 1000 * len(RESULT), report  # every tool result is really stored
    # And so do the call-log records (one model marker plus a started and a done record per turn)
    assert sizes[1000]["calls_per_turn"] <= 1.5 * sizes[10]["calls_per_turn"], report
