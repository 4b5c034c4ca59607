"""Issue 15: every new action is guarded as Approve/Deny is: token or loopback, no cross-site, a CSRF token.

Each test runs over all four actions (Cancel on refund-1, Retry on quote-1, Decide on ship-1,
Fork from ship-1) and checks that a refused POST stored nothing at all.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import ops_kit
import pytest
from ops_kit import csrf_for, report_of
from viewer_kit import LOCAL, TOKEN, client_for, make_app

REMOTE = ("192.0.2.7", 40000)


def decide_fields(db: Path) -> dict[str, str]:
    (call,) = report_of(db, "ship-1").in_doubt
    return {"call.0": call.call_id, "word.0": "rerun"}


#: (run, action, the action's own fields given the store)
CASES: list[tuple[str, str, Callable[[Path], dict[str, str]]]] = [
    ("refund-1", "cancel", lambda db: {"reason": "the customer withdrew"}),
    ("quote-1", "retry", lambda db: {}),
    ("ship-1", "decide", decide_fields),
    ("ship-1", "fork", lambda db: {"at_step": "1", "patch": '{"address": "Porto"}'}),
]
IDS = [action for _, action, _ in CASES]


def snapshot(db: Path) -> list[tuple[str, int]]:
    """Every checkpoint and call record of the store, by run: a refused action changes none."""
    with closing(sqlite3.connect(db)) as conn:
        rows = conn.execute("SELECT run_id, COUNT(*) FROM checkpoints GROUP BY run_id ORDER BY run_id").fetchall()
        calls = conn.execute("SELECT run_id, COUNT(*) FROM calls GROUP BY run_id ORDER BY run_id").fetchall()
    return [*rows, *calls]


@pytest.fixture
def store(db: Path) -> Path:
    ops_kit.add_failed(db)
    return db


@pytest.mark.parametrize(("run_id", "action", "fields"), CASES, ids=IDS)
def test_with_a_token_configured_each_action_needs_it_from_anywhere(store, run_id, action, fields):
    app = make_app(store, flows=ops_kit.app, token=TOKEN)
    with client_for(app, client=REMOTE) as remote, client_for(app, client=LOCAL) as local:
        page = remote.get(f"/runs/{run_id}").text
        assert 'name="token"' in page
        data = {"csrf": csrf_for(page, run_id, action), **fields(store)}
        before = snapshot(store)
        assert local.post(f"/runs/{run_id}/{action}", data=data).status_code == 403  # no token, even from here
        assert remote.post(f"/runs/{run_id}/{action}", data={**data, "token": "x" * 30}).status_code == 403
        assert snapshot(store) == before
        answer = remote.post(f"/runs/{run_id}/{action}", data=data, headers={"X-Agentflow-Token": TOKEN})
    assert answer.status_code == 303, answer.text
    assert snapshot(store) != before


@pytest.mark.parametrize(("run_id", "action", "fields"), CASES, ids=IDS)
def test_without_a_token_another_machine_gets_no_form_and_cannot_post(store, run_id, action, fields):
    app = make_app(store, flows=ops_kit.app)
    with client_for(app) as local, client_for(app, client=REMOTE) as remote:
        page = remote.get(f"/runs/{run_id}").text
        assert 'name="csrf"' not in page and "acting on a run is allowed only from this machine" in page
        data = {"csrf": csrf_for(local.get(f"/runs/{run_id}").text, run_id, action), **fields(store)}
        before = snapshot(store)
        assert remote.post(f"/runs/{run_id}/{action}", data=data).status_code == 403
    assert snapshot(store) == before


@pytest.mark.parametrize(("run_id", "action", "fields"), CASES, ids=IDS)
@pytest.mark.parametrize("header", [{"Origin": "https://evil.example"}, {"Sec-Fetch-Site": "cross-site"}])
def test_a_cross_site_post_of_each_action_is_refused(ops, db, run_id, action, fields, header):
    data = {"csrf": csrf_for(ops.get(f"/runs/{run_id}").text, run_id, action), **fields(db)}
    before = snapshot(db)
    answer = ops.post(f"/runs/{run_id}/{action}", data=data, headers=header)
    assert answer.status_code == 403 and "the request comes from another site" in answer.text
    assert snapshot(db) == before


@pytest.mark.parametrize(("run_id", "action", "fields"), CASES, ids=IDS)
def test_each_action_needs_its_own_csrf_token_for_this_run_and_step(ops, db, run_id, action, fields):
    page = ops.get(f"/runs/{run_id}").text
    own = csrf_for(page, run_id, action)
    fork = (
        csrf_for(page, run_id, "fork")
        if action != "fork"
        else csrf_for(ops.get("/runs/quote-1").text, "quote-1", "fork")
    )
    before = snapshot(db)
    for csrf in ("", "0" * 64, fork):  # none, made up, and a real one of another action (or run)
        answer = ops.post(f"/runs/{run_id}/{action}", data={"csrf": csrf, **fields(db)})
        assert answer.status_code == 409 and "Stale page" in answer.text, csrf
    assert snapshot(db) == before
    assert ops.post(f"/runs/{run_id}/{action}", data={"csrf": own, **fields(db)}).status_code == 303


def test_a_form_larger_than_any_page_makes_is_refused_unread(store):
    # Given a loopback client posting a cancel with a reason of a megabyte (a form holds 16 KiB at most)
    app = make_app(store, flows=ops_kit.app)
    with client_for(app, client=LOCAL) as local:
        page = local.get("/runs/refund-1").text
        data = {"csrf": csrf_for(page, "refund-1", "cancel"), "reason": "x" * (1 << 20)}
        before = snapshot(store)
        # Then it is refused as not a form, and nothing is stored
        answer = local.post("/runs/refund-1/cancel", data=data)
        assert answer.status_code == 400 and "Not a form" in answer.text
        assert snapshot(store) == before
