"""Who did what, in the viewer: segment owners and operators, runs live on a worker, Approve on a held run.

A live run is held with the store's own lease (`runs_kit.hold`), as a worker holds it while
it moves the run: the viewer shows it as running there, never as in doubt, and decides nothing on it.
"""

from __future__ import annotations

import re

import pytest
import runs_kit
from runs_kit import HOLDER, hold, stored
from test_viewer_resume import post, status_of
from viewer_kit import LOCAL, TOKEN, client_for, csrf_of, make_app, settings_for


def segments_of(html: str) -> list[str]:
    """The text of each segment of the timeline (tags dropped, whitespace folded)."""
    blocks = re.findall(r'<div class="seg [^"]*">(.*?)<div class="seg-foot', html, re.S)
    return [" ".join(re.sub(r"<[^>]+>", " ", block).split()) for block in blocks]


def test_a_live_run_is_running_on_its_holder_not_in_doubt(local, db):
    # Given ship-1 (its ship call logged as started, no result) held by a live worker
    hold(db, "ship-1")
    # When its page is opened
    html = local.get("/runs/ship-1").text
    # Then it runs on that worker until its lease ends, and nothing is called in doubt or offered to recover
    assert f"Running on <code>{HOLDER}</code></strong>" in html and "not in doubt" in html
    assert "Calls in doubt" not in html and "Their worker stopped" not in html
    assert "agentflow recover" not in html and "rerun_in_doubt" not in html
    assert 'class="pill live">live' in html


def test_the_same_run_without_a_holder_is_in_doubt(local):
    # Given ship-1, held by nobody: its worker died inside ship
    html = local.get("/runs/ship-1").text
    # Then its call is in doubt, with the advice to check and recover
    assert "Calls in doubt" in html and "agentflow decide ship-1 --app ... --call CALL_ID=" in html
    assert "--rerun-in-doubt" not in html
    assert "Running on" not in html


def test_the_list_marks_a_live_run_with_its_holder(local, db):
    hold(db, "ship-1")
    html = local.get("/").text
    row = re.search(r'<tr[^>]*data-run="ship-1".*?</tr>', html, re.S)
    assert row is not None and 'class="pill live" title="its lease runs until' in row.group(0)
    assert f"running on {HOLDER}" in row.group(0)
    assert "1 live" in html


def test_a_held_paused_run_offers_no_decision_but_cancel(local, db):
    # Given refund-1, paused, while another process holds its lease
    hold(db, "refund-1")
    html = local.get("/runs/refund-1").text
    # Then Approve and Deny are off, and the page says who holds the run
    assert "/runs/refund-1/resume" not in html and "disabled" in html
    assert f"is held by {HOLDER} until" in html
    # And Cancel is offered all the same (the holder is asked to stop)
    assert 'action="/runs/refund-1/cancel"' in html


def test_approve_of_a_held_run_answers_who_holds_it_and_runs_nothing(local, db):
    # Given refund-1's page, opened while the run was free
    csrf = csrf_of(local.get("/runs/refund-1").text)
    # When another process takes the run, then Approve is posted
    hold(db, "refund-1")
    before = stored(db, "refund-1")
    answer = post(local, "refund-1", csrf)
    # Then the answer is a clear conflict naming the holder and the end of its lease, and nothing ran
    assert answer.status_code == 409
    assert "The run is held by a live worker" in answer.text
    assert f"run &#39;refund-1&#39; is held by {HOLDER} until" in answer.text
    assert status_of(db, "refund-1") == "paused" and runs_kit.REFUNDS == [] and stored(db, "refund-1") == before


def test_a_decision_names_the_token_label_and_each_segment_its_holder(db):
    # Given a viewer whose token is held by the ops team
    app = make_app(db, token=TOKEN, token_label="ops-team")
    with client_for(app, client=LOCAL) as client:
        # When refund-1 is approved through it
        csrf = csrf_of(client.get("/runs/refund-1").text)
        assert post(client, "refund-1", csrf, token=TOKEN).status_code == 303
        html = client.get("/runs/refund-1").text
    # Then the worker that started it, the viewer process that resumed it, and the ops team are named
    start, resumed = segments_of(html)
    assert "started the run" in start and "held by runner@" in start
    assert "claimed by a resume" in resumed and "held by viewer@" in resumed
    assert "decided by ops-team at" in resumed


def test_without_a_label_the_operator_is_the_viewer(local, db):
    assert post(local, "refund-1", csrf_of(local.get("/runs/refund-1").text)).status_code == 303
    assert "decided by viewer at" in segments_of(local.get("/runs/refund-1").text)[1]


@pytest.mark.parametrize("label", ["", " ops", "ops\n", "x" * 101, "ops\x1b[31m"])
def test_a_token_label_must_be_a_short_printable_name(db, label):
    with pytest.raises(ValueError, match=r"ViewerSettings\.token_label must be a name of 1 to 100 printable"):
        settings_for(db, token_label=label)
