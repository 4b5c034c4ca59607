"""A durable pydantic-ai agent's run (stored as ``loop:orders``) on the command line: listed, shown,
decided and recovered with the same commands as any run, through an app that registers the agent."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import runs_kit
from _kit.agents import PROMPT, charge_result, durable, make_agent
from _kit.tickets import Crash, Ledger, raise_crash

from agentflow import FlowApp
from agentflow.exec.checkpoints import SQLiteCheckpointStore

#: Every effect of the order agent in this process.
LEDGER = Ledger()
#: The kit's flows and the order agent as the loop ``orders`` (``--app test_cli_agents:app``).
app = FlowApp(runs_kit.registry, [runs_kit.refunds, runs_kit.shipping], loops={"orders": durable(make_agent(LEDGER))})


def cut_off(db: Path) -> None:
    """``agent-1``: an order agent run whose worker died inside charge (the card was charged)."""

    async def run() -> None:
        async with SQLiteCheckpointStore(db) as store:
            runner = durable(make_agent(LEDGER, die_in="charge", die=raise_crash)).runner(
                store, runs_kit.KEY, owner="dead", lease_s=0.05
            )
            with pytest.raises(Crash):
                await runner.run(PROMPT, run_id="agent-1")

    runs_kit.in_thread(run)


def test_an_agent_run_is_decided_and_recovered_from_the_command_line(agentflow, db):
    # Given an agent run cut off inside charge
    cut_off(db)
    # Then it is listed and shown like any run, its charge in doubt
    assert "agent-1" in agentflow("runs", "list", "--flow", "loop:orders").stdout
    shown = agentflow("runs", "show", "agent-1")
    assert shown.exit_code == 0 and "charge" in shown.stdout and "in doubt" in shown.stdout
    assert shown.stdout.startswith("run agent-1   pydantic-ai agent orders   status running")
    call_id = re.search(r"2/tools/1/[0-9a-f]{16}", shown.stdout)
    assert call_id, shown.stdout
    # When an operator says it happened, with its result, and recovers it with the app that has the agent
    word = f"{call_id.group(0)}=happened:{json.dumps(charge_result('A1', 90))}"
    decided = agentflow("decide", "agent-1", "--app", "test_cli_agents:app", "--call", word, "--as", "erin")
    assert decided.exit_code == 0, decided.output
    recovered = agentflow("recover", "agent-1", "--app", "test_cli_agents:app", "--as", "erin")
    # Then the agent ends as an uninterrupted run would, and the card was charged once
    assert recovered.exit_code == 0, recovered.output
    assert agentflow("verify", "agent-1").exit_code == 0
    ended = agentflow("runs", "list", "--flow", "loop:orders").stdout
    assert re.search(r"agent-1\s.*\bdone\b", ended), ended
    assert LEDGER.counts("agent-1")["charge"] == 1


def test_an_agent_run_is_forked_from_the_command_line_as_any_run(agentflow, db):
    # Given an agent run cut off inside charge, decided and carried on to its end
    cut_off(db)
    shown = agentflow("runs", "show", "agent-1").stdout
    call_id = re.search(r"2/tools/1/[0-9a-f]{16}", shown)
    assert call_id, shown
    word = f"{call_id.group(0)}=happened:{json.dumps(charge_result('A1', 90))}"
    assert agentflow("decide", "agent-1", "--app", "test_cli_agents:app", "--call", word, "--as", "erin").exit_code == 0
    assert agentflow("recover", "agent-1", "--app", "test_cli_agents:app", "--as", "erin").exit_code == 0
    # When it is forked at the stage whose response asks for the charge, and run here
    forked = agentflow(
        "fork", "agent-1", "--app", "test_cli_agents:app", "--at", "3", "--run", "--new-id", "agent-2", "--as", "erin"
    )
    # Then the new run charged again under its own id and ended; `runs show` names where it came from
    assert forked.exit_code == 0, forked.output
    assert "run agent-2 forked from agent-1 at step 3: done" in forked.stdout
    assert LEDGER.counts("agent-2")["charge"] == 1
    assert "forked from agent-1 at step 3 by erin" in agentflow("runs", "show", "agent-2").stdout
    # And a patch, which only a flow run's state takes, is refused with the reason
    patched = agentflow("fork", "agent-1", "--app", "test_cli_agents:app", "--at", "3", "--patch", '{"x": 1}')
    assert patched.exit_code != 0 and "fork starts from the checkpoint's messages" in patched.output
