"""What the viewer's operator actions act on: the runs kit's store and flows, plus a flow that fails on cue.

Imported as ``ops_kit`` (tests/viewer is on ``sys.path``). `app` holds the runs kit's flows
(``refunds``, ``shipping``, on the same tool functions) and ``quotes``: one call of
``quote``, which raises while `DOWN` is set. `add_failed(db)` writes ``quote-1``, failed
because the quote service was down; it is up again afterwards, so a retry finishes it.

Runs of the kit the tests act on: refund-1 (paused for approval), refund-2 (paused, acting
for a principal), ship-1 (its ship call in doubt), order-1 (done, a flow of the demo's).
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx2
from starlette.testclient import TestClient
from viewer_kit import runs_kit

from agentflow.exec.checkpoints import SQLiteCheckpointStore
from agentflow.exec.run.read import read_run
from agentflow.exec.run.view import RunReport
from agentflow.exec.seal import Sealer

#: The runs kit's flows and ``quotes`` (which fails on cue: `runs_kit.DOWN`).
app = runs_kit.quotes_app
quotes = runs_kit.quotes
add_failed = runs_kit.add_failed


def csrf_for(page_html: str, run_id: str, action: str) -> str:
    """The CSRF token of the page's form for `action` on `run_id` (the test fails if there is none)."""
    form = re.search(rf'<form[^>]*action="[^"]*/runs/{re.escape(run_id)}/{action}".*?</form>', page_html, re.S)
    assert form, f"the page offers no {action} form"
    token = re.search(r'name="csrf" value="([0-9a-f]{64})"', form.group(0))
    assert token, f"the {action} form carries no CSRF token"
    return token.group(1)


def report_of(db: Path, run_id: str) -> RunReport:
    """The run as the read model shows it (every row checked)."""

    async def read() -> RunReport:
        async with SQLiteCheckpointStore(db) as store:
            return await read_run(store, Sealer(runs_kit.KEY), run_id)

    report: RunReport = runs_kit.in_thread(read)
    return report


def act(client: TestClient, run_id: str, action: str, **fields: str) -> httpx2.Response:
    """Open the run's page, then post its `action` form with `fields` (as a browser on the page would)."""
    csrf = csrf_for(client.get(f"/runs/{run_id}").text, run_id, action)
    return client.post(f"/runs/{run_id}/{action}", data={"csrf": csrf, **fields})
