"""The viewer in headless Chromium: what a person sees and clicks.

Each test serves a fresh copy of the kit's store with uvicorn on a free loopback port and
saves a screenshot of each page under test-output/screenshots/.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import runs_kit
from playwright.sync_api import Dialog, Page, expect
from viewer_kit import make_app, served

from agentflow import Events, Happened
from agentflow.exec.checkpoints import SQLiteCheckpointStore
from agentflow.exec.run.read import read_run
from agentflow.exec.seal import Sealer

pytestmark = pytest.mark.browser


def stored_status(db: Path, run_id: str) -> str:
    async def read() -> str:
        async with SQLiteCheckpointStore(db) as store:
            return (await read_run(store, Sealer(runs_kit.KEY), run_id)).status

    return runs_kit.in_thread(read)


def test_the_list_marks_the_recovered_run(page, viewer_url, shots):
    # Given the demo's runs, one of which (order-2) was recovered after its worker was killed
    page.goto(viewer_url + "/")
    # Then its row says done (that a worker claimed it is on its page, not a mark a person needs here)
    row = page.locator("tr[data-run='order-2']")
    expect(row.locator(".status")).to_have_text("done")
    expect(page.locator(".pill.claimed")).to_have_count(0)
    expect(page.locator("tr[data-run='ship-1'] .status")).to_have_text("running")
    expect(page.locator("tr[data-run='refund-1'] .status")).to_have_text("paused")
    page.screenshot(path=shots / "01-runs-list.png", full_page=True)

    # When the recovered run is opened, its timeline shows the recovering worker's claim
    page.locator("tr[data-run='order-2'] a").click()
    expect(page.locator(".seg.recovery .seg-head")).to_contain_text("claimed by a recovery")
    expect(page.locator("table.calls")).to_contain_text("rerun after recovery")
    page.screenshot(path=shots / "02-run-recovered.png", full_page=True)


def test_approving_a_paused_run_finishes_it(page, viewer_url, db, shots):
    # Given refund-1, paused until someone approves the refund
    page.goto(viewer_url + "/runs/refund-1")
    expect(page.locator("h1 .status")).to_have_text("paused")
    expect(page.locator(".approval")).to_contain_text("refund")
    page.screenshot(path=shots / "03-run-paused.png", full_page=True)
    # When Approve is clicked and the confirmation accepted
    dialogs: list[str] = []

    def accept(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        dialog.accept()

    page.once("dialog", accept)
    page.get_by_role("button", name="Approve").click()
    # Then the run went on to done, on the page and in the store, and the tool ran once
    expect(page).to_have_url(re.compile(r"/runs/refund-1\?done=approved$"))
    expect(page.locator("h1 .status")).to_have_text("done")
    expect(page.locator(".banner.good")).to_contain_text("You approved")
    assert dialogs and "Approve 1 pending call(s) of refund-1?" in dialogs[0]
    assert stored_status(db, "refund-1") == "done"
    assert runs_kit.REFUNDS == ["order-1"]
    page.screenshot(path=shots / "04-run-approved.png", full_page=True)


def test_dismissing_the_confirmation_changes_nothing(page, viewer_url, db):
    page.goto(viewer_url + "/runs/refund-1")
    page.once("dialog", lambda dialog: dialog.dismiss())
    page.get_by_role("button", name="Deny").click()
    expect(page.locator("h1 .status")).to_have_text("paused")
    assert stored_status(db, "refund-1") == "paused"


def test_a_tampered_run_shows_as_corrupt_not_as_data(page, viewer_url, db, shots):
    # Given tamper-1, one byte of whose checkpoints 1 and 2 (its head, which the list checks) was changed
    runs_kit.tamper(db, "tamper-1", 2)
    page.goto(viewer_url + "/?status=corrupt")
    row = page.locator("tr[data-run='tamper-1']")
    expect(row.locator(".pill.corrupt")).to_have_text("corrupt")
    expect(row).to_contain_text("signature does not match")
    page.screenshot(path=shots / "05-runs-corrupt-filter.png", full_page=True)
    # When it is opened
    row.locator("a").click()
    # Then the page says corrupt and why, and shows nothing read from the run
    expect(page.locator(".banner.bad")).to_contain_text("checkpoint 1 of run 'tamper-1': signature does not match")
    body = page.locator("body").inner_text()
    assert "berlin" not in body.lower() and "shipping" not in body
    expect(page.locator("pre.state")).to_have_count(0)
    page.screenshot(path=shots / "06-run-corrupt.png", full_page=True)


def test_an_in_doubt_run_explains_what_to_do(page, viewer_url, shots):
    page.goto(viewer_url + "/runs/ship-1")
    expect(page.locator(".banner.warn")).to_contain_text("Calls in doubt")
    expect(page.locator("table.calls .pill.in-doubt")).to_have_text("in doubt")
    page.screenshot(path=shots / "07-run-in-doubt.png", full_page=True)


def test_live_refresh_picks_up_a_change_made_elsewhere(page, db):
    with served(make_app(db, refresh_s=2)) as base:
        live_refresh(page, base, db)


def live_refresh(page: Page, base: str, db: Path) -> None:
    # Given the list open with live refresh on (the default)
    page.goto(base + "/?flow=refunds")
    expect(page.locator("tr[data-run='refund-1'] .status")).to_have_text("paused")
    expect(page.locator("#live-toggle")).to_be_checked()
    # When another process resumes the run

    async def approve() -> None:
        async with SQLiteCheckpointStore(db) as store:
            runner = runs_kit.app.runner(store, runs_kit.KEY, events=Events(record=True))  # it records its events
            await runner.resume(runs_kit.refunds, "refund-1", approve=True)

    runs_kit.in_thread(approve)
    # Then the page shows it within a refresh or two, without a reload
    expect(page.locator("tr[data-run='refund-1'] .status")).to_have_text("done", timeout=15_000)


def test_the_live_events_list_follows_a_run_as_it_goes(page, db, shots):
    with served(make_app(db, refresh_s=2)) as base:
        live_events(page, base, db)
        page.screenshot(path=shots / "08-run-live-events.png", full_page=True)


def live_events(page: Page, base: str, db: Path) -> None:
    # Given refund-1, paused, open: its live list shows the events stored so far
    page.goto(base + "/runs/refund-1")
    events = page.locator("#live-events .event-list")
    expect(events.locator("li .name").last).to_have_text("run.paused")
    expect(page.locator("#live-events .events-state")).to_have_text("Following the run…")
    # When another process approves the refund, and the run goes on to done

    async def approve() -> None:
        async with SQLiteCheckpointStore(db) as store:
            runner = runs_kit.app.runner(store, runs_kit.KEY, events=Events(record=True))  # it records its events
            await runner.resume(runs_kit.refunds, "refund-1", approve=True)

    runs_kit.in_thread(approve)
    # Then its events come into the list as they are stored, up to the run's end
    expect(events.locator("li .name").last).to_have_text("run.finished")
    expect(page.locator("#live-events .events-state")).to_have_text("The run has ended: every event is shown.")
    # and the page's own live refresh (which shows the run done) keeps the list as it was
    expect(page.locator("h1 .status")).to_have_text("done", timeout=15_000)
    names = events.locator("li .name").all_text_contents()
    assert names[0] == "checkpoint.saved" and "run.paused" in names and names[-1] == "run.finished"
    assert names.count("run.paused") == 1


def test_a_run_waiting_for_a_decision_is_listed_as_such_and_a_happened_decision_shows_what_was_supplied(
    page, viewer_url, db, shots
):
    # Given ship-1, parked by a worker on its ship call in doubt
    runs_kit.as_worker(db, "park", "ship-1")
    # When the list is opened, Then the run reads "waiting for a decision", counted at the top
    page.goto(viewer_url + "/")
    expect(page.locator("tr[data-run='ship-1'] .status")).to_have_text("waiting for a decision")
    counter = page.locator(".counts a", has_text="waiting for a decision")
    expect(counter).to_have_text("1 waiting for a decision")
    page.screenshot(path=shots / "09-runs-waiting-for-a-decision.png", full_page=True)
    # And its counter filters the list down to the runs that wait for a person
    counter.click()
    expect(page).to_have_url(re.compile(r"status=decision"))
    expect(page.locator("table.runs tbody tr")).to_have_count(1)
    expect(page.locator("tr[data-run='ship-1']")).to_be_visible()

    # When carol, who found the parcel shipped, says the call happened, with its result
    async def decide() -> None:
        async with SQLiteCheckpointStore(db) as store:
            report = await read_run(store, Sealer(runs_kit.KEY), "ship-1")
            (call,) = report.in_doubt
            runner = runs_kit.app.runner(store, runs_kit.KEY)
            await runner.decide_in_doubt(
                runs_kit.shipping, "ship-1", calls={call.call_id: Happened("shipped to Berlin")}, operator="carol"
            )

    runs_kit.in_thread(decide)
    # Then the run's timeline and its calls table show her word and the result she supplied
    page.goto(viewer_url + "/runs/ship-1")
    expect(page.locator(".settled")).to_contain_text("happened: result shipped to Berlin")
    expect(page.locator(".operator")).to_contain_text("decided by carol")
    expect(page.locator("table.calls")).to_contain_text("happened, said carol, who supplied its result")
    page.screenshot(path=shots / "10-run-happened-decision.png", full_page=True)
