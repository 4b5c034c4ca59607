"""Approve / Deny from the viewer: who may resume a paused run, and how."""

from __future__ import annotations

from pathlib import Path

import httpx2
import runs_kit
from starlette.testclient import TestClient
from viewer_kit import LOCAL, TOKEN, client_for, csrf_of, make_app

from agentflow.exec.checkpoints import SQLiteCheckpointStore
from agentflow.exec.run.read import read_run
from agentflow.exec.seal import Sealer

REMOTE = ("192.0.2.7", 40000)


def status_of(db: Path, run_id: str) -> str:
    async def read() -> str:
        async with SQLiteCheckpointStore(db) as store:
            return (await read_run(store, Sealer(runs_kit.KEY), run_id)).status

    return runs_kit.in_thread(read)


def post(client: TestClient, run_id: str, csrf: str, decision: str = "approve", **extra: str) -> httpx2.Response:
    return client.post(f"/runs/{run_id}/resume", data={"csrf": csrf, "decision": decision, **extra})


def test_approve_from_this_machine_finishes_the_run(local, db):
    # Given a paused run's page opened on this machine
    csrf = csrf_of(local.get("/runs/refund-1").text)
    # When Approve is posted
    answer = post(local, "refund-1", csrf, note="looked fine")
    # Then the viewer resumed the run (the tool ran once) and sends the browser back to it
    assert answer.status_code == 303
    assert answer.headers["location"] == "/runs/refund-1?done=approved"
    assert status_of(db, "refund-1") == "done" and runs_kit.REFUNDS == ["order-1"]
    assert "You approved the pending calls" in local.get(answer.headers["location"]).text


def test_deny_ends_the_run_without_running_the_tool(local, db):
    answer = post(local, "refund-1", csrf_of(local.get("/runs/refund-1").text), "deny")
    assert answer.status_code == 303
    assert status_of(db, "refund-1") == "failed" and runs_kit.REFUNDS == []


def test_another_machine_cannot_resume_without_a_token(db):
    with client_for(make_app(db)) as local, client_for(make_app(db), client=REMOTE) as remote:
        # the page seen from elsewhere has its buttons disabled, with the reason
        assert "acting on a run is allowed only from this machine" in remote.get("/runs/refund-1").text
        csrf = csrf_of(local.get("/runs/refund-1").text)
        # even with a valid form, a POST from elsewhere is refused
        assert post(remote, "refund-1", csrf).status_code == 403
    assert status_of(db, "refund-1") == "paused" and runs_kit.REFUNDS == []


def test_with_a_token_configured_the_token_is_required_from_anywhere(db):
    app = make_app(db, token=TOKEN)
    with client_for(app, client=REMOTE) as remote, client_for(app, client=LOCAL) as local:
        page = remote.get("/runs/refund-1").text
        assert 'name="token"' in page
        csrf = csrf_of(page)
        assert post(local, "refund-1", csrf).status_code == 403  # no token, even from this machine
        assert post(remote, "refund-1", csrf, token="wrong-token").status_code == 403
        assert status_of(db, "refund-1") == "paused"
        answer = post(remote, "refund-1", csrf, token=TOKEN)
        assert answer.status_code == 303
    assert status_of(db, "refund-1") == "done"


def test_the_token_can_come_in_a_header(db):
    with client_for(make_app(db, token=TOKEN), client=REMOTE) as remote:
        csrf = csrf_of(remote.get("/runs/refund-1").text)
        answer = remote.post(
            "/runs/refund-1/resume",
            data={"csrf": csrf, "decision": "approve"},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
    assert answer.status_code == 303


def test_a_missing_or_stale_csrf_token_is_refused(local, db):
    assert post(local, "refund-1", "0" * 64).status_code == 409
    assert post(local, "refund-1", "").status_code == 409
    # a form made for refund-1 does not work for refund-... of another run or step
    other = csrf_of(local.get("/runs/refund-1").text)
    assert post(local, "refund-2", other).status_code == 409
    assert status_of(db, "refund-1") == "paused"


def test_a_cross_site_post_is_refused(local, db):
    csrf = csrf_of(local.get("/runs/refund-1").text)
    answer = local.post(
        "/runs/refund-1/resume",
        data={"csrf": csrf, "decision": "approve"},
        headers={"Origin": "https://evil.example"},
    )
    assert answer.status_code == 403
    assert status_of(db, "refund-1") == "paused"


def test_the_second_of_two_decisions_is_refused(local, db):
    csrf = csrf_of(local.get("/runs/refund-1").text)
    assert post(local, "refund-1", csrf).status_code == 303
    again = post(local, "refund-1", csrf, "deny")
    assert again.status_code == 409
    assert runs_kit.REFUNDS == ["order-1"] and status_of(db, "refund-1") == "done"


def test_without_the_app_the_buttons_are_disabled_with_a_note(db):
    with client_for(make_app(db, flows=None)) as client:
        html = client.get("/runs/refund-1").text
        assert "start the viewer with --app module:attr" in html
        assert 'name="csrf"' not in html and "disabled" in html
        assert post(client, "refund-1", "0" * 64).status_code == 409


def test_a_run_with_a_principal_cannot_be_resumed_here(local, db):
    assert post(local, "refund-2", "0" * 64).status_code == 409
    assert status_of(db, "refund-2") == "paused"


def test_a_post_that_is_not_a_decision_is_refused(local):
    assert local.post("/runs/refund-1/resume", data={"decision": "maybe"}).status_code == 400
    assert local.post("/runs/refund-1/resume", json={"decision": "approve"}).status_code == 400
