"""The viewer's pages through Starlette's TestClient: lists, marks, run details, what is never shown."""

from __future__ import annotations

import re

import httpx2
import runs_kit
from starlette.testclient import TestClient
from viewer_kit import client_for, csrf_of, make_app

from agentflow.exec.seal import Sealer


def row_of(html: str, run_id: str) -> str:
    found = re.search(rf'<tr[^>]*data-run="{re.escape(run_id)}".*?</tr>', html, re.S)
    assert found, f"no row for {run_id}"
    return found.group(0)


def test_the_list_shows_each_run_with_status_and_marks(db, local):
    # tamper-1's checkpoint 1 is changed; the list reads heads only, so change its head too
    runs_kit.tamper(db, "tamper-1", 2)
    page = local.get("/")
    assert page.status_code == 200
    html = page.text
    # order-2's worker was killed and another claimed it: not something a person needs to see in the list
    assert "claimed" not in row_of(html, "order-2") and 'class="status done">done' in row_of(html, "order-2")
    assert 'class="status paused">paused' in row_of(html, "refund-1")
    assert 'class="status running">running' in row_of(html, "ship-1")
    corrupt = row_of(html, "tamper-1")
    assert 'class="pill corrupt">corrupt' in corrupt and "signature does not match" in corrupt
    assert "shipping" not in corrupt
    # the counts at the top (of this page)
    assert "claimed" not in html.split("<table", 1)[0]
    assert "1 corrupt" in html and "2 paused" in html
    # and where to see what a head does not say (a recovery, calls in doubt, older rows)
    assert "checks each run's latest checkpoint only" in html


def test_a_run_parked_on_calls_in_doubt_is_listed_as_waiting_for_a_decision_with_a_counter_and_a_filter(db, local):
    # Given ship-1 parked by a worker on its call in doubt
    runs_kit.as_worker(db, "park", "ship-1")
    # When the list is shown
    html = local.get("/").text
    # Then the run reads as waiting for a decision, not as a blue "running", and the page counts it
    row = row_of(html, "ship-1")
    assert 'class="status decision"' in row and "waiting for a decision" in row and "running" not in row
    assert "1 waiting for a decision" in html
    # And the filter for it lists exactly the runs that wait for a person's decision
    waiting = local.get("/?status=decision").text
    assert re.findall(r'data-run="([^"]+)"', waiting) == ["ship-1"]
    assert '<option value="decision" selected>waiting for a decision</option>' in waiting


def test_a_run_whose_older_rows_were_changed_is_corrupt_on_its_page_not_in_the_list(local):
    # Only tamper-1's checkpoint 1 is changed: its head checks, so the list shows it as done...
    assert 'class="status done">done' in row_of(local.get("/").text, "tamper-1")
    # ...and its own page, which checks every row, shows it as corrupt
    assert "Rows of this run fail their check" in local.get("/runs/tamper-1").text


def test_the_list_filters_by_flow_and_status(db, local):
    runs_kit.tamper(db, "tamper-1", 2)
    by_flow = local.get("/?flow=refunds").text
    assert 'data-run="refund-1"' in by_flow and 'data-run="order-1"' not in by_flow
    by_status = local.get("/?status=done").text
    assert 'data-run="order-1"' in by_status and 'data-run="refund-1"' not in by_status
    corrupt = local.get("/?status=corrupt").text
    assert re.findall(r'data-run="([^"]+)"', corrupt) == ["tamper-1"]
    assert "No runs match these filters" in local.get("/?flow=nothing").text


def test_the_run_page_shows_timeline_state_calls_and_recovery(local):
    html = local.get("/runs/order-2").text
    assert "claimed by a recovery" in html and "segment 3" in html
    assert "claim (recovery)" in html
    assert "tickets for Tosca sent" in html  # the state at the latest checkpoint
    assert "rerun after recovery" in html
    assert "reran 1 call that was in doubt" in html


def test_a_tampered_run_is_shown_as_corrupt_never_as_data(local):
    html = local.get("/runs/tamper-1").text
    assert "Rows of this run fail their check" in html
    assert "checkpoint 1 of run &#39;tamper-1&#39;: signature does not match" in html
    assert "berlin" not in html.lower() and "shipping" not in html


def test_the_wrong_key_shows_every_run_as_corrupt(db):
    with client_for(make_app(db, key=b"k" * 32)) as client:
        html = client.get("/").text
    assert html.count('<tr class="row-corrupt"') == 7
    assert "No run checks with the key this viewer was given" in html
    assert "Tosca" not in html


def test_the_principal_and_its_proof_are_never_shown(local):
    html = local.get("/runs/refund-2").text
    assert "alice" in html and "t-9" in html
    assert re.search(r"<dt>Principal</dt><dd>set</dd>", html)
    proof = Sealer(runs_kit.KEY).principal_proof("refund-2", runs_kit.PRINCIPAL)
    assert runs_kit.PRINCIPAL not in html and proof.split(":")[1] not in html
    # and such a run cannot be approved from the viewer, which does not hold the principal
    assert "acts for a principal" in html


def test_an_unknown_run_is_404(local):
    page = local.get("/runs/no-such-run")
    assert page.status_code == 404
    assert "The store holds no run" in page.text


def test_run_ids_with_slashes_and_markup_are_escaped(db, local):
    async def add() -> None:
        from agentflow.exec.checkpoints import SQLiteCheckpointStore

        async with SQLiteCheckpointStore(db) as store:
            await runs_kit.app.runner(store, runs_kit.KEY).run(
                runs_kit.refunds, {"order": "x", "amount": 1}, run_id="a/<b>"
            )

    runs_kit.in_thread(add)
    assert 'href="/runs/a%2F%3Cb%3E"' in local.get("/").text
    page = local.get("/runs/a%2F%3Cb%3E")
    assert page.status_code == 200 and "a/&lt;b&gt;" in page.text and "<b>" not in page.text


def test_pages_carry_security_headers_and_static_files_are_served(local):
    page = local.get("/")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-content-type-options"] == "nosniff"
    assert local.get("/static/viewer.css").status_code == 200
    assert "confirm" in local.get("/static/viewer.js").text


def test_an_unreachable_store_is_a_503_page(tmp_path):
    from agentflow.exec.checkpoints.urls import open_store
    from agentflow.viewer import ViewerSettings, create_app

    store = open_store("redis://127.0.0.1:1/0?prefix=t")
    with client_for(create_app(ViewerSettings(store, [runs_kit.KEY]))) as client:
        page = client.get("/")
    assert page.status_code == 503 and "cannot reach" in page.text


def test_mounted_under_a_prefix_every_link_keeps_it(db):
    from starlette.applications import Starlette
    from starlette.routing import Mount

    outer = Starlette(routes=[Mount("/ops/agentflow", app=make_app(db))])
    with client_for(outer) as client:
        html = client.get("/ops/agentflow/").text
        assert 'href="/ops/agentflow/runs/order-2"' in html
        assert 'href="/ops/agentflow/static/viewer.css"' in html
        page = client.get("/ops/agentflow/runs/refund-1").text
        assert 'action="/ops/agentflow/runs/refund-1/resume"' in page
        answer = post_decision(client, "/ops/agentflow/runs/refund-1/resume", csrf_of(page))
        assert answer.headers["location"] == "/ops/agentflow/runs/refund-1?done=approved"
        assert client.get("/ops/agentflow/static/viewer.js").status_code == 200


def post_decision(client: TestClient, path: str, csrf: str) -> httpx2.Response:
    return client.post(path, data={"csrf": csrf, "decision": "approve"})
