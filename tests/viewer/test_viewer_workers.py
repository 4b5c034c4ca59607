"""Issue 15: the viewer in distributed mode (`ViewerSettings.workers`): the workers run the tools, never the viewer.

The first tests register the deployment's tasks in this process and record what they would
send instead of sending it: each action stores its signed decision here, sends the
superstep that spends it, and runs no tool. The last one points the viewer at real Celery
worker processes on the machine's Redis and approves a paused run: the tool ran in a
worker's process.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import ops_kit
import pytest
import runs_kit
from ops_kit import act, report_of
from test_viewer_settings import run_viewer
from viewer_kit import client_for, load_kit, make_app, settings_for

from agentflow.celery import AgentflowTasks, register_tasks
from agentflow.exec.checkpoints import SQLiteCheckpointStore
from agentflow.exec.run.view import RunReport
from agentflow.viewer import ViewerSettings, create_app

#: The module the tests' deployment is imported from, as ``--workers MODULE:ATTR`` names it.
MODULE = "viewer_test_deployment"
#: What a deployment would have sent: ``(flow, run_id, step, cause)``.
Sent = list[tuple[str, str, int, str]]


@pytest.fixture
def sent(db: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sent]:
    """The kit's runs (and quote-1, failed) with a deployment importable as ``MODULE:tasks`` that sends nothing."""
    from celery import Celery

    ops_kit.add_failed(db)
    tasks = register_tasks(
        Celery("viewer-workers"),
        ops_kit.app,
        store_factory=lambda: SQLiteCheckpointStore(db),
        checkpoint_key=runs_kit.KEY,
    )
    recorded: Sent = []

    def send(
        flow: str, run_id: str, step: int, cause: str, countdown: float | None = None, *, version: str | None = None
    ) -> str:
        recorded.append((flow, run_id, step, cause))
        return "recorded"

    monkeypatch.setattr(tasks, "send_superstep", send)
    importable(tasks, monkeypatch)
    yield recorded


def importable(tasks: AgentflowTasks, monkeypatch: pytest.MonkeyPatch) -> str:
    """Make `tasks` importable as ``MODULE:tasks`` (as ``--workers`` names a deployment's); return that path."""
    module = ModuleType(MODULE)
    module.tasks = tasks  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, MODULE, module)
    return f"{MODULE}:tasks"


def test_with_workers_each_action_is_stored_here_and_sent_to_them_and_no_tool_runs_here(db, sent):
    # Given a viewer that names the deployment's workers (and no app: it takes the workers')
    with client_for(make_app(db, flows=None, workers=f"{MODULE}:tasks")) as client:
        # When refund-1 is approved, quote-1 retried, ship-1's call said to have happened, and ship-1 forked
        approved = act(client, "refund-1", "resume", decision="approve")
        retried = act(client, "quote-1", "retry")
        (call,) = report_of(db, "ship-1").in_doubt
        decided = act(client, "ship-1", "decide", **{"call.0": call.call_id, "word.0": "happened", "result.0": '"ok"'})
        forked = act(client, "ship-1", "fork", at_step="1", patch='{"address": "Porto"}')
        page = client.get(approved.headers["location"]).text
    assert [a.status_code for a in (approved, retried, decided, forked)] == [303] * 4
    new_id = forked.headers["location"].removeprefix("/runs/").removesuffix("?done=forked")
    # Then each decision was stored here, signed by the viewer, and a superstep sent to spend it
    reports = {run_id: report_of(db, run_id) for run_id in ("refund-1", "quote-1", "ship-1", new_id)}
    assert sent == [
        ("refunds", "refund-1", reports["refund-1"].step, "resume"),
        ("quotes", "quote-1", reports["quote-1"].step, "retry"),
        ("shipping", "ship-1", reports["ship-1"].step, "rerun"),
        ("shipping", new_id, 0, "start"),
    ]
    assert [reports[r].segments[-1].how for r in ("refund-1", "quote-1", "ship-1")] == ["resume", "retry", "decision"]
    assert all(reports[r].segments[-1].operator == "viewer" for r in ("refund-1", "quote-1", "ship-1"))
    assert reports["refund-1"].segments[-1].owner == f"viewer@{socket.gethostname()}:{os.getpid()}"
    # And no tool ran here: every run waits for a worker
    assert runs_kit.REFUNDS == []
    assert {r.status for r in reports.values()} == {"running"} and reports[new_id].step == 0
    assert "a worker of the deployment carries it on" in " ".join(page.split())


def test_cancel_through_the_workers_sends_nothing(db, sent):
    with client_for(make_app(db, flows=None, workers=f"{MODULE}:tasks")) as client:
        answer = act(client, "refund-1", "cancel", reason="duplicate order")
    assert answer.status_code == 303 and answer.headers["location"] == "/runs/refund-1?done=cancelled"
    assert report_of(db, "refund-1").status == "cancelled" and sent == []


@pytest.mark.parametrize(
    ("path", "said"),
    [
        ("no_such_module_here:tasks", "--workers 'no_such_module_here:tasks': cannot import"),
        ("json:dumps", "is function, not the AgentflowTasks"),
        ("tasks", "write it as package.module:attribute"),
    ],
)
def test_a_workers_path_that_names_no_tasks_is_refused_when_the_settings_are_made(db, path, said):
    with pytest.raises(ValueError, match="--workers") as caught:
        settings_for(db, workers=path)
    assert said in str(caught.value)


def test_the_settings_load_the_workers_and_hide_them_in_a_repr(db, sent):
    settings = settings_for(db, workers=f"{MODULE}:tasks")
    assert isinstance(settings.workers, AgentflowTasks)
    assert "workers=<AgentflowTasks>" in repr(settings) and runs_kit.KEY.hex() not in repr(settings)
    create_app(settings)  # and a viewer is made from them


def test_the_command_takes_the_workers_from_its_option_or_the_environment(db, sent, monkeypatch):
    code, err, served = run_viewer(db, monkeypatch, "--workers", f"{MODULE}:tasks")
    assert code == 0, err
    assert served[0].workers is sys.modules[MODULE].tasks
    code, err, served = run_viewer(db, monkeypatch, workers=f"{MODULE}:tasks")
    assert code == 0 and served[0].workers is sys.modules[MODULE].tasks, err


def test_a_bad_workers_option_is_one_line_naming_it(db, monkeypatch):
    code, err, served = run_viewer(db, monkeypatch, "--workers", "no_such_module_here:tasks")
    assert code == 2 and served == []
    assert len(err.strip().splitlines()) == 1 and "--workers 'no_such_module_here:tasks': cannot import" in err, err


async def test_a_parked_run_offers_the_decision_and_the_workers_spend_it(monkeypatch):
    # Given the Celery tests' in-process worker set-up (sends recorded), and a mail run its worker parked:
    # the send call is in doubt and not idempotent
    worker_kit = load_kit("worker_kit", "celery")
    s = worker_kit.Setup()
    s.record_sends(monkeypatch)
    try:
        step = await s.parked("r1")
        settings = ViewerSettings(s.store, [worker_kit.KEY], workers=s.tasks, token_label="night-shift")
        with client_for(create_app(settings)) as client:
            # When its page is opened, it waits for a decision and offers the form
            page = " ".join(client.get("/runs/r1").text.split())
            assert "Waiting for a decision" in page and "Decide the calls in doubt" in page
            # and the command it suggests goes through the workers: none would run the tool in the operator's shell
            assert "agentflow decide r1 --workers ... --call CALL_ID=rerun|happened:JSON|not:REASON" in page
            assert "--app" not in page
            # And the operator says the mail went out
            call = re.search(r'name="call.0" value="([^"]+)"', page)
            assert call is not None
            fields = {"call.0": call.group(1), "word.0": "happened", "result.0": '"sent"'}
            answer = act(client, "r1", "decide", **fields)
        # Then the decision is stored, signed, and a worker is sent to spend it; the mail was not sent again here
        assert answer.status_code == 303, answer.text
        assert s.sent == [("mail", "r1", step + 1, "rerun", None)]
        assert s.effects == ["a@b"]
        body = await s.body("r1")
        assert body["claim"] == "decision" and body["operator"] == "night-shift"
    finally:
        await asyncio.to_thread(s.tasks.bridge.close)


# --- real workers ----------------------------------------------------------------------------


@pytest.mark.celery
@pytest.mark.redis
@pytest.mark.timeout(60)
async def test_approve_through_the_viewer_runs_the_tool_on_a_worker_not_in_the_viewer(
    tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from _kit.poll import until
    from _kit.tickets import Ledger

    from agentflow.exec.checkpoints import RedisCheckpointStore

    celery_kit = load_kit("celery_kit", "celery")
    deployment = celery_kit.Deployment(tmp_path, redis_url)
    try:
        # Given a deployment with one worker, and a run of it paused for approval of wire_money
        deployment.start_worker("w1")
        run_id = await deployment.client.start("fanout", {"show": "Tosca"})
        await until(lambda: _status(deployment, run_id, "paused"), f"{run_id} pausing", timeout_s=30)
        # And a viewer over the same store that names the deployment's tasks
        store = RedisCheckpointStore.from_url(redis_url, prefix=deployment.prefix)
        path = importable(deployment.tasks, monkeypatch)
        settings = ViewerSettings(store, deployment.tasks.worker.checkpoint_key, workers=path)
        # When the run is approved through the viewer
        with client_for(create_app(settings)) as client:
            answer = act(client, run_id, "resume", decision="approve")
        assert answer.status_code == 303, answer.text
        # Then a worker finished it, and wire_money ran once, in a process of that worker's pool (the ledger's pid)
        report = await until(lambda: _status(deployment, run_id, "done"), f"{run_id} finishing", timeout_s=30)
        (wired,) = [e for e in Ledger(deployment.ledger).entries() if (e.tool, e.run_id) == ("wire_money", run_id)]
        assert wired.pid != os.getpid() and wired.pid in deployment.children("w1")
        # And the approval was stored by the viewer's process, signed with its token label
        (claim,) = [c for c in report.checkpoints if c.what == "claim (resume)"]
        assert claim.by == f"viewer@{socket.gethostname()}:{os.getpid()}" and claim.operator == "viewer"
    finally:
        deployment.close()


async def _status(deployment: Any, run_id: str, status: str) -> RunReport | None:
    report: RunReport = await deployment.report(run_id)
    return report if report.status == status else None
