"""Flower, started by the test on a loopback port, shows recovered supersteps (and asks for a password)."""

from __future__ import annotations

import ast
import base64
import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.celery, pytest.mark.redis, pytest.mark.timeout(180)]

USER, PASSWORD = "ops", "s3cret-for-this-test-only"
#: The causes of a superstep sent to a run whose worker may be gone.
RECOVERING = ("recover", "recheck")
#: Loopback requests never go through a proxy from the environment.
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _get(url: str, auth: tuple[str, str] | None = (USER, PASSWORD)) -> tuple[int, bytes]:
    request = urllib.request.Request(url)
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with DIRECT.open(request, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _superstep_tasks(flower: str) -> list[dict[str, Any]]:
    """Flower's agentflow.superstep tasks, each with its args parsed: (flow, run_id, step, cause)."""
    status, body = _get(f"{flower}/api/tasks?taskname=agentflow.superstep")
    assert status == 200, body
    tasks = []
    for task_id, task in json.loads(body).items():
        task["uuid"] = task_id
        task["parsed_args"] = ast.literal_eval(task["args"]) if task.get("args") else ()
        tasks.append(task)
    return tasks


def _recovered_task(flower: str, run_id: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """Wait until Flower lists a finished superstep of `run_id` that recovered it.

    Its cause is ``recover`` (recover_all found the run nobody held) or ``recheck`` (the run
    was held when looked at first, and was looked at again when that lease ended).
    """
    deadline = time.monotonic() + timeout_s
    seen: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        seen = [t for t in _superstep_tasks(flower) if t["parsed_args"][1:2] == (run_id,)]
        for task in seen:
            if task["parsed_args"][3] in RECOVERING and task["state"] == "SUCCESS":
                result = ast.literal_eval(task["result"])
                if result["done"] == "ran":
                    return {**task, "outcome": result}
        time.sleep(0.3)
    raise AssertionError(f"Flower lists no recovered superstep of {run_id}: {seen}")


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
    anonymous, _ = _get(f"{flower}/api/tasks", auth=None)
    wrong, _ = _get(f"{flower}/api/tasks", auth=(USER, "wrong"))
    right, body = _get(f"{flower}/api/tasks")
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
    slow_task = _recovered_task(flower, slow)
    assert slow_task["outcome"]["status"] == "done"
    assert [cid.split("/")[1] for cid in slow_task["outcome"]["rerun"]] == ["report"]
    assert slow_task["worker"].startswith("w2@")
    assert deployment.effects()[("slow_report", slow)] == 1  # the cut-off call never got as far as its effect
    # and the stranded run's superstep, recovered from step 0 (nothing to replay)
    stranded_task = _recovered_task(flower, stranded)
    assert stranded_task["parsed_args"][2] == 0
    assert stranded_task["outcome"]["status"] == "running" and "rerun" not in stranded_task["outcome"]
    # and Flower counted the task-recovered events the workers sent
    status, metrics = _get(f"{flower}/metrics")
    assert status == 200
    counted = [
        float(m.group(1))
        for line in metrics.decode().splitlines()
        if line.startswith("flower_events_total{")
        and 'type="task-recovered"' in line
        and 'task="agentflow.superstep"' in line
        and (m := re.search(r"\}\s+([0-9.e+]+)$", line))
    ]
    assert sum(counted) >= 2, metrics.decode()[-2000:]


async def test_flower_result_of_a_recovered_superstep_that_does_not_end_the_run_lists_its_reruns(deployment):
    # Given Flower, a worker and beat, and a ticket run whose idempotent first tool is slow
    flower = deployment.start_flower(f"{USER}:{PASSWORD}")
    deployment.set_delay(1.5, 1.5)
    deployment.start_worker("w1")
    deployment.start_beat()
    run_id = await deployment.client.start("tickets", {"show": "cut"}, run_id=f"{deployment.prefix}-cut")
    # When its worker is SIGKILLed inside hold_seats and a new worker takes over
    await deployment.until_started(run_id, "hold_seats")
    deployment.kill("w1")
    deployment.set_delay(0.0, 0.0)
    deployment.start_worker("w2")
    view = await deployment.client.wait(run_id, timeout_s=60)
    assert view.status == "done"
    # Then the recovered superstep, which reran hold_seats and left the run running, says so in its result
    task = _recovered_task(flower, run_id)
    assert task["outcome"]["status"] == "running"
    assert [cid.split("/")[1] for cid in task["outcome"].get("rerun", [])] == ["hold"]
    assert "replayed" not in task["outcome"]
