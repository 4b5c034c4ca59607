"""Forking a durable pydantic-ai agent's run: a new run from one of its stages, with the history up to it.

The order agent of `_kit.agents`: its checkpoints are the prompt (step 0), then a model stage
and a tools stage in turn; step 3 holds the response that asks for ``lookup_order`` and
``charge``, the last step the output.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _kit.agents import EXPECTED, PROMPT, Receipt, durable, make_agent
from _kit.stores import StoreSetup
from _kit.tickets import Ledger
from _kit.workers import advance_all
from agentkit import KEY

from agentflow import RunStatus
from agentflow.errors import CheckpointNotFound, FlowError
from agentflow.exec.run.read import read_run
from agentflow.integrations.pydantic_ai import AgentRunner

#: The stage whose response asks for lookup_order("A1") and charge("A1", 90).
ASKS_TO_CHARGE = 3


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.jsonl")


@pytest.fixture
async def runner(store_setup: StoreSetup, ledger: Ledger) -> AgentRunner:
    """A runner of the order agent over the store, with a finished run ``order-1``."""
    made = durable(make_agent(ledger)).runner(store_setup.open(), KEY, owner="w1")
    assert (await made.run(PROMPT, run_id="order-1")).output == EXPECTED
    return made


async def test_a_fork_goes_on_from_the_stage_it_is_taken_at_with_the_history_up_to_it(
    runner: AgentRunner, ledger: Ledger, store_setup: StoreSetup
) -> None:
    source = await runner.read("order-1")
    # When the run is forked at the stage whose response asks for the charge
    forked = await runner.fork("order-1", at_step=ASKS_TO_CHARGE, new_run_id="order-2", operator="erin")
    # Then the new run starts from that stage's messages, runs the tools of that response (new calls, with
    # the new run's keys) and asks the model once more, to the same output
    assert forked.status == RunStatus.DONE and forked.output == EXPECTED and isinstance(forked.output, Receipt)
    assert ledger.counts("order-2") == {"lookup_order": 1, "charge": 1}
    assert forked.model_calls == 3  # the two requests of the history it started from, and one of its own
    assert forked.messages[:4] == source.messages[:4]
    # And its step 0 names where it came from, signed
    assert runner.sealer is not None
    report = await read_run(store_setup.open(), runner.sealer, "order-2")
    assert report.forked_from is not None
    assert (report.forked_from.run_id, report.forked_from.step, report.forked_from.operator) == ("order-1", 3, "erin")
    # And the source run is not touched
    assert (await runner.read("order-1")).step == source.step


async def test_a_fork_of_the_last_stage_ends_with_the_same_output_and_runs_nothing(
    runner: AgentRunner, ledger: Ledger
) -> None:
    last = (await runner.read("order-1")).step
    assert last is not None
    forked = await runner.fork("order-1", at_step=last, new_run_id="order-3")
    assert forked.status == RunStatus.DONE and forked.output == EXPECTED
    assert ledger.counts("order-3") == {}


async def test_a_fork_saved_for_a_worker_is_carried_on_by_advance(runner: AgentRunner, ledger: Ledger) -> None:
    # Given a fork whose step 0 alone is saved (as the client does, for a worker)
    saved = await runner.fork("order-1", at_step=0, new_run_id="order-4", max_supersteps=0)
    assert saved.status == RunStatus.RUNNING and saved.step == 0
    # When a worker advances it stage by stage
    result = await advance_all(runner, "order-4")
    # Then it is the whole run again, from the prompt
    assert result.output == EXPECTED and result.model_calls == 3
    assert ledger.counts("order-4") == {"model": 3, "lookup_order": 1, "charge": 1}


async def test_an_agent_fork_takes_no_patch_and_names_a_missing_step(runner: AgentRunner) -> None:
    with pytest.raises(FlowError, match="an agent run's fork starts from the checkpoint's messages as they are"):
        await runner.fork("order-1", at_step=1, new_run_id="order-5", patch={"prompt": "other"})
    with pytest.raises(CheckpointNotFound):
        await runner.fork("order-1", at_step=99, new_run_id="order-5")
