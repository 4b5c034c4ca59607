"""Flower, started by the test on a loopback port: how each superstep task ended, and where the recoveries are.

A superstep task ends ``SUCCESS`` when its run goes on or finished, ``FAILURE`` (with the run's
error) when the run failed, ``PAUSED`` or ``NEEDS_DECISION`` when it waits for a person, and
``RECOVERED`` when it recovered the run; a superstep sent to recover a run is named
``agentflow.recover_superstep``. Flower is read through its HTTP API and, when Chromium is
installed, in a browser (a screenshot of its tasks page goes to test-output/screenshots).
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import Ignore
from celery_kit import ROOT, Deployment
from flower_kit import (
    PASSWORD,
    RECOVER,
    USER,
    final,
    get,
    inside_hold_seats,
    recovered_task,
    tasks,
    until_listed,
    until_none_listed,
)

from agentflow import FlowApp, Registry
from agentflow.celery import AgentflowTasks, register_tasks
from agentflow.celery.worker import Outcome
from agentflow.errors import RunFailed
from agentflow.exec.checkpoints import MemoryCheckpointStore

pytestmark = [pytest.mark.celery, pytest.mark.redis, pytest.mark.timeout(180)]

CHROMIUM = "/usr/bin/chromium"
SHOTS = ROOT / "test-output" / "screenshots"
KEY = b"flower-endings-test-key-0123456789"


def _listening_addresses(port: int) -> set[str]:
    """Local addresses of the sockets listening on `port` (from /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, _remote, state = line.split()[1:4]
            address, hex_port = local.split(":")
            if state != "0A" or int(hex_port, 16) != port:  # 0A: LISTEN
                continue
            if len(address) == 8:
                found.add(".".join(str(b) for b in reversed(bytes.fromhex(address))))
            else:
                found.add("ipv6:" + address)
    return found


async def test_flower_asks_for_basic_auth_and_listens_on_loopback_only(deployment):
    # Given Flower started with basic auth from the environment on a loopback port
    flower = deployment.start_flower(f"{USER}:{PASSWORD}")
    # When the task API is asked without credentials or with a wrong password
    anonymous, _ = get(f"{flower}/api/tasks", auth=None)
    wrong, _ = get(f"{flower}/api/tasks", auth=(USER, "wrong"))
    right, body = get(f"{flower}/api/tasks")
    # Then only the right credentials get an answer
    assert (anonymous, wrong, right) == (401, 401, 200)
    assert json.loads(body) == {}
    # and Flower listens on 127.0.0.1 only
    port = int(flower.rsplit(":", 1)[1])
    assert _listening_addresses(port) == {"127.0.0.1"}


async def test_flower_lists_recovered_supersteps_with_what_they_reran(deployment):
    # Given Flower, a worker and beat (recover_all every 2 s)
    flower = deployment.start_flower(f"{USER}:{PASSWORD}")
    deployment.start_worker("w1")
    deployment.start_beat()
    # and a run whose worker is SIGKILLed in the middle of its (idempotent) slow tool
    slow = await deployment.client.start("slow", {"show": "long", "seconds": 2.0}, run_id=f"{deployment.prefix}-slow")
    await deployment.until_held(slow)
    await deployment.until_started(slow, "slow_report")
    deployment.kill("w1")
    # and a run whose step 0 was saved but whose first message was never sent (its sender died).
    # Saved after the kill: saved before, beat could hand it to w1, and w1 could die inside one
    # of its supersteps, which the recovery would then rerun.
    runner = deployment.tasks.worker.runner
    tickets = deployment.tasks.worker.flow_app.flow("tickets")
    stranded = (await runner.start(tickets, {"show": "lost"}, run_id=f"{deployment.prefix}-stranded")).run_id
    # When a new worker starts (recover_all on start-up, and from beat once the lease lapsed)
    deployment.start_worker("w2")
    views = await deployment.wait_all([stranded, slow], timeout_s=60)
    assert {v.status for v in views.values()} == {"done"}
    # Then Flower lists the recovered superstep of the slow run, and its result says what it reran
    slow_task = recovered_task(flower, slow)
    assert slow_task["outcome"]["status"] == "done"
    assert [cid.split("/")[1] for cid in slow_task["outcome"]["rerun"]] == ["report"]
    assert slow_task["worker"].startswith("w2@")
    assert deployment.effects()[("slow_report", slow)] == 1  # the cut-off call never got as far as its effect
    # and the stranded run's superstep, recovered from step 0 (nothing to replay)
    stranded_task = recovered_task(flower, stranded)
    assert stranded_task["parsed_args"][2] == 0
    assert stranded_task["outcome"]["status"] == "running" and "rerun" not in stranded_task["outcome"]
    # and Flower counted the task-recovered events the workers sent
    status, metrics = get(f"{flower}/metrics")
    assert status == 200
    counted = [
        float(m.group(1))
        for line in metrics.decode().splitlines()
        if line.startswith("flower_events_total{")
        and 'type="task-recovered"' in line
        and f'task="{RECOVER}"' in line
        and (m := re.search(r"\}\s+([0-9.e+]+)$", line))
    ]
    assert sum(counted) >= 2, metrics.decode()[-2000:]


async def test_flower_result_of_a_recovered_superstep_that_does_not_end_the_run_lists_its_reruns(deployment):
    # Given Flower, a worker and beat, and a ticket run whose idempotent first tool is slow
    flower, run_id = await inside_hold_seats(deployment, "cut")
    # When its worker is SIGKILLed inside hold_seats and a new worker takes over
    deployment.kill("w1")
    deployment.start_worker("w2")
    view = await deployment.client.settle(run_id, timeout_s=60)
    assert view.status == "done"
    # Then the recovered superstep, which reran hold_seats and left the run running, says so in its result
    task = recovered_task(flower, run_id)
    assert task["outcome"]["status"] == "running"
    assert [cid.split("/")[1] for cid in task["outcome"].get("rerun", [])] == ["hold"]
    assert "replayed" not in task["outcome"]
    # and the killed worker's task is not left STARTED: the recovery marked it LOST, in Flower and the backend
    lost = until_listed(flower, run_id, lambda t: t["uuid"] != task["uuid"], state="LOST")
    assert lost["outcome"] == {**lost["outcome"], "run_id": run_id, "recovered_by": task["uuid"]}
    assert lost["outcome"]["lost_on"] == f"w1@{socket.gethostname()}"  # the worker it died with (test_flower_workers)
    assert deployment.celery_app.AsyncResult(lost["uuid"]).state == "LOST"
    # (the run's last superstep may still be ending, its events being stored after the run is done: it is waited for;
    # a task its worker died in would stay STARTED for the broker's hour)
    until_none_listed(flower, run_id, state="STARTED")


# --- how each run's task ends -------------------------------------------------------------


class FakeTask:
    """What `AgentflowTasks.end_task` uses of a Celery task: its request, update_state and send_event."""

    def __init__(self, *, redelivered: bool = False) -> None:
        self.request = SimpleNamespace(
            id="task-1", delivery_info={"redelivered": redelivered}, retries=0, hostname="w1@host"
        )
        self.states: list[tuple[str, dict[str, Any]]] = []
        self.events: list[tuple[str, dict[str, Any]]] = []

    def update_state(self, *, state: str, meta: dict[str, Any]) -> None:
        self.states.append((state, meta))

    def send_event(self, kind: str, **fields: Any) -> None:
        self.events.append((kind, fields))


@pytest.fixture
def bare_tasks() -> AgentflowTasks:
    """agentflow's tasks on an app with no broker behind it (nothing here is sent)."""
    return register_tasks(
        Celery("flower-endings"), FlowApp(Registry(), []), store_factory=MemoryCheckpointStore, checkpoint_key=KEY
    )


def ran(status: str, **more: Any) -> Outcome:
    """The outcome of a superstep of run r1 that ran and left the run `status`."""
    return Outcome("r1", "tickets", "ran", status, 2, **more)


@pytest.mark.parametrize(
    ("outcome", "cause", "redelivered", "state"),
    [
        (ran("paused"), "next", False, "PAUSED"),
        (ran("paused"), "recover", False, "PAUSED"),
        (Outcome("r1", "tickets", "decision", why="charge_card: in doubt"), "recheck", False, "NEEDS_DECISION"),
        (ran("running"), "recover", False, "RECOVERED"),
        (ran("done", rerun=["1/pay/0/ab"]), "rerun", False, "RECOVERED"),
        (ran("running"), "next", True, "RECOVERED"),  # a redelivered handoff
        (ran("running", rerun=["1/pay/0/ab"]), "next", False, "RECOVERED"),  # found one cut off
        (ran("cancelled"), "next", False, "CANCELLED"),  # the superstep honoured a cancel request
        (Outcome("r1", "tickets", "skipped", why="held"), "recheck", False, "SKIPPED"),  # nothing moved
        (Outcome("r1", "tickets", "conflict", why="moved on"), "next", False, "SKIPPED"),
        (Outcome("r1", "tickets", "elsewhere", version="2"), "next", False, "SKIPPED"),  # sent on to its queue
        (Outcome("r1", "tickets", "refused", why="no decision"), "rerun", False, "REFUSED"),
    ],
    ids=[
        "paused",
        "paused-on-recovery",
        "needs-decision",
        "recovered",
        "rerun",
        "redelivered",
        "cut-off-handoff",
        "cancelled",
        "skipped-recheck",
        "conflict",
        "sent-on",
        "refused",
    ],
)
def test_a_task_whose_run_waits_or_recovered_ends_in_its_own_state_with_its_result(
    bare_tasks, outcome, cause, redelivered, state
):
    task = FakeTask(redelivered=redelivered)
    # When the task ends
    with pytest.raises(Ignore):
        bare_tasks.end_task(task, outcome, cause, runtime_s=0.25)
    # Then its state is stored with the result as meta, and one event shows it in Flower (result and runtime)
    assert task.states == [(state, outcome.as_dict())]
    shown = {"result": repr(outcome.as_dict()), "run_id": "r1", "runtime": 0.25}
    assert task.events == [(f"task-{state.lower()}", shown)]


@pytest.mark.parametrize(
    ("outcome", "cause"),
    [
        (ran("running"), "next"),
        (ran("done"), "start"),
        (ran("running", replayed=["1/pay/0/ab"]), "resume"),
    ],
    ids=["handoff", "start-to-end", "resume"],
)
def test_a_task_whose_run_goes_on_succeeds_with_its_result(bare_tasks, outcome, cause):
    task = FakeTask()
    assert bare_tasks.end_task(task, outcome, cause) == outcome.as_dict()
    assert (task.states, task.events) == ([], [])


def test_a_task_whose_run_failed_raises_run_failed_with_the_runs_error(bare_tasks):
    task = FakeTask()
    outcome = ran("failed", why="ValueError: boom")
    with pytest.raises(RunFailed) as raised:
        bare_tasks.end_task(task, outcome, "next")
    assert (raised.value.run_id, raised.value.error) == ("r1", "ValueError: boom")
    assert str(raised.value) == "run 'r1' failed: ValueError: boom"
    assert (task.states, task.events) == ([], [])  # Celery records FAILURE and sends task-failed itself
    # and the task does not retry it: it acknowledges a failure, and retries nothing on an exception
    superstep = bare_tasks.superstep
    assert (superstep.acks_late, superstep.acks_on_failure, getattr(superstep, "autoretry_for", ())) == (True, True, ())
    assert RunFailed in superstep.throws  # an outcome, logged without a traceback


@pytest.mark.parametrize(
    ("flow", "cause", "name"),
    [
        ("tickets", "start", "agentflow.start_run"),
        ("tickets", "next", "agentflow.superstep"),
        ("tickets", "resume", "agentflow.superstep"),
        ("tickets", "recover", RECOVER),
        ("tickets", "recheck", RECOVER),
        ("tickets", "rerun", RECOVER),
        ("loop:refunds", "next", "agentflow.loop_stage"),
        ("loop:refunds", "recover", RECOVER),
    ],
)
def test_a_superstep_sent_to_recover_a_run_is_sent_under_its_own_name(bare_tasks, monkeypatch, flow, cause, name):
    sent: list[str] = []
    for handle in ("start_run", "superstep", "recover_superstep", "loop_stage"):
        task = getattr(bare_tasks, handle)
        monkeypatch.setattr(task, "apply_async", lambda *a, _name=task.name, **k: sent.append(_name))
    bare_tasks.send_superstep(flow, "r1", 3, cause)
    assert sent == [name]


@dataclass
class Endings:
    """Runs of one deployment that ended each way a superstep task can show."""

    parked: str
    """Parked on charge_card in doubt, then decided by alice: rerun, and finished."""
    paused: str
    """A fanout run paused for wire_money's approval."""
    failed: str
    """A ticket run whose hold_seats raised."""


async def _every_ending(deployment: Deployment) -> Endings:
    """Runs that end each way, one after the other (Flower must be started first, to see their events).

    A ticket run parked on charge_card in doubt (its worker w1 was SIGKILLed right after the
    charge; w2 parked it), a fanout run paused for an approval, the parked run decided by an
    operator (the charge reruns and the run finishes), and, on a worker w3 whose tools raise,
    a ticket run that fails.
    """
    parked = await deployment.parked_run("w1", "w2")
    paused = await deployment.client.start("fanout", {"show": "wire"}, run_id=f"{deployment.prefix}-paused")
    assert (await deployment.client.settle(paused, timeout_s=30)).status == "paused"
    await deployment.client.decide_in_doubt(parked, operator="alice")
    assert (await deployment.client.settle(parked, timeout_s=30)).status == "done"
    deployment.kill_group("w2")
    deployment.break_tools()
    deployment.start_worker("w3")
    failed = await deployment.client.start("tickets", {"show": "broken"}, run_id=f"{deployment.prefix}-failed")
    view = await deployment.client.settle(failed, timeout_s=30)
    assert view.status == "failed" and view.error is not None and "broken" in view.error, view
    return Endings(parked, paused, failed)


async def test_flower_shows_failed_paused_decision_and_recovered_tasks_apart_from_success(deployment):
    # Given Flower, and runs that failed, paused, waited for a decision and were recovered
    flower = deployment.start_flower(f"{USER}:{PASSWORD}")
    runs = await _every_ending(deployment)
    error = (await deployment.client.status(runs.failed)).error
    assert error is not None

    # Then the failed run's task is FAILURE, with a RunFailed that carries the run's error
    failed = until_listed(flower, runs.failed, final, state="FAILURE")
    assert failed["name"] == "agentflow.start_run"
    assert failed["exception"].startswith("RunFailed(") and error in ast.literal_eval(failed["exception"][9:])
    assert [t["state"] for t in tasks(flower) if t["parsed_args"][1:2] == (runs.failed,)] == ["FAILURE"]
    # and the result backend holds the same error, rebuilt as the agentflow error
    backend = deployment.celery_app.AsyncResult(failed["uuid"])
    assert backend.state == "FAILURE"
    assert type(backend.result).__name__ == "RunFailed" and backend.result.error == error
    assert str(backend.result) == f"run {runs.failed!r} failed: {error}"

    # and the paused run's last task is PAUSED, its result saying so (the one before it succeeded)
    paused = until_listed(flower, runs.paused, final, state="PAUSED")
    assert paused["name"] == "agentflow.superstep" and paused["outcome"]["status"] == "paused"
    states = sorted(t["state"] for t in tasks(flower) if t["parsed_args"][1:2] == (runs.paused,))
    assert states == ["PAUSED", "SUCCESS"], states
    assert paused["runtime"] is not None and paused["runtime"] > 0  # Flower's Runtime column, as for SUCCESS
    assert deployment.celery_app.AsyncResult(paused["uuid"]).state == "PAUSED"
    assert deployment.celery_app.AsyncResult(paused["uuid"]).info == paused["outcome"]

    # and the superstep that parked the run on a call in doubt is a recovery which ended NEEDS_DECISION, and
    # is ANSWERED now that alice decided: `state:NEEDS_DECISION` lists what waits for a person now, not it
    rerun = until_listed(
        flower, runs.parked, lambda t: t["parsed_args"][3] == "rerun" and t["outcome"], state="RECOVERED"
    )
    waiting = until_listed(flower, runs.parked, lambda t: t["parsed_args"][3] != "rerun", state="ANSWERED")
    assert waiting["name"] == RECOVER and waiting["parsed_args"][3] in ("recover", "recheck")
    assert waiting["outcome"] == {"run_id": runs.parked, "answered_by": rerun["uuid"]}
    assert deployment.celery_app.AsyncResult(waiting["uuid"]).state == "ANSWERED"
    assert not [t for t in tasks(flower, state="NEEDS_DECISION") if t["parsed_args"][1:2] == (runs.parked,)]

    # and the rerun alice decided is a recovery that ended RECOVERED, listing the call it reran
    assert rerun["name"] == RECOVER
    assert [cid.split("/")[1] for cid in rerun["outcome"]["rerun"]] == ["pay"]
    # and filtering by the name lists the recoveries only, whatever state they ended in
    recoveries = tasks(flower, taskname=RECOVER)
    assert {waiting["uuid"], rerun["uuid"]} <= {t["uuid"] for t in recoveries}
    assert {t["parsed_args"][3] for t in recoveries} <= {"recover", "recheck", "rerun"}

    # and none of those messages is left unacknowledged: neither retried nor to be redelivered
    ended = {failed["uuid"], paused["uuid"], waiting["uuid"], rerun["uuid"]}
    assert ended.isdisjoint(deployment.unacked())
    assert "raised expected: RunFailed(" in deployment.log("w3")


def _browser() -> Any:
    """Headless Chromium through Playwright, or a skip (a failure on CI) when either is missing."""
    reason = None
    if not Path(CHROMIUM).exists():
        reason = f"Chromium is not installed at {CHROMIUM} (apt-get install chromium)"
    else:
        try:
            from playwright.sync_api import sync_playwright
        except ImportError as exc:
            reason = f"playwright is not installed ({exc})"
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must provide it", pytrace=False)
        pytest.skip(reason)
    return sync_playwright


def _shoot_tasks_page(flower: str, queries: list[str], shot: Path) -> dict[str, list[tuple[str, str]]]:
    """Open Flower's tasks page at each query in headless Chromium: the (name, state) of each row shown.

    Each page is saved as a screenshot beside `shot` (named after its query). Playwright's sync
    API runs its own event loop: call this on a thread, not in the test's loop.
    """
    sync_playwright = _browser()
    seen: dict[str, list[tuple[str, str]]] = {}
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            context = browser.new_context(
                viewport={"width": 1500, "height": 900}, http_credentials={"username": USER, "password": PASSWORD}
            )
            for query in queries:
                page = context.new_page()
                page.goto(f"{flower}/tasks{query}")
                page.wait_for_selector("#tasks-table tbody tr td .badge", timeout=15_000)
                rows = page.locator("#tasks-table tbody tr")
                names = rows.locator("td:nth-child(1)").all_inner_texts()
                states = rows.locator("td .badge").all_inner_texts()
                seen[query] = list(zip(names, states, strict=True))
                page.screenshot(path=str(shot.with_name(f"{shot.stem}{_slug(query)}{shot.suffix}")), full_page=True)
                page.close()
        finally:
            browser.close()
    return seen


def _slug(query: str) -> str:
    return re.sub(r"[^a-zA-Z0-9]+", "-", query).rstrip("-").lower()


async def test_flower_tasks_page_in_a_browser_shows_each_ending_and_filters_recoveries(deployment):
    _browser()  # skip before building a deployment's runs when no browser is there
    # Given Flower, and runs that failed, paused, waited for a decision and were recovered
    flower = deployment.start_flower(f"{USER}:{PASSWORD}")
    runs = await _every_ending(deployment)
    until_listed(flower, runs.failed, final, state="FAILURE")
    until_listed(flower, runs.parked, lambda t: t["parsed_args"][3] == "rerun" and t["outcome"], state="RECOVERED")
    # When a person opens the tasks page: all tasks, then filtered by state and by name
    SHOTS.mkdir(parents=True, exist_ok=True)
    queries = ["", "?state=RECOVERED", "?name=agentflow.recover_superstep", "?state=PAUSED"]
    seen = await asyncio.to_thread(_shoot_tasks_page, flower, queries, SHOTS / "flower-tasks.png")
    # Then the page shows each ending as its own state badge, not SUCCESS
    assert {"FAILURE", "PAUSED", "ANSWERED", "LOST", "RECOVERED", "SUCCESS"} <= {state for _, state in seen[""]}
    # and the state filter and the name filter list the recoveries
    assert seen["?state=RECOVERED"] and {state for _, state in seen["?state=RECOVERED"]} == {"RECOVERED"}
    assert seen["?name=agentflow.recover_superstep"]
    assert {name for name, _ in seen["?name=agentflow.recover_superstep"]} == {RECOVER}
    assert {state for _, state in seen["?name=agentflow.recover_superstep"]} >= {"ANSWERED", "RECOVERED"}
    # and what waits for a person now is one filter per question, listing only the open ones
    assert [state for _, state in seen["?state=PAUSED"]] == ["PAUSED"]
    assert (SHOTS / "flower-tasks.png").exists()
