"""The viewer and flow versions: a run on a version its app lacks is shown as needing migration, and left alone."""

from __future__ import annotations

import runs_kit
from runs_kit import stored
from viewer_kit import client_for, make_app


def test_a_run_on_a_version_the_app_lacks_is_shown_as_needing_migration_and_no_action_is_taken(db):
    # Given a viewer whose app has only version 2 of the refunds flow, and refund-1 paused on version 1
    before = stored(db, "refund-1")
    with client_for(make_app(db, flows=runs_kit.app_v2)) as client:
        page = client.get("/runs/refund-1").text
        # When an operator posts an action anyway (the page offers none: it shows each disabled, with why)
        answer = client.post("/runs/refund-1/cancel", data={"reason": "old version", "csrf": "0" * 64})
        current = client.get("/runs/order-1").text
    # Then the page says it needs migration and how, and the action is refused without touching the run
    assert "needs migration" in page and "agentflow migrate refund-1 --to VERSION" in page
    assert "/runs/refund-1/cancel" not in page
    assert "<dt>Version</dt><dd>1</dd>" in page
    assert answer.status_code == 409 and "needs migration" in answer.text
    assert stored(db, "refund-1") == before
    # And a finished run of a flow the app knows is not marked
    assert "needs migration" not in current
