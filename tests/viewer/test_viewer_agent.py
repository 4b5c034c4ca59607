"""A durable pydantic-ai agent's run in the viewer, in headless Chromium: its timeline, its calls, its live events.

The run is the order agent's (`_kit.agents`), cut off inside ``charge``: the page shows each
stage's checkpoint and the charge in doubt; another process decides it happened and carries the
run on, and the page's live events follow it to its end.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _kit.agents import PROMPT, charge_result, durable, make_agent
from _kit.leases import KILLED_LEASE_S, once_lapsed
from _kit.tickets import Crash, Ledger, raise_crash
from playwright.sync_api import Page, expect
from viewer_kit import make_app, runs_kit, served

from agentflow import Events, FlowApp, Happened
from agentflow.errors import RecoveryNeedsDecision
from agentflow.exec.checkpoints import SQLiteCheckpointStore

pytestmark = pytest.mark.browser

LEDGER = Ledger()
#: The kit's flows, and the order agent as the loop ``orders``.
app = FlowApp(runs_kit.registry, [runs_kit.refunds, runs_kit.shipping], loops={"orders": durable(make_agent(LEDGER))})


@pytest.fixture
def agent_db(db: Path) -> Path:
    """The kit's runs and ``agent-1``, an agent run whose worker died inside charge."""

    async def cut_off() -> None:
        async with SQLiteCheckpointStore(db) as store:
            dying = durable(make_agent(LEDGER, die_in="charge", die=raise_crash))
            with pytest.raises(Crash):
                runner = dying.runner(store, runs_kit.KEY, lease_s=KILLED_LEASE_S, events=Events(record=True))
                await runner.run(PROMPT, run_id="agent-1")

    runs_kit.in_thread(cut_off)
    return db


def test_an_agent_run_shows_its_stages_its_call_in_doubt_and_follows_its_events_live(
    page: Page, agent_db: Path, shots: Path
) -> None:
    with served(make_app(agent_db, flows=app, refresh_s=2)) as base:
        # Given the cut-off agent run, open
        page.goto(base + "/runs/agent-1")
        # Then its timeline holds its stages' checkpoints, and its calls table the finished lookup
        # and the charge in doubt
        calls = page.locator("table.calls")
        expect(calls).to_contain_text("lookup_order")
        expect(calls).to_contain_text("charge")
        expect(calls).to_contain_text("in doubt")
        expect(page.locator("h1")).to_contain_text("agent-1")
        page.screenshot(path=shots / "20-agent-run-in-doubt.png", full_page=True)
        events = page.locator("#live-events .event-list")
        expect(events.locator("li .name").first).to_have_text("checkpoint.saved")

        # When another process says the charge happened and carries the run on, recording its events
        async def decide() -> None:
            async with SQLiteCheckpointStore(agent_db) as store:
                runner = durable(make_agent(LEDGER)).runner(store, runs_kit.KEY, events=Events(record=True))
                with pytest.raises(RecoveryNeedsDecision) as asked:
                    await once_lapsed(lambda: runner.recover("agent-1"))
                happened = Happened(charge_result("A1", 90))
                await runner.decide_in_doubt("agent-1", calls={asked.value.call_ids[0]: happened}, operator="carol")
                await runner.recover("agent-1")

        runs_kit.in_thread(decide)
        # Then the live events follow it to its end, and the page shows it done with carol's word
        expect(events.locator("li .name").last).to_have_text("run.finished")
        expect(page.locator("h1 .status")).to_have_text("done", timeout=15_000)
        expect(page.locator(".operator")).to_contain_text("decided by carol")
        page.screenshot(path=shots / "21-agent-run-done.png", full_page=True)
    assert LEDGER.counts("agent-1")["charge"] == 1
