"""A tool loop's ``tools`` stage stores its last call's ``done`` with the stage's checkpoint, in one write.

The rule is the flows' (`CallLog.closes_with`): a stage's calls run one after another and
only their tool messages follow the last one, so that call's ``done`` goes with the
checkpoint (`save_after_calls`) and every other record is stored at once. A stage costs 4
writes instead of 5. A crash before that one write leaves the last call in doubt, exactly
as a crash inside the tool would: an idempotent tool runs again, any other waits for a
decision. Each test runs on every store set-up (`_kit.stores`); writes are counted through
`_kit.faults.FaultyStore`, whose crashes are `Crash` (a BaseException the loop cannot catch).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from _kit.faults import FaultyStore, WriteLog, body
from _kit.stores import StoreSetup
from _kit.tickets import Crash, Ledger

from agentflow import Registry, RunStatus
from agentflow.errors import CheckpointTooLarge
from agentflow.exec import LoopRunner, recover_tool_loop, run_tool_loop
from agentflow.exec.checkpoints import CheckpointStore, RecoveryNeedsDecision
from agentflow.models import Message, ScriptedModel, ToolCall

KEY = b"loop-done-with-checkpoint-key-0123456789"
LEDGER = Ledger()
#: Tools whose next run waits on this event after its side effect (ENTERED is set when it is there).
GATES: dict[str, asyncio.Event] = {}
ENTERED: dict[str, asyncio.Event] = {}
REGISTRY = Registry()


@REGISTRY.tool(idempotent=True)
async def weather(city: str) -> str:
    """The weather in a city (safe to repeat)."""
    LEDGER.record("weather")
    return f"{city}: 12C, rain"


@REGISTRY.tool
async def book(city: str, nights: int) -> str:
    """Book a hotel (not idempotent)."""
    LEDGER.record("book")
    gate = GATES.pop("book", None)
    if gate is not None:
        ENTERED["book"].set()
        await gate.wait()
    return f"booked {nights} nights in {city}"


@REGISTRY.tool
async def export(part: int) -> str:
    """Export a large part of a report (not idempotent)."""
    LEDGER.record("export")
    return f"{part}:" + "r" * 40_000


@pytest.fixture(autouse=True)
def _reset() -> None:
    LEDGER.clear()
    GATES.clear()
    ENTERED.clear()


def ask(*calls: tuple[str, dict[str, Any]]) -> Message:
    """A reply asking for the tool calls ``(tool, arguments)``, in order."""
    return Message.assistant(
        tool_calls=[ToolCall(id=f"c{i}", name=name, arguments=args) for i, (name, args) in enumerate(calls)]
    )


WEATHER = ("weather", {"city": "Oslo"})
BOOK = ("book", {"city": "Oslo", "nights": 2})


async def run(model: ScriptedModel, store: CheckpointStore, run_id: str = "trip") -> Any:
    messages = [Message.user("Plan my trip to Oslo")]
    return await run_tool_loop(model, REGISTRY, messages, run_id=run_id, checkpoints=store, checkpoint_key=KEY)


async def recover(model: ScriptedModel, store: CheckpointStore, **kw: Any) -> Any:
    return await recover_tool_loop(model, REGISTRY, "trip", checkpoints=store, checkpoint_key=KEY, **kw)


async def kinds(store: CheckpointStore, run_id: str = "trip") -> list[tuple[str, str]]:
    """The run's call records as ``(kind, tool or model)``, in log order."""
    tools = {}
    out = []
    for record in await store.calls(run_id):
        fields = body(record)
        if record.kind == "started":
            tools[fields["call_id"]] = "model" if fields.get("model") else fields["tool"]
        out.append((record.kind, tools[fields["call_id"]]))
    return out


async def test_each_stages_done_goes_with_its_checkpoint_in_one_write(store_setup: StoreSetup) -> None:
    # Given a loop of two stages, each one call of a tool, then an answer
    store = WriteLog(store_setup.raw)
    model = ScriptedModel([ask(WEATHER), ask(BOOK), Message.assistant("Booked, bring a coat.")])
    # When it runs
    result = await run(model, store)
    # Then each stage wrote 4 times: the model's marker and its reply, the call's `started`,
    # and its `done` together with the tool results' checkpoint
    assert result.status == RunStatus.DONE

    def stage(reply: int) -> list[str]:
        return ["record:started", f"save:{reply}", "record:started", f"both:done:{reply + 1}"]

    assert store.methods == ["save:0", *stage(1), *stage(3), "record:started", "save:5"]
    # And the log and the checkpoints read back whole, each call done once
    assert await kinds(store_setup.raw) == [
        ("started", "model"), ("started", "weather"), ("done", "weather"),
        ("started", "model"), ("started", "book"), ("done", "book"), ("started", "model"),
    ]  # fmt: skip
    again = await LoopRunner(None, REGISTRY, checkpoints=store_setup.raw, checkpoint_key=KEY).read("trip")
    assert again.messages == result.messages and LEDGER.counts() == {"weather": 1, "book": 1}


async def test_only_the_last_call_of_a_stage_holds_its_done(store_setup: StoreSetup) -> None:
    # Given a reply asking for two calls, weather then book
    store = WriteLog(store_setup.raw)
    # When the loop runs them
    result = await run(ScriptedModel([ask(WEATHER, BOOK), Message.assistant("Booked.")]), store)
    # Then weather's `done` is stored as soon as it returns; book's goes with the checkpoint
    assert result.status == RunStatus.DONE
    assert store.methods[3:7] == ["record:started", "record:done", "record:started", "both:done:2"]


@pytest.mark.parametrize("when", ["before", "after"])
async def test_a_crash_around_the_stages_one_write_leaves_the_last_call_in_doubt_or_finished(
    store_setup: StoreSetup, when: str
) -> None:
    # Given a worker that dies just before (or just after) book's `done` and the stage's
    # checkpoint are stored, after book's side effect happened
    store = FaultyStore(store_setup.raw).crash("done", tool="book", when=when)
    with pytest.raises(Crash):
        await run(ScriptedModel([ask(BOOK), Message.assistant("never used")]), store)
    assert LEDGER.counts() == {"book": 1}
    latest = await store_setup.raw.latest("trip")
    other = store_setup.open()
    if when == "after":
        # Then after the write both are stored: a recovery replays book and never runs it again
        assert latest.step == 2 and ("done", "book") in await kinds(store_setup.raw)
        result = await recover(ScriptedModel([Message.assistant("Booked.")]), other)
        assert result.status == RunStatus.DONE and LEDGER.counts() == {"book": 1}
        return
    # Then before it neither is: the stage's checkpoint is the reply's, book has no `done`
    assert latest.step == 1 and await kinds(store_setup.raw) == [("started", "model"), ("started", "book")]
    # And book is in doubt: a recovery asks for a decision and runs nothing
    with pytest.raises(RecoveryNeedsDecision) as caught:
        await recover(ScriptedModel([Message.assistant("never used")]), other)
    assert [tool for tool, _ in caught.value.calls] == ["book"]
    assert LEDGER.counts() == {"book": 1}
    # And only the operator's word runs it again
    result = await recover(ScriptedModel([Message.assistant("Booked.")]), other, rerun_in_doubt=True)
    assert result.status == RunStatus.DONE and LEDGER.counts() == {"book": 2}


async def test_an_idempotent_last_call_whose_done_was_lost_runs_again_without_a_decision(
    store_setup: StoreSetup,
) -> None:
    # Given a worker that dies after weather ran, before its `done` and the checkpoint were stored
    store = FaultyStore(store_setup.raw).crash("done", tool="weather")
    with pytest.raises(Crash):
        await run(ScriptedModel([ask(WEATHER)]), store)
    # When another worker recovers the loop
    result = await recover(ScriptedModel([Message.assistant("Rain.")]), store_setup.open())
    # Then weather (idempotent, in doubt) ran again, as after a crash inside it
    assert result.status == RunStatus.DONE and LEDGER.counts() == {"weather": 2}
    assert [cid.split("/")[1:3] for cid in result.rerun] == [["tools", "0"]]


async def test_a_cancel_seen_after_the_last_call_stores_its_done_before_the_loop_ends(store_setup: StoreSetup) -> None:
    # Given a loop whose worker is inside book, the stage's last call
    release, entered = asyncio.Event(), asyncio.Event()
    GATES["book"], ENTERED["book"] = release, entered
    operator = LoopRunner(None, REGISTRY, checkpoints=store_setup.raw, checkpoint_key=KEY)
    running = asyncio.create_task(run(ScriptedModel([ask(BOOK), Message.assistant("never used")]), store_setup.raw))
    await asyncio.wait_for(entered.wait(), 10)
    # When it is cancelled while book runs
    asked = await operator.cancel("trip", reason="trip called off", operator="erin")
    assert asked.status == RunStatus.RUNNING
    release.set()
    # Then book finishes, its `done` is stored on its own, and the loop ends cancelled
    result = await asyncio.wait_for(running, 10)
    assert result.status == RunStatus.CANCELLED and LEDGER.counts() == {"book": 1}
    assert ("done", "book") in await kinds(store_setup.raw)


async def test_a_stage_checkpoint_over_the_limit_still_stores_its_last_done(store_setup: StoreSetup) -> None:
    # Given a loop whose checkpoints may be 64 KiB at most, and a reply asking for two 40 kB exports
    model = ScriptedModel([ask(("export", {"part": 1}), ("export", {"part": 2}))])
    runner = LoopRunner(
        model, REGISTRY, checkpoints=store_setup.raw, checkpoint_key=KEY, max_checkpoint_bytes=64 * 1024
    )
    # When the tool results' checkpoint comes out over the limit
    with pytest.raises(CheckpointTooLarge):
        await runner.run([Message.user("Export the report")], run_id="trip", max_steps=4)
    # Then it was not stored, but both exports' `done` records were
    assert (await store_setup.raw.latest("trip")).step == 1
    assert [k for k, tool in await kinds(store_setup.raw) if tool == "export"] == ["started", "done"] * 2
    # And a worker with the default limit replays both: neither export runs twice
    result = await recover(ScriptedModel([Message.assistant("Exported.")]), store_setup.open())
    assert result.status == RunStatus.DONE and LEDGER.counts() == {"export": 2}
    assert [cid.split("/")[1:3] for cid in result.replayed] == [["tools", "0"], ["tools", "1"]]
