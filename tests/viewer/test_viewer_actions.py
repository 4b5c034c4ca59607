"""Issue 15: Cancel, Retry, Decide and Fork from the run page, over HTTP.

Each action works on a run in the right state, signs the viewer's token label as its
operator (read back through the read model's segments), holds the run as the viewer
process, and is refused with a clear message (never a 500) on a run in another state.
"""

from __future__ import annotations

import json
import os
import sqlite3
from contextlib import closing
from pathlib import Path

import httpx2
import ops_kit
import pytest
import runs_kit
from ops_kit import act, csrf_for, report_of
from runs_kit import HOLDER, hold, stored
from starlette.testclient import TestClient
from viewer_kit import client_for, make_app

from agentflow.errors import RunHeld
from agentflow.exec.run.view import SegmentView
from agentflow.runs import Runs


def signed_by_the_viewer(segment: SegmentView, operator: str = "viewer") -> None:
    """The segment's claim was made by this viewer process and decided by `operator`."""
    assert segment.operator == operator
    assert segment.owner is not None and segment.owner.startswith("viewer@")
    assert segment.owner.endswith(f":{os.getpid()}")


# --- Cancel ---------------------------------------------------------------------------------


@pytest.mark.parametrize("run_id", ["refund-1", "ship-1"])
def test_cancel_ends_a_paused_or_stranded_run_signed_with_the_token_label(db, run_id):
    # Given a viewer whose operators are the ops team, and a paused (refund-1) or stranded (ship-1) run
    with client_for(make_app(db, flows=ops_kit.app, token_label="ops-team")) as client:
        # When Cancel is posted with a reason
        answer = act(client, run_id, "cancel", reason="the customer withdrew")
        page = client.get(answer.headers["location"]).text
    # Then the run ended cancelled, nothing ran, and the page says so
    assert answer.status_code == 303 and answer.headers["location"] == f"/runs/{run_id}?done=cancelled"
    report = report_of(db, run_id)
    assert report.status == "cancelled" and report.error == "cancelled by ops-team: the customer withdrew"
    assert runs_kit.REFUNDS == []
    assert "You cancelled the run" in page and 'class="status cancelled">cancelled' in page
    # And its cancel claim names the ops team and this viewer process
    assert report.segments[-1].how == "cancel"
    signed_by_the_viewer(report.segments[-1], "ops-team")


def test_cancel_needs_a_reason(ops, db):
    answer = act(ops, "refund-1", "cancel", reason="   ")
    assert answer.status_code == 400 and "Say why the run is cancelled" in answer.text
    assert report_of(db, "refund-1").status == "paused"


def test_a_finished_run_offers_no_cancel_and_a_post_is_refused(ops, db):
    # Given order-1, done (the page offers no Cancel, so take a token from refund-1's page)
    assert "/runs/order-1/cancel" not in ops.get("/runs/order-1").text
    before = stored(db, "order-1")
    answer = ops.post("/runs/order-1/cancel", data={"reason": "late", "csrf": "0" * 64})
    # Then the answer says why, and nothing was stored
    assert answer.status_code == 409 and "Cannot cancel this run" in answer.text
    assert "only a running, paused or stranded run can be cancelled; this one is done" in answer.text
    assert stored(db, "order-1") == before


def test_a_deed_the_holder_refuses_is_a_409_naming_it(ops, db, monkeypatch):
    # Given a runner that refuses to act on a run a live worker took since the page was read (here: cancel)
    lease = hold(db, "refund-1")

    async def refuse(self, run_id, *, reason, operator):
        raise RunHeld("refund-1", HOLDER, lease.expires_at)

    monkeypatch.setattr(Runs, "cancel", refuse)
    answer = act(ops, "refund-1", "cancel", reason="stop it")
    assert answer.status_code == 409 and "The run is held by a live worker" in answer.text
    assert f"run &#39;refund-1&#39; is held by {HOLDER} until" in answer.text


@pytest.mark.parametrize(("run_id", "status"), [("refund-1", "paused"), ("ship-1", "running")])
def test_cancel_of_a_held_run_asks_its_holder_to_stop_before_its_next_call(ops, db, run_id, status):
    # Given a run a live worker holds (the page still offers Cancel)
    hold(db, run_id)
    # When Cancel is posted
    answer = act(ops, run_id, "cancel", reason="wrong address")
    # Then the holder is asked to stop: the run stands as it was until it does, and the page says who stops
    assert answer.status_code == 303 and answer.headers["location"] == f"/runs/{run_id}?done=cancel-requested"
    assert report_of(db, run_id).status == status
    page = " ".join(ops.get(answer.headers["location"]).text.split())
    assert f"Cancel requested: <code>{HOLDER}</code> stops before its next call" in page
    assert runs_kit.REFUNDS == []


# --- Retry ----------------------------------------------------------------------------------


def test_retry_finishes_a_failed_run_once_its_tool_works(ops, db):
    # Given quote-1, failed because the quote service was down (it is up again)
    page = ops.get("/runs/quote-1").text
    assert "the quote service is down" in page and "/runs/quote-1/cancel" not in page
    # When Retry is posted
    answer = act(ops, "quote-1", "retry")
    # Then the run ran again from the failed superstep, here, to its end
    assert answer.status_code == 303 and answer.headers["location"] == "/runs/quote-1?done=retried"
    report = report_of(db, "quote-1")
    assert report.status == "done" and report.state["label"] == "12 EUR to Faro"
    assert report.segments[-1].how == "retry"
    signed_by_the_viewer(report.segments[-1])
    assert "You retried the run" in ops.get(answer.headers["location"]).text


def test_retry_of_a_run_that_did_not_fail_is_refused(ops, db):
    assert "/runs/refund-1/retry" not in ops.get("/runs/refund-1").text
    answer = ops.post("/runs/refund-1/retry", data={"csrf": "0" * 64})
    assert answer.status_code == 409 and "only a failed run can be retried; this one is paused" in answer.text
    assert report_of(db, "refund-1").status == "paused"


# --- Decide calls in doubt -------------------------------------------------------------------


def decide(client: TestClient, db: Path, run_id: str, word: str, **more: str) -> httpx2.Response:
    """Post the decision form of a run with one call in doubt: `word` on that call."""
    (call_id,) = [c.call_id for c in report_of(db, run_id).in_doubt]
    assert f'name="call.0" value="{call_id}"' in client.get(f"/runs/{run_id}").text
    return act(client, run_id, "decide", **{"call.0": call_id, "word.0": word, **more})


def test_it_happened_settles_the_call_and_the_run_finishes_without_it_running_again(ops, db):
    # Given ship-1, whose ship call is in doubt (its worker died inside it)
    assert "Decide the calls in doubt" in ops.get("/runs/ship-1").text
    # When the operator, having found the parcel shipped, says it happened and what it returned
    answer = decide(ops, db, "ship-1", "happened", **{"result.0": json.dumps("shipped to Lisbon by courier")})
    # Then the decision is stored, the run recovered here, and it finished with the given result
    assert answer.status_code == 303 and answer.headers["location"] == "/runs/ship-1?done=decided"
    report = report_of(db, "ship-1")
    assert report.status == "done" and report.state["label"] == "shipped to Lisbon by courier"
    decision = [s for s in report.segments if s.how == "decision"]
    assert len(decision) == 1
    signed_by_the_viewer(decision[0])
    assert "You decided the calls in doubt" in ops.get(answer.headers["location"]).text


@pytest.mark.parametrize(
    ("word", "more", "status", "said"),
    [
        ("rerun", {}, "done", "shipped to Lisbon"),
        ("not", {"reason.0": "the carrier has no record"}, "failed", "ship did not happen, said viewer: the carrier"),
    ],
)
def test_rerun_or_did_not_happen(ops, db, word, more, status, said):
    answer = decide(ops, db, "ship-1", word, **more)
    assert answer.status_code == 303
    report = report_of(db, "ship-1")
    assert report.status == status
    assert said in (report.state["label"] if status == "done" else report.error or "")


@pytest.mark.parametrize(
    ("result", "said"),
    [("shipped", "must be JSON"), ("42", "does not fit &#39;ship&#39;")],
)
def test_a_result_that_is_not_json_or_does_not_fit_is_a_400_with_the_reason(ops, db, result, said):
    before = stored(db, "ship-1")
    answer = decide(ops, db, "ship-1", "happened", **{"result.0": result})
    assert answer.status_code == 400 and said in answer.text
    assert stored(db, "ship-1") == before


def test_decide_on_a_run_without_calls_in_doubt_or_held_is_refused(ops, db):
    answer = ops.post("/runs/refund-1/decide", data={"call.0": "x", "word.0": "rerun", "csrf": "0" * 64})
    assert answer.status_code == 409 and "only a run with calls in doubt" in answer.text
    # a live holder: its calls are running, not in doubt
    csrf = csrf_for(ops.get("/runs/ship-1").text, "ship-1", "decide")
    hold(db, "ship-1")
    answer = ops.post("/runs/ship-1/decide", data={"call.0": "x", "word.0": "rerun", "csrf": csrf})
    assert answer.status_code == 409 and "The run is held by a live worker" in answer.text


# --- Fork -----------------------------------------------------------------------------------


def test_fork_starts_a_patched_run_and_leaves_the_old_one_untouched(ops, db):
    # Given ship-1, stuck on a call in doubt, whose step 1 is after packing and before shipping
    before = stored(db, "ship-1")
    # When it is forked from step 1 with another address
    answer = act(ops, "ship-1", "fork", at_step="1", patch='{"address": "Porto"}')
    # Then the browser goes to the new run, which shipped to Porto here, and ship-1 is as it was
    assert answer.status_code == 303
    location = answer.headers["location"]
    assert location.startswith("/runs/") and location.endswith("?done=forked")
    new_id = location.removeprefix("/runs/").removesuffix("?done=forked")
    assert new_id != "ship-1"
    report = report_of(db, new_id)
    assert report.status == "done" and report.state["label"] == "shipped to Porto"
    assert report.segments[0].owner is not None and report.segments[0].owner.startswith("viewer@")
    assert stored(db, "ship-1") == before
    # And the new run's page names where it came from, and who forked it
    page = " ".join(ops.get(location).text.split())
    assert "You forked this run" in page
    assert 'Forked from <a href="/runs/ship-1">ship-1</a> at step 1 by <strong>viewer</strong>' in page


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"at_step": "1", "patch": "{address"}, "The patch must be a JSON object"),
        ({"at_step": "1", "patch": "[1]"}, "The patch must be a JSON object of state fields"),
        ({"at_step": "9", "patch": ""}, "has steps 0 to"),
        ({"at_step": "one"}, "Choose the step"),
        ({"at_step": "1", "patch": '{"address": 5}'}, "the patched state does not fit Parcel"),
    ],
)
def test_a_bad_fork_is_a_400_saying_why(ops, db, fields, said):
    runs = run_ids(db)
    answer = act(ops, "ship-1", "fork", **fields)
    assert answer.status_code == 400 and said in answer.text
    assert run_ids(db) == runs


def run_ids(db: Path) -> set[str]:
    with closing(sqlite3.connect(db)) as conn:
        return {row[0] for row in conn.execute("SELECT DISTINCT run_id FROM checkpoints")}


# --- What is not offered -----------------------------------------------------------------------


def test_a_run_with_a_principal_can_be_cancelled_but_not_forked(ops, db):
    # Given refund-2, paused, acting for a principal the viewer does not hold
    page = ops.get("/runs/refund-2").text
    # Then Cancel is offered (it runs nothing for the principal), Fork is disabled and says why
    assert 'action="/runs/refund-2/cancel"' in page and 'action="/runs/refund-2/fork"' not in page
    assert "fork it from the application" in page
    answer = ops.post("/runs/refund-2/fork", data={"at_step": "0", "csrf": "0" * 64})
    assert answer.status_code == 409 and "acts for a principal" in answer.text


def test_a_read_only_viewer_shows_no_action_and_refuses_every_post(db):
    ops_kit.add_failed(db)
    with client_for(make_app(db, flows=None)) as client:
        for run_id in ("refund-1", "quote-1", "ship-1"):
            assert 'name="csrf"' not in client.get(f"/runs/{run_id}").text
        for run_id, action in (("refund-1", "cancel"), ("quote-1", "retry"), ("ship-1", "decide"), ("ship-1", "fork")):
            answer = client.post(f"/runs/{run_id}/{action}", data={"csrf": "0" * 64})
            assert answer.status_code == 409 and "start the viewer with --app module:attr" in answer.text, action


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("1" * 5000, "an integer of 5000 digits"),
        ("[" * 3000, "nests deeper than 200 levels"),
        ('"\\ud800"', "holds a lone surrogate"),
        ("Infinity", "Infinity, which JSON does not allow"),
    ],
    ids=["5000-digits", "deep", "lone-surrogate", "infinity"],
)
def test_a_result_or_patch_no_store_keeps_is_a_400_saying_what_to_fix(ops, db, text, said):
    # Given ship-1, stuck on a call in doubt
    before, runs = stored(db, "ship-1"), run_ids(db)
    # When an operator decides it happened with such a result, or forks it with such a patch
    decided = decide(ops, db, "ship-1", "happened", **{"result.0": text})
    forked = act(ops, "ship-1", "fork", at_step="1", patch=f'{{"address": {text}}}')
    # Then each is a 400 that says what to fix, and nothing is stored
    for answer in (decided, forked):
        assert answer.status_code == 400 and said in answer.text
    assert stored(db, "ship-1") == before and run_ids(db) == runs
