"""The durable tool loop in one process: stages, checkpoints, tool errors, max_steps, recovery,
tampering, approvals. Each test runs on every store set-up (`_kit.stores`).

A worker's death is simulated with `Crash`, a BaseException: the loop cannot catch it and
write anything after it, so the store is left as a killed process would leave it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from _kit.faults import FaultyStore
from _kit.stores import StoreSetup
from _kit.tickets import Crash, Ledger

from agentflow import Event, Events, Registry, RunContext
from agentflow.errors import IdentityMismatch
from agentflow.exec import LoopResult, LoopRunner, recover_tool_loop, run_tool_loop
from agentflow.exec.checkpoints import (
    CheckpointConflict,
    CheckpointStore,
    CheckpointStoreCorrupt,
    RecoveryNeedsDecision,
)
from agentflow.models import Message, ScriptedModel, ToolCall

KEY = b"tool-loop-tests-key-0123456789abcdef"
assert len(KEY) >= 32


# -- tools ----------------------------------------------------------------------------------

#: Every real side effect of the tools.
LEDGER = Ledger()
#: Tools that raise `Crash` on their next run, right after their side effect.
CRASH_IN: set[str] = set()
#: Tools whose next run blocks on this event, right after its side effect (set ENTERED[name] first).
GATES: dict[str, asyncio.Event] = {}
ENTERED: dict[str, asyncio.Event] = {}


def effect(name: str, result: str) -> str:
    LEDGER.record(name)
    if name in CRASH_IN:
        CRASH_IN.discard(name)
        raise Crash(f"the worker died inside {name}")
    return result


REGISTRY = Registry()


@REGISTRY.tool(idempotent=True)
async def weather(city: str) -> str:
    """The weather in a city (safe to repeat)."""
    await asyncio.sleep(0.01 if city == "Oslo" else 0)  # the first call is the slow one
    return effect("weather", f"{city}: 12C, rain")


@REGISTRY.tool
async def book(city: str, nights: int) -> str:
    """Book a hotel (not idempotent)."""
    return effect("book", f"booked {nights} nights in {city}")


@REGISTRY.tool(idempotent=True)
async def slow_search(query: str) -> str:
    """A search a test can hold open (idempotent)."""
    result = effect("slow_search", f"3 hits for {query}")
    gate = GATES.pop("slow_search", None)
    if gate is not None:
        ENTERED["slow_search"].set()
        await gate.wait()
    return result


@REGISTRY.tool
async def broken(city: str) -> str:
    """A tool that always fails."""
    raise ValueError(f"no hotel data for {city}")


@REGISTRY.tool(approval=True)
async def pay(amount: int) -> str:
    """Pay (always needs approval; not idempotent)."""
    return effect("pay", f"paid {amount} EUR")


@REGISTRY.tool(approval=lambda args, ctx: args["amount"] > 100)
async def refund(amount: int) -> str:
    """Refund (amounts over 100 need approval)."""
    return effect("refund", f"refunded {amount} EUR")


@pytest.fixture(autouse=True)
def _reset() -> None:
    LEDGER.clear()
    CRASH_IN.clear()
    GATES.clear()
    ENTERED.clear()


# -- stores ---------------------------------------------------------------------------------


@pytest.fixture
def store(store_setup: StoreSetup) -> CheckpointStore:
    """The first worker's store, over each store set-up in turn."""
    return store_setup.raw


@pytest.fixture
def other(store_setup: StoreSetup) -> CheckpointStore:
    """The store as another worker sees it: the same object in memory, a new store object elsewhere."""
    return store_setup.open()


async def tamper(setup: StoreSetup, run_id: str, step: int, payload: bytes | None) -> None:
    """Change a stored checkpoint's payload, or delete the checkpoint (payload None), behind the store's back."""
    row = next(c for c in await setup.history(run_id) if c.step == step)
    if payload is None:
        await setup.rows.drop_checkpoint(row)
    else:
        await setup.rows.put_checkpoint(row, dataclasses.replace(row, payload=payload))


# -- helpers --------------------------------------------------------------------------------


def ask(*calls: tuple[str, str, dict[str, Any]]) -> Message:
    """An assistant reply asking for tool calls ``(id, tool, arguments)``."""
    return Message.assistant(tool_calls=[ToolCall(id=cid, name=name, arguments=args) for cid, name, args in calls])


def answer(text: str) -> Message:
    return Message.assistant(text)


def crash_model(*_: Any) -> Message:
    raise Crash("the worker died while the model was thinking")


def roles(result: LoopResult) -> list[str]:
    return [m.role for m in result.messages]


def saved(events: Events) -> list[Event]:
    """Collect the checkpoint.saved events of `events` into a list."""
    out: list[Event] = []
    events.subscribe(lambda e: out.append(e) if e.name == "checkpoint.saved" else None)
    return out


def trace(events: Events) -> list[str]:
    """Collect ``saved:<stage>`` and ``tool:<name>:<started|finished>`` in the order they happened."""
    out: list[str] = []

    def on(e: Event) -> None:
        if e.name == "checkpoint.saved":
            out.append(f"saved:{e.data['stage']}")
        elif e.name in ("tool.started", "tool.finished"):
            out.append(f"tool:{e.data['tool']}:{e.name.split('.')[1]}")

    events.subscribe(on)
    return out


def kind(outcome: object) -> str:
    """``CheckpointConflict`` for any conflict (a held run's `RunHeld` too), else the outcome's type name."""
    return "CheckpointConflict" if isinstance(outcome, CheckpointConflict) else type(outcome).__name__


def past_lease(store: CheckpointStore) -> FaultyStore:
    """`store` as a worker sees it once a frozen rival's lease lapsed: its lease takes are granted."""
    wrapped = FaultyStore(store)
    wrapped.rivals_lapsed = True
    return wrapped


async def run(model: Any, store: CheckpointStore, run_id: str = "chat-1", **kw: Any) -> LoopResult:
    messages = kw.pop("messages", [Message.user("Plan my trip to Oslo")])
    return await run_tool_loop(model, REGISTRY, messages, run_id=run_id, checkpoints=store, checkpoint_key=KEY, **kw)


async def recover(model: Any, store: CheckpointStore, run_id: str = "chat-1", **kw: Any) -> LoopResult:
    return await recover_tool_loop(model, REGISTRY, run_id, checkpoints=store, checkpoint_key=KEY, **kw)


WEATHER = ("c1", "weather", {"city": "Oslo"})
BOOK = ("c2", "book", {"city": "Oslo", "nights": 2})
PAY = ("c3", "pay", {"amount": 300})


# -- one round ------------------------------------------------------------------------------


async def test_loop_with_one_tool_round_finishes_with_the_right_history(store):
    # Given a model that asks for the weather once, then answers
    model = ScriptedModel([ask(WEATHER), answer("Pack a raincoat.")])
    # When the loop runs
    result = await run(model, store)
    # Then the history is user, assistant (the call), tool (its result), assistant (the answer)
    assert result.status == "done"
    assert roles(result) == ["user", "assistant", "tool", "assistant"]
    tool_message = result.messages[2]
    assert (tool_message.content, tool_message.tool_call_id, tool_message.name) == ("Oslo: 12C, rain", "c1", "weather")
    assert result.text == "Pack a raincoat."
    assert result.model_calls == model.calls == 2
    # And the model saw the tool's result before it answered
    assert model.seen[1][-1] == tool_message


async def test_history_is_checkpointed_after_each_model_reply_and_after_the_tool_results(store):
    # Given a loop with one tool round, watched through its events
    events = Events()
    saves, order = saved(events), trace(events)
    model = ScriptedModel([ask(WEATHER), answer("Pack a raincoat.")])
    # When it runs
    await run(model, store, events=events)
    # Then step 0 holds the start, then one checkpoint per reply and one after the tool results
    rows = await store.history("chat-1")
    assert [r.status for r in rows] == ["running", "running", "running", "done"]
    assert [r.step for r in rows] == [0, 1, 2, 3]
    assert [(e.data["kind"], e.data["step"], e.data["stage"], e.data["status"]) for e in saves] == [
        ("loop", 0, "start", "running"),
        ("loop", 1, "model", "running"),
        ("loop", 2, "tools", "running"),
        ("loop", 3, "model", "done"),
    ]
    assert all(r.flow == "loop:tool_loop" for r in rows)
    # And the reply was saved (its tool calls pinned) before the tool ran, and the results after it finished
    assert order == [
        "saved:start",
        "saved:model",
        "tool:weather:started",
        "tool:weather:finished",
        "saved:tools",
        "saved:model",
    ]


async def test_several_tool_calls_in_one_reply_all_run_and_come_back_in_order(store):
    # Given a reply asking for three calls (the first one is the slowest)
    calls: list[tuple[str, str, dict[str, Any]]] = [
        ("a", "weather", {"city": "Oslo"}),
        ("b", "weather", {"city": "Rome"}),
        BOOK,
    ]
    model = ScriptedModel([ask(*calls), answer("Done.")])
    # When the loop runs
    result = await run(model, store)
    # Then every call ran once and its result follows the reply in the order the calls were asked
    assert LEDGER.counts() == {"weather": 2, "book": 1}
    tool_messages = result.messages[2:5]
    assert [(m.tool_call_id, m.name, m.content) for m in tool_messages] == [
        ("a", "weather", "Oslo: 12C, rain"),
        ("b", "weather", "Rome: 12C, rain"),
        ("c2", "book", "booked 2 nights in Oslo"),
    ]
    assert roles(result) == ["user", "assistant", "tool", "tool", "tool", "assistant"]


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (("x", "teleport", {"to": "Oslo"}), "no tool named 'teleport'"),
        (("x", "book", {"city": "Oslo", "nights": "many"}), "nights"),
        (("x", "book", {"city": "Oslo"}), "nights"),
    ],
    ids=["unknown-tool", "bad-type", "missing-argument"],
)
async def test_unknown_tool_or_bad_arguments_come_back_to_the_model_as_an_error_message(store, call, says):
    # Given a model that asks for a tool that does not exist, or with arguments that do not fit
    model = ScriptedModel([ask(call), answer("Sorry, let me fix that.")])
    # When the loop runs
    result = await run(model, store)
    # Then the run goes on: the model gets an "error: ..." tool message and answers
    assert result.status == "done"
    error = result.messages[2]
    assert error.role == "tool" and error.tool_call_id == "x"
    assert error.content.startswith("error: ") and says in error.content
    assert model.seen[1][-1] == error
    assert LEDGER.counts() == {}


# -- max_steps ------------------------------------------------------------------------------


async def test_max_steps_stops_a_model_that_never_stops_asking(store):
    # Given a model that asks for a tool on every turn
    model = ScriptedModel([ask(WEATHER)] * 10)
    # When the loop runs with max_steps=3
    result = await run(model, store, max_steps=3)
    # Then it stops after 3 model calls, failed, saying why
    assert result.status == "failed"
    assert "max_steps" in (result.error or "")
    assert model.calls == result.model_calls == 3
    assert (await store.latest("chat-1")).status == "failed"
    # And a failed loop cannot be recovered into more model calls
    with pytest.raises(CheckpointConflict):
        await recover(ScriptedModel([ask(WEATHER)] * 10), store)


@pytest.mark.parametrize("crash_on", [2, 3])
async def test_max_steps_counts_model_calls_across_recoveries(store, other, crash_on):
    # Given a loop with max_steps=4 whose worker dies inside its Nth model call
    first = ScriptedModel([ask(WEATHER)] * (crash_on - 1) + [crash_model])
    with pytest.raises(Crash):
        await run(first, store, max_steps=4)
    assert first.calls == crash_on
    # When a new worker recovers it with a fresh model that never stops asking
    second = ScriptedModel([ask(WEATHER)] * 10)
    result = await recover(second, other)
    # Then the model calls of both workers, the one cut off included, never exceed max_steps
    assert result.status == "failed" and "max_steps" in (result.error or "")
    assert first.calls + second.calls == 4
    assert result.model_calls == 4


async def test_max_steps_counts_model_calls_across_a_pause_and_resume(store):
    # Given a loop with max_steps=2 paused on its first reply
    paused = await run(ScriptedModel([ask(PAY)]), store, max_steps=2)
    assert paused.status == "paused" and paused.model_calls == 1
    # When it is resumed with a model that keeps asking
    second = ScriptedModel([ask(WEATHER)] * 5)
    result = await run_tool_loop(second, REGISTRY, run_id="chat-1", checkpoints=store, checkpoint_key=KEY, approve=True)
    # Then only one more model call is allowed
    assert result.status == "failed" and second.calls == 1 and result.model_calls == 2


# -- recovery -------------------------------------------------------------------------------


def crash_at_save(store: CheckpointStore, step: int, *, before: bool = False) -> FaultyStore:
    """The store, raising Crash right after step `step` is stored (or just before it, `before=True`)."""
    return FaultyStore(store).crash("save", step=step, when="before" if before else "after")


async def test_recovery_after_the_reply_was_saved_runs_the_tools_without_calling_the_model_again(store, other):
    # Given a worker that died right after the reply asking for two tools was saved (step 1)
    first = ScriptedModel([ask(WEATHER, BOOK), answer("never used")])
    with pytest.raises(Crash):
        await run(first, crash_at_save(store, 1))
    assert first.calls == 1 and LEDGER.counts() == {}
    # When a new worker recovers it with a model that only has the final answer
    second = ScriptedModel([answer("Booked, pack a raincoat.")])
    result = await recover(second, other)
    # Then the pinned calls ran, and the model was asked once, after their results
    assert result.status == "done"
    assert LEDGER.counts() == {"weather": 1, "book": 1}
    assert second.calls == 1 and result.model_calls == 2
    assert [m.role for m in second.seen[0]] == ["user", "assistant", "tool", "tool"]
    assert roles(result) == ["user", "assistant", "tool", "tool", "assistant"]
    assert result.text == "Booked, pack a raincoat."


async def test_finished_non_idempotent_tool_call_is_replayed_not_rerun_on_recovery(store, other):
    # Given a reply asking for book then weather, and a worker that dies inside weather after book finished
    CRASH_IN.add("weather")
    with pytest.raises(Crash):
        await run(ScriptedModel([ask(BOOK, WEATHER)]), store)
    assert LEDGER.counts() == {"book": 1, "weather": 1}
    # When a new worker recovers the loop
    events = Events()
    recovered: list[Event] = []
    events.subscribe(lambda e: recovered.append(e) if e.name == "run.recovered" else None)
    result = await recover(ScriptedModel([answer("All set.")]), other, events=events)
    # Then book's stored result is replayed, not run again; weather (idempotent, in doubt) runs again
    assert result.status == "done"
    assert LEDGER.counts() == {"book": 1, "weather": 2}
    assert [m.content for m in result.messages[2:4]] == ["booked 2 nights in Oslo", "Oslo: 12C, rain"]
    [event] = recovered
    assert event.data["kind"] == "loop"
    assert [cid.split("/")[1:3] for cid in event.data["replayed"]] == [["tools", "0"]]
    assert [cid.split("/")[1:3] for cid in event.data["rerun"]] == [["tools", "1"]]


async def test_result_of_a_recovered_loop_lists_the_replayed_and_rerun_calls(store, other):
    # Given a worker that died inside weather after book (the first call of the reply) finished
    CRASH_IN.add("weather")
    with pytest.raises(Crash):
        await run(ScriptedModel([ask(BOOK, WEATHER)]), store)
    # When a new worker recovers the loop to the end
    result = await recover(ScriptedModel([answer("All set.")]), other)
    # Then its result says what the recovery replayed and what it ran again, as a flow's result does
    assert result.status == "done"
    assert [cid.split("/")[1:3] for cid in result.replayed] == [["tools", "0"]]
    assert [cid.split("/")[1:3] for cid in result.rerun] == [["tools", "1"]]


async def test_started_non_idempotent_tool_without_a_result_needs_a_decision(store, other):
    # Given a worker that died inside book (its side effect may have happened)
    CRASH_IN.add("book")
    with pytest.raises(Crash):
        await run(ScriptedModel([ask(BOOK)]), store)
    steps = len(await store.history("chat-1"))
    # When a new worker recovers it
    with pytest.raises(RecoveryNeedsDecision) as caught:
        await recover(ScriptedModel([answer("never used")]), other)
    # Then it refuses before anything runs or is saved, naming the call in doubt
    assert [tool for tool, _ in caught.value.calls] == ["book"]
    assert LEDGER.counts() == {"book": 1}
    assert len(await store.history("chat-1")) == steps
    # And with rerun_in_doubt=True the call runs again and the loop finishes
    result = await recover(ScriptedModel([answer("Booked.")]), other, rerun_in_doubt=True)
    assert result.status == "done" and LEDGER.counts() == {"book": 2}


async def test_run_tool_loop_retried_for_a_loop_whose_worker_died_carries_it_on_as_recover_does(store):
    # Given a loop whose worker died inside its first model call (its latest checkpoint says running)
    with pytest.raises(Crash):
        await run(ScriptedModel([crash_model]), store)
    # When run_tool_loop is called again with its run id and messages (its caller retries the start)
    result = await run(ScriptedModel([answer("hi")]), store)
    # Then the loop goes on from its checkpoint to its end, the cut-off model call counted
    assert result.status == "done" and result.text == "hi" and result.model_calls == 2


async def test_run_tool_loop_given_only_the_id_of_a_running_loop_is_a_conflict_pointing_to_recover(store):
    # Given a loop whose worker died (its latest checkpoint says running)
    with pytest.raises(Crash):
        await run(ScriptedModel([crash_model]), store)
    # When run_tool_loop is called again with its run id and no messages
    with pytest.raises(CheckpointConflict) as caught:
        await run(ScriptedModel([answer("hi")]), store, messages=None)
    # Then it is refused and points to recover_tool_loop
    assert "recover_tool_loop" in str(caught.value)


async def test_two_workers_recovering_one_loop_exactly_one_wins(store, other):
    # Given a loop whose worker died inside its second model call, after one tool round
    with pytest.raises(Crash):
        await run(ScriptedModel([ask(WEATHER), crash_model]), store)
    # When two workers recover it at the same time
    models = [ScriptedModel([answer("Rain.")]), ScriptedModel([answer("Rain.")])]
    outcomes = await asyncio.gather(recover(models[0], store), recover(models[1], other), return_exceptions=True)
    # Then exactly one finishes it and the other gets CheckpointConflict (the run is held, or
    # ended); the model answered once
    assert sorted(kind(o) for o in outcomes) == ["CheckpointConflict", "LoopResult"], outcomes
    assert models[0].calls + models[1].calls == 1
    assert LEDGER.counts() == {"weather": 1}


async def test_cut_off_loop_worker_cannot_go_on_after_another_worker_took_the_loop(store, other):
    # Given worker A held inside a tool of the loop's first reply (the reply is saved)
    release, entered = asyncio.Event(), asyncio.Event()
    GATES["slow_search"], ENTERED["slow_search"] = release, entered
    model_a = ScriptedModel([ask(("s", "slow_search", {"query": "hotels"})), answer("A's answer")])
    worker_a = asyncio.create_task(run(model_a, store))
    await asyncio.wait_for(entered.wait(), 10)
    # When worker B, believing A dead (A's lease lapsed as if A froze), recovers the loop (the
    # idempotent search reruns) and finishes it
    result = await recover(ScriptedModel([answer("B's answer")]), past_lease(other))
    assert result.status == "done" and result.text == "B's answer"
    # Then A, once its tool returns, is refused by the store and never asks its model again
    release.set()
    with pytest.raises(CheckpointConflict):
        await asyncio.wait_for(worker_a, 10)
    assert model_a.calls == 1
    assert [r.status for r in await store.history("chat-1")][-1] == "done"
    assert (await store.history("chat-1"))[-1].step == result.step


class HoldBeforeModel:
    """A store wrapper that holds the worker just before it logs its Nth model call."""

    def __init__(self, inner: CheckpointStore, nth: int) -> None:
        self.inner, self.nth, self.in_process = inner, nth, inner.in_process
        self.local_key = getattr(inner, "local_key", None)
        self.entered, self.release = asyncio.Event(), asyncio.Event()
        self.markers = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def record_call(self, run_id: str, record: Any) -> None:
        if record.kind == "started" and b'"model":true' in record.payload:
            self.markers += 1
            if self.markers == self.nth:
                self.entered.set()
                await self.release.wait()
        await self.inner.record_call(run_id, record)


async def test_cut_off_loop_worker_is_fenced_before_its_next_model_call(store, other):
    # Given worker A, after one tool round was saved, about to log its second model call
    held = HoldBeforeModel(store, 2)
    model_a = ScriptedModel([ask(WEATHER), answer("A's answer")])
    worker_a = asyncio.create_task(run(model_a, held))
    await asyncio.wait_for(held.entered.wait(), 10)
    # When worker B recovers the loop meanwhile (A's lease lapsed as if A froze) and finishes it
    result = await recover(ScriptedModel([answer("B's answer")]), past_lease(other))
    assert result.status == "done"
    # Then A's model-call record is refused, so A never calls its model again
    held.release.set()
    with pytest.raises(CheckpointConflict):
        await asyncio.wait_for(worker_a, 10)
    assert model_a.calls == 1
    assert result.model_calls == 2 and LEDGER.counts() == {"weather": 1}


async def test_failed_tool_call_replayed_after_a_crash_reads_the_same_to_the_model(store, other):
    # Given the message the model gets when a tool fails in an uninterrupted loop
    failing = ("f", "broken", {"city": "Oslo"})
    clean = await run(ScriptedModel([ask(failing), answer("ok")]), store, run_id="clean")
    # And a loop whose worker died after the tool failed, before the tool results were saved (step 2)
    with pytest.raises(Crash):
        await run(ScriptedModel([ask(failing)]), crash_at_save(store, 2, before=True))
    # When a new worker recovers it (the failure is replayed from the call log, not rerun)
    result = await recover(ScriptedModel([answer("ok")]), other)
    # Then the model reads the same tool message as without the crash
    assert result.messages[2].content == clean.messages[2].content


async def test_denial_replayed_after_a_crash_reads_the_same_to_the_model(store, other):
    # Given a loop paused on pay, denied with a note by a worker that died before saving the tool results
    # (steps: 0 start, 1 reply, 2 paused, 3 the resume's claim, 4 the tool results)
    await run(ScriptedModel([ask(PAY)]), store)
    with pytest.raises(Crash):
        await run_tool_loop(
            ScriptedModel([]),
            REGISTRY,
            run_id="chat-1",
            checkpoints=crash_at_save(store, 4, before=True),
            checkpoint_key=KEY,
            approve=False,
            note="over budget",
        )
    # When a new worker recovers it
    result = await recover(ScriptedModel([answer("I did not pay.")]), other)
    # Then the denial the model reads still carries the note, as it would have without the crash
    assert result.status == "done" and LEDGER.counts() == {}
    assert result.messages[2].content == "denied: call of 'pay' was denied: over budget"


# -- tampering ------------------------------------------------------------------------------


async def crashed_after_one_round(store: CheckpointStore) -> None:
    """A loop that saved steps 0-2 (start, reply, tool results) and died in its second model call."""
    with pytest.raises(Crash):
        await run(ScriptedModel([ask(BOOK), crash_model]), store)


async def test_changed_byte_in_a_stored_message_is_corrupt_on_recover(store, other, store_setup):
    # Given a crashed loop whose tool-results checkpoint holds "booked 2 nights"
    await crashed_after_one_round(store)
    row = (await store.history("chat-1"))[2]
    assert b"booked 2 nights" in row.payload
    # When one byte of that stored message is changed
    await tamper(store_setup, "chat-1", 2, row.payload.replace(b"booked 2 nights", b"booked 9 nights"))
    # Then recovery refuses the history
    with pytest.raises(CheckpointStoreCorrupt):
        await recover(ScriptedModel([answer("never used")]), other)


async def test_deleted_middle_checkpoint_is_corrupt_on_recover(store, other, store_setup):
    # Given a crashed loop with checkpoints 0, 1 (the reply) and 2 (the tool results)
    await crashed_after_one_round(store)
    # When the middle checkpoint (the reply) is deleted from the store
    await tamper(store_setup, "chat-1", 1, None)
    # Then recovery sees the hole in the history
    with pytest.raises(CheckpointStoreCorrupt):
        await recover(ScriptedModel([answer("never used")]), other)


# -- approvals ------------------------------------------------------------------------------


async def test_tool_needing_approval_pauses_the_loop_with_a_pending_request(store, other):
    # Given a model that asks to pay (a tool that always needs approval)
    result = await run(ScriptedModel([ask(PAY)]), store)
    # Then the loop pauses before the tool runs, with the request pending
    assert result.status == "paused"
    assert [(p.tool, p.args) for p in result.pending] == [("pay", {"amount": 300})]
    assert LEDGER.counts() == {}
    assert (await store.latest("chat-1")).status == "paused"
    # And recovery gives it back as paused: nothing about it is in doubt
    again = await recover(ScriptedModel([]), other)
    assert again.status == "paused" and [p.call_id for p in again.pending] == [p.call_id for p in result.pending]


async def test_approval_policy_pauses_only_the_calls_it_picks(store):
    # Given a reply asking for a small and a large refund (the policy flags amounts over 100)
    model = ScriptedModel([ask(("s", "refund", {"amount": 20}), ("l", "refund", {"amount": 500}))])
    # When the loop runs
    result = await run(model, store)
    # Then only the large refund waits for approval
    assert result.status == "paused"
    assert [p.args for p in result.pending] == [{"amount": 500}]
    assert LEDGER.counts() == {"refund": 1}


async def test_resuming_an_approved_loop_through_run_tool_loop_runs_the_tool_once(store, other):
    # Given a loop paused on pay
    await run(ScriptedModel([ask(PAY)]), store)
    # When another worker resumes it through run_tool_loop with the same run id and approve=True
    model = ScriptedModel([answer("Paid.")])
    result = await run_tool_loop(model, REGISTRY, run_id="chat-1", checkpoints=other, checkpoint_key=KEY, approve=True)
    # Then the tool runs once and the model sees its result
    assert result.status == "done" and result.text == "Paid."
    assert LEDGER.counts() == {"pay": 1}
    assert [(m.role, m.content) for m in result.messages[-2:]] == [("tool", "paid 300 EUR"), ("assistant", "Paid.")]
    # And the decision cannot be spent twice: the loop ended
    with pytest.raises(CheckpointConflict):
        await run_tool_loop(model, REGISTRY, run_id="chat-1", checkpoints=store, checkpoint_key=KEY, approve=True)
    assert LEDGER.counts() == {"pay": 1}


async def test_denied_call_comes_back_to_the_model_as_a_denied_tool_message(store):
    # Given a loop paused on pay
    await run(ScriptedModel([ask(PAY)]), store)
    # When it is resumed with approve=False and a note
    model = ScriptedModel([answer("I did not pay.")])
    result = await run_tool_loop(
        model, REGISTRY, run_id="chat-1", checkpoints=store, checkpoint_key=KEY, approve=False, note="over budget"
    )
    # Then the tool never runs; the model reads a "denied" tool message and answers
    assert result.status == "done" and LEDGER.counts() == {}
    denied = model.seen[0][-1]
    assert denied.role == "tool" and denied.tool_call_id == "c3"
    assert denied.content.startswith("denied") and "over budget" in denied.content


async def test_per_call_decisions_approve_one_call_and_deny_another(store):
    # Given a loop paused on two large refunds
    paused = await run(ScriptedModel([ask(("a", "refund", {"amount": 200}), ("b", "refund", {"amount": 300}))]), store)
    first, second = (p.call_id for p in paused.pending)
    # When one is approved and the other denied, by call id
    result = await run_tool_loop(
        ScriptedModel([answer("One refund went out.")]),
        REGISTRY,
        run_id="chat-1",
        checkpoints=store,
        checkpoint_key=KEY,
        approve={first: True, second: False},
    )
    # Then exactly the approved one ran
    assert LEDGER.counts() == {"refund": 1}
    assert [m.content.split(":")[0] for m in result.messages[2:4]] == ["refunded 200 EUR", "denied"]


async def test_a_decision_is_spent_once_and_the_next_call_needing_approval_pauses_again(store):
    # Given a loop paused on pay, whose model will ask to pay again after the first payment
    await run(ScriptedModel([ask(PAY)]), store)
    # When it is approved
    model = ScriptedModel([ask(("c4", "pay", {"amount": 300})), answer("Paid twice.")])
    result = await run_tool_loop(model, REGISTRY, run_id="chat-1", checkpoints=store, checkpoint_key=KEY, approve=True)
    # Then the approval covered the first call only: the second, identical call waits for its own
    assert result.status == "paused" and LEDGER.counts() == {"pay": 1}
    assert [p.tool for p in result.pending] == ["pay"]
    result = await run_tool_loop(model, REGISTRY, run_id="chat-1", checkpoints=store, checkpoint_key=KEY, approve=True)
    assert result.status == "done" and LEDGER.counts() == {"pay": 2}


async def test_resuming_a_paused_loop_without_a_decision_leaves_it_paused(store):
    # Given a loop paused on pay
    await run(ScriptedModel([ask(PAY)]), store)
    # When run_tool_loop is called with its id and no decision
    result = await run_tool_loop(ScriptedModel([]), REGISTRY, run_id="chat-1", checkpoints=store, checkpoint_key=KEY)
    # Then it is still paused and nothing ran or was saved
    assert result.status == "paused" and LEDGER.counts() == {}
    assert [r.status for r in await store.history("chat-1")][-1] == "paused"


async def test_resume_of_a_paused_loop_for_another_user_is_refused(store):
    # Given a loop paused on pay, acting for ada
    await run(ScriptedModel([ask(PAY)]), store, ctx=RunContext(user="ada", thread="t1"))
    # When bob tries to approve it
    with pytest.raises(IdentityMismatch):
        await run_tool_loop(
            ScriptedModel([answer("x")]),
            REGISTRY,
            run_id="chat-1",
            checkpoints=store,
            checkpoint_key=KEY,
            approve=True,
            ctx=RunContext(user="bob"),
        )
    # Then nothing ran and the loop is still paused
    assert LEDGER.counts() == {} and (await store.latest("chat-1")).status == "paused"


class ReadEarlier:
    """The store as a worker saw it a moment ago: its checkpoints then, the call log now."""

    def __init__(self, inner: CheckpointStore, rows: list[Any]) -> None:
        self.inner, self.rows, self.in_process = inner, rows, inner.in_process
        self.local_key = getattr(inner, "local_key", None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def history(self, run_id: str) -> list[Any]:
        return self.rows

    async def latest(self, run_id: str) -> Any:
        return self.rows[-1]


async def test_a_resume_that_reads_the_log_after_a_rival_resume_took_the_loop_is_a_conflict(store):
    # Given a loop paused on pay, read (still paused) by a worker that is slow to go on
    await run(ScriptedModel([ask(PAY)]), store)
    paused_rows = list(await store.history("chat-1"))
    # and a rival resume that won the claim and died inside pay (logged `started`, no result)
    CRASH_IN.add("pay")
    with pytest.raises(Crash):
        await run_tool_loop(
            ScriptedModel([]), REGISTRY, run_id="chat-1", checkpoints=store, checkpoint_key=KEY, approve=True
        )
    assert LEDGER.counts() == {"pay": 1}
    # When the slow worker goes on from what it read, Then it is told another resume won
    # (not that a call is in doubt), and pay does not run again
    slow = ReadEarlier(store, paused_rows)
    with pytest.raises(CheckpointConflict, match="resumed by another worker"):
        await run_tool_loop(
            ScriptedModel([]), REGISTRY, run_id="chat-1", checkpoints=slow, checkpoint_key=KEY, approve=True
        )
    assert LEDGER.counts() == {"pay": 1}


async def test_crash_after_the_resume_save_is_recovered_by_spending_the_stored_decision(store, other):
    # Given a loop paused on pay (steps 0-2), resumed with approve=True by a worker that died right after
    # saving the decision with its claim (step 3), before the tool ran
    await run(ScriptedModel([ask(PAY)]), store)
    with pytest.raises(Crash):
        await run_tool_loop(
            ScriptedModel([]),
            REGISTRY,
            run_id="chat-1",
            checkpoints=crash_at_save(store, 3),
            checkpoint_key=KEY,
            approve=True,
        )
    assert LEDGER.counts() == {}
    # When a new worker recovers it
    result = await recover(ScriptedModel([answer("Paid.")]), other)
    # Then the stored decision is spent: the tool runs once and the loop finishes
    assert result.status == "done" and LEDGER.counts() == {"pay": 1}


# -- deciding without running (what a distributed resume does) -----------------------------


async def decide(store: CheckpointStore, approve: Any, **kw: Any) -> LoopResult:
    deciding = LoopRunner(None, REGISTRY, checkpoints=store, checkpoint_key=KEY)
    return await deciding.resume("chat-1", approve=approve, max_supersteps=0, **kw)


async def test_a_stored_decision_is_spent_by_the_next_worker_stage(store, other):
    # Given a loop paused on a large refund after a small one already ran in the same round
    refunds = ask(("s", "refund", {"amount": 20}), ("l", "refund", {"amount": 500}))
    assert (await run(ScriptedModel([refunds]), store)).status == "paused"
    # When the decision is stored without running anything
    decided = await decide(store, True, note="ok by ops")
    assert decided.status == "running" and LEDGER.counts() == {"refund": 1}
    # And a worker advances the loop from the step it names, one stage at a time
    model = ScriptedModel([answer("Refunded both.")])
    worker = LoopRunner(model, REGISTRY, checkpoints=other, checkpoint_key=KEY)
    step, result = decided.step, decided
    while result.status == "running":
        result = await worker.advance("chat-1", expected_step=step, handoff=True)
        step = result.step
    # Then the approved refund ran once, the earlier one was not run again, and the loop finished
    assert result.status == "done" and result.text == "Refunded both."
    assert LEDGER.counts() == {"refund": 2}
    # And going on from a stored decision is a handoff, not a recovery: no worker claimed a
    # segment of its own after the decision's
    after = [cp.segment for cp in await store.history("chat-1") if cp.step >= decided.step]
    assert len(after) > 1 and set(after) == {after[0]}
    assert [m.content for m in result.messages if m.role == "tool"] == ["refunded 20 EUR", "refunded 500 EUR"]


async def test_of_two_racing_decisions_one_wins(store, other):
    # Given a loop paused on pay
    await run(ScriptedModel([ask(PAY)]), store)
    # When two people decide at once, one approving and one denying
    outcomes = await asyncio.gather(decide(store, True), decide(other, False), return_exceptions=True)
    # Then exactly one decision is stored; the other is told the loop is held or no longer paused
    assert sorted(kind(o) for o in outcomes) == ["CheckpointConflict", "LoopResult"], outcomes
    assert LEDGER.counts() == {}


async def test_deciding_on_a_loop_that_is_not_paused_is_refused(store):
    # Given a loop that finished
    await run(ScriptedModel([answer("Hi.")]), store)
    # When a decision is given, Then it is refused, saying why, and nothing is saved
    before = len(await store.history("chat-1"))
    with pytest.raises(CheckpointConflict, match="not paused"):
        await decide(store, True)
    assert len(await store.history("chat-1")) == before
