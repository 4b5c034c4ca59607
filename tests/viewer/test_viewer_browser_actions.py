"""Issue 15 in headless Chromium: Cancel, Retry, "it happened" and Fork, clicked as a person would.

Each test serves a fresh copy of the kit's store (plus quote-1, failed) with the operator
app, accepts the confirmation dialog, and saves a screenshot under test-output/screenshots/.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import ops_kit
import pytest
import runs_kit
from ops_kit import report_of
from playwright.sync_api import Dialog, Page, expect
from viewer_kit import make_app, served

pytestmark = pytest.mark.browser


@pytest.fixture
def ops_url(db: Path) -> Iterator[str]:
    ops_kit.add_failed(db)
    with served(make_app(db, flows=ops_kit.app, token_label="night-shift")) as base:
        yield base


def accept_next_dialog(page: Page) -> list[str]:
    """Accept the next confirmation; return the list its message goes into."""
    seen: list[str] = []

    def accept(dialog: Dialog) -> None:
        seen.append(dialog.message)
        dialog.accept()

    page.once("dialog", accept)
    return seen


def test_cancelling_a_paused_run(page, ops_url, db, shots):
    # Given refund-1, paused for approval of a refund
    page.goto(ops_url + "/runs/refund-1")
    expect(page.locator("#operate")).to_contain_text("Act on this run")
    page.screenshot(path=shots / "08-run-paused-actions.png", full_page=True)
    # When a reason is given and Cancel clicked, and the confirmation accepted
    page.get_by_label("Reason").fill("the customer withdrew")
    dialogs = accept_next_dialog(page)
    page.get_by_role("button", name="Cancel run").click()
    # Then the run is cancelled, on the page and in the store, and no refund was made
    expect(page).to_have_url(re.compile(r"/runs/refund-1\?done=cancelled$"))
    expect(page.locator("h1 .status")).to_have_text("cancelled")
    expect(page.locator("#done")).to_contain_text("You cancelled the run")
    expect(page.locator(".banner.bad")).to_contain_text("cancelled by night-shift: the customer withdrew")
    assert dialogs and dialogs[0].startswith("Cancel refund-1?")
    assert report_of(db, "refund-1").status == "cancelled" and runs_kit.REFUNDS == []
    page.screenshot(path=shots / "09-run-cancelled.png", full_page=True)


def test_retrying_a_failed_run(page, ops_url, db, shots):
    # Given quote-1, failed while the quote service was down (it is up again)
    page.goto(ops_url + "/runs/quote-1")
    expect(page.locator("h1 .status")).to_have_text("failed")
    # When Retry is clicked and confirmed
    dialogs = accept_next_dialog(page)
    page.get_by_role("button", name="Retry").click()
    # Then the run finished with the quote
    expect(page).to_have_url(re.compile(r"/runs/quote-1\?done=retried$"))
    expect(page.locator("h1 .status")).to_have_text("done")
    expect(page.locator("pre.state")).to_contain_text("12 EUR to Faro")
    assert dialogs and "Retry quote-1 from the superstep that failed?" in dialogs[0]
    assert report_of(db, "quote-1").segments[-1].operator == "night-shift"
    page.screenshot(path=shots / "10-run-retried.png", full_page=True)


def test_it_happened_on_a_call_in_doubt_lets_the_run_finish(page, ops_url, db, shots):
    # Given ship-1, whose ship call is in doubt
    page.goto(ops_url + "/runs/ship-1")
    section = page.locator("#decide")
    expect(section).to_contain_text("Decide the calls in doubt")
    page.screenshot(path=shots / "11-run-decide.png", full_page=True)
    # When the operator says it happened, with what it returned, and confirms
    section.get_by_label("It happened").check()
    section.locator("input[name='result.0']").fill(json.dumps("shipped to Lisbon by courier"))
    dialogs = accept_next_dialog(page)
    section.get_by_role("button", name="Decide").click()
    # Then the run finished with that result, and the timeline names who decided
    expect(page).to_have_url(re.compile(r"/runs/ship-1\?done=decided$"))
    expect(page.locator("h1 .status")).to_have_text("done")
    expect(page.locator("pre.state")).to_contain_text("shipped to Lisbon by courier")
    expect(page.locator(".seg .operator").first).to_contain_text("decided by night-shift")
    assert dialogs and "Store your decision on 1 call(s) in doubt of ship-1?" in dialogs[0]
    assert report_of(db, "ship-1").status == "done"
    page.screenshot(path=shots / "12-run-decided.png", full_page=True)


def test_forking_from_a_chosen_step_with_a_patch(page, ops_url, db, shots):
    # Given ship-1, stuck on its call in doubt
    page.goto(ops_url + "/runs/ship-1")
    # When it is forked from step 1 with another address, and confirmed
    page.locator("select[name='at_step']").select_option("1")
    page.locator("textarea[name='patch']").fill('{"address": "Porto"}')
    accept_next_dialog(page)
    page.get_by_role("button", name="Fork").click()
    # Then the browser shows the new run, done, shipped to Porto
    expect(page).to_have_url(re.compile(r"/runs/[^/?]+\?done=forked$"))
    expect(page.locator("h1 .status")).to_have_text("done")
    expect(page.locator("pre.state")).to_contain_text("shipped to Porto")
    expect(page.locator("#lineage")).to_contain_text("Forked from ship-1 at step 1 by night-shift")
    assert "/runs/ship-1?" not in page.url
    page.screenshot(path=shots / "13-run-forked.png", full_page=True)
