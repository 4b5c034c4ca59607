"""Forking a tool loop: a new loop from one of its stages, with the messages up to it.

The loop of these tests asks for ``book`` (not idempotent) and then answers; its model is
stateless (its reply depends on the history alone), so a fork's model picks up where the
source stood. Checkpoints: step 0 the prompt, step 1 the reply asking for ``book``, step 2
the tool's result, step 3 the answer (done).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from _kit.stores import StoreSetup
from _kit.tickets import Ledger
from _kit.workers import advance_all

from agentflow import Registry, RunStatus
from agentflow.errors import CheckpointNotFound, FlowError
from agentflow.exec import LoopRunner
from agentflow.exec.run.read import read_run
from agentflow.models import Message, ToolCall

KEY = b"loop-fork-tests-key-0123456789abcdef"
PROMPT = "Book two nights in Oslo"
#: The checkpoint that holds the reply asking for `book` (its call not run yet).
ASKS_TO_BOOK = 1


class BookingModel:
    """Asks for ``book`` once, then answers with the booking."""

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> Message:
        self.calls += 1
        results = [m.content for m in messages if m.role == "tool"]
        if not results:
            book = ToolCall(id="c1", name="book", arguments={"city": "Oslo", "nights": 2})
            return Message.assistant(tool_calls=[book])
        return Message.assistant(f"done: {results[-1]}")


@pytest.fixture
def ledger() -> Ledger:
    return Ledger()


@pytest.fixture
async def model() -> BookingModel:
    return BookingModel()


@pytest.fixture
async def loop(store_setup: StoreSetup, ledger: Ledger, model: BookingModel) -> LoopRunner:
    """A runner of the booking loop with a finished loop ``trip-1``."""
    registry = Registry()

    @registry.tool
    async def book(city: str, nights: int) -> str:
        """Book a hotel (not idempotent)."""
        from agentflow.exec import current_call

        ledger.record("book", current_call().run_id)
        return f"booked {nights} nights in {city}"

    made = LoopRunner(model, registry, checkpoints=store_setup.open(), checkpoint_key=KEY, name="trips", owner="w1")
    assert (await made.run([Message.user(PROMPT)], run_id="trip-1")).status == RunStatus.DONE
    model.calls = 0
    return made


async def test_a_loop_fork_goes_on_from_the_stage_it_is_taken_at_with_the_messages_up_to_it(
    loop: LoopRunner, ledger: Ledger, model: BookingModel, store_setup: StoreSetup
) -> None:
    source = await loop.read("trip-1")
    # When the loop is forked at the reply that asks for book
    forked = await loop.fork("trip-1", at_step=ASKS_TO_BOOK, new_run_id="trip-2", operator="erin")
    # Then the new loop starts from that reply: it runs book (a new call, under its own id) and asks the
    # model once, to the same answer
    assert forked.status == RunStatus.DONE and forked.text == source.text == "done: booked 2 nights in Oslo"
    assert forked.messages[:2] == source.messages[:2] and model.calls == 1
    assert ledger.by_run()[("book", "trip-2")] == 1 and ledger.by_run()[("book", "trip-1")] == 1
    assert forked.model_calls == 2  # the source's first call and its own
    # And its step 0 names where it came from, signed
    assert loop.sealer is not None
    report = await read_run(store_setup.open(), loop.sealer, "trip-2")
    assert report.forked_from is not None
    assert (report.forked_from.run_id, report.forked_from.step, report.forked_from.operator) == ("trip-1", 1, "erin")


async def test_a_fork_of_an_ended_loop_ends_with_its_answer_and_asks_nothing(
    loop: LoopRunner, ledger: Ledger, model: BookingModel
) -> None:
    last = (await loop.read("trip-1")).step
    assert last is not None
    forked = await loop.fork("trip-1", at_step=last, new_run_id="trip-3")
    assert forked.status == RunStatus.DONE and forked.text == "done: booked 2 nights in Oslo"
    assert model.calls == 0 and ledger.by_run()[("book", "trip-3")] == 0


async def test_a_loop_fork_saved_for_a_worker_is_carried_on_by_advance(loop: LoopRunner, ledger: Ledger) -> None:
    # Given a fork of the first stage whose step 0 alone is saved (as the client does, for a worker)
    saved = await loop.fork("trip-1", at_step=0, new_run_id="trip-4", max_supersteps=0)
    assert saved.status == RunStatus.RUNNING and saved.step == 0
    # When a worker advances it stage by stage
    result = await advance_all(loop, "trip-4")
    # Then it is the whole loop again, from the prompt
    assert result.text == "done: booked 2 nights in Oslo" and ledger.by_run()[("book", "trip-4")] == 1


async def test_a_loop_fork_takes_no_patch_and_names_a_missing_step(loop: LoopRunner) -> None:
    with pytest.raises(FlowError, match="a tool loop's fork starts from the checkpoint's messages as they are"):
        await loop.fork("trip-1", at_step=1, new_run_id="trip-5", patch={"city": "Bergen"})
    with pytest.raises(CheckpointNotFound):
        await loop.fork("trip-1", at_step=99, new_run_id="trip-5")


async def test_a_loop_fork_gets_a_loop_id_of_its_own_by_default(loop: LoopRunner) -> None:
    forked = await loop.fork("trip-1", at_step=0, max_supersteps=0)
    assert forked.run_id.startswith("loop-") and forked.run_id != "trip-1"
