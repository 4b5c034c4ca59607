"""A tool loop can wait: a waiting tool returns when to wake, and the loop holds nothing until then.

Every rule runs on every store set-up (the ``store_setup`` fixture); time is passed in (``now=``).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from agentflow import Registry, RunStatus
from agentflow.exec import LoopRunner, run_tool_loop
from agentflow.exec.run.timers import NotDue
from agentflow.exec.seal import Sealer
from agentflow.models import Message, ScriptedModel, ToolCall

KEY = b"k" * 32


def loop_tools() -> Registry:
    registry = Registry()

    @registry.tool(waits=True)
    async def check_back_in(hours: float) -> datetime:
        """Wait `hours` before the next step."""
        return datetime.now(UTC) + timedelta(hours=hours)

    return registry


def script() -> ScriptedModel:
    return ScriptedModel(
        [
            Message.assistant(tool_calls=[ToolCall(id="w1", name="check_back_in", arguments={"hours": 2})]),
            Message.assistant("Checked again: the parcel arrived."),
        ]
    )


async def test_a_loop_waits_until_its_waiting_tool_says_and_then_goes_on_once(store_setup):
    store, registry, model = store_setup.open(), loop_tools(), script()
    # When the model asks to check back in two hours
    paused = await run_tool_loop(model, registry, [Message.user("Has it arrived?")], run_id="l-1",
                                 checkpoints=store, checkpoint_key=KEY)  # fmt: skip
    # Then the loop waits, with its wake time signed into its checkpoint, and no model call is made meanwhile
    assert paused.status == RunStatus.PAUSED and model.calls == 1
    latest = (await store.history("l-1"))[-1]
    wake = Sealer(KEY).open_checkpoint(latest, "l-1")["wake"]
    assert wake["for"] == "timer" and wake["at"] > time.time() + 7000
    waker = LoopRunner(model, registry, checkpoints=store, checkpoint_key=KEY)
    with pytest.raises(NotDue):
        await waker.wake("l-1")
    # When the time comes, Then it goes on to its next model call, once
    done = await waker.wake("l-1", now=wake["at"] + 1)
    assert done.status == RunStatus.DONE and done.text == "Checked again: the parcel arrived." and model.calls == 2
    with pytest.raises(Exception, match="not waiting"):
        await waker.wake("l-1", now=wake["at"] + 2)


def test_a_waiting_tool_returns_a_datetime():
    registry = Registry()
    with pytest.raises(ValueError, match="-> datetime"):

        @registry.tool(waits=True)
        async def nap(hours: float) -> float:
            return hours
