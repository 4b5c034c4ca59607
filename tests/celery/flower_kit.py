"""Reading a real Flower (started by `celery_kit.Deployment.start_flower`) through its HTTP API, as the Flower tests do.

Imported as ``flower_kit`` (tests/celery is on ``sys.path``). Every request goes straight to
the loopback port (never through a proxy from the environment), with the tests' basic auth.
Flower learns of tasks and workers from the events the workers send: the waits poll it.
"""

from __future__ import annotations

import ast
import base64
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celery_kit import Deployment

USER, PASSWORD = "ops", "s3cret-for-this-test-only"
#: The name of a superstep sent to recover a run (causes recover, recheck and rerun).
RECOVER = "agentflow.recover_superstep"
#: Loopback requests never go through a proxy from the environment.
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def get(url: str, auth: tuple[str, str] | None = (USER, PASSWORD)) -> tuple[int, bytes]:
    """GET `url` (with basic auth unless `auth` is None): the status and the body, whatever the status."""
    request = urllib.request.Request(url)
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with DIRECT.open(request, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _json(url: str) -> Any:
    status, body = get(url)
    assert status == 200, body
    return json.loads(body)


def tasks(flower: str, **filters: str) -> list[dict[str, Any]]:
    """Flower's tasks through ``/api/tasks`` (`filters`: taskname, state, ...), each with its args parsed.

    ``parsed_args`` is ``(flow, run_id, step, cause)``; ``outcome`` is the result parsed (a dict), if any.
    """
    found = []
    for task_id, task in _json(f"{flower}/api/tasks?{urllib.parse.urlencode(filters)}").items():
        task["uuid"] = task_id
        task["parsed_args"] = ast.literal_eval(task["args"]) if task.get("args") else ()
        task["outcome"] = ast.literal_eval(task["result"]) if task.get("result") else None
        found.append(task)
    return found


def workers_known(flower: str) -> dict[str, bool]:
    """Every worker in Flower's event state, by name: online or not (``/api/workers?status=true``)."""
    known: dict[str, bool] = _json(f"{flower}/api/workers?status=true")
    return known


def workers_listed(flower: str) -> dict[str, bool]:
    """The workers Flower's workers page lists, by name: online or not (the page's own JSON, ``/workers?json=1``)."""
    return {row["hostname"]: row["status"] for row in _json(f"{flower}/workers?json=1")["data"]}


def _poll_listed(
    flower: str, run_id: str, done: Callable[[list[dict[str, Any]]], Any], timeout_s: float, filters: dict[str, str]
) -> Any:
    """Read Flower's tasks of `run_id` (under `filters`) every 0.3 s until `done` of them is not None; return that.

    Raises:
        AssertionError: `done` stayed None for `timeout_s`; says what Flower listed last.
    """
    deadline = time.monotonic() + timeout_s
    seen: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        seen = [t for t in tasks(flower, **filters) if t["parsed_args"][1:2] == (run_id,)]
        found = done(seen)
        if found is not None:
            return found
        time.sleep(0.3)  # the poll's interval: Flower learns of tasks from the workers' events
    raise AssertionError(f"Flower listed under {filters}, for {timeout_s} s, these tasks of {run_id}: {seen}")


def until_listed(
    flower: str, run_id: str, match: Callable[[dict[str, Any]], bool], timeout_s: float = 30.0, **filters: str
) -> dict[str, Any]:
    """Wait until Flower lists (under `filters`) a task of `run_id` that `match`es; return it."""
    task: dict[str, Any] = _poll_listed(
        flower, run_id, lambda seen: next((t for t in seen if match(t)), None), timeout_s, filters
    )
    return task


def until_none_listed(flower: str, run_id: str, timeout_s: float = 30.0, **filters: str) -> None:
    """Wait until Flower lists (under `filters`) no task of `run_id` (a task still running ends; a dead one stays)."""
    _poll_listed(flower, run_id, lambda seen: True if not seen else None, timeout_s, filters)


def recovered_task(flower: str, run_id: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """Wait until Flower lists a recovery superstep of `run_id` that ran and ended RECOVERED; return it.

    It is found by its name (a cause ``recover``: recover_all found the run nobody held;
    ``recheck``: the run was held when looked at first, and was looked at again when that lease
    ended) and by its state, each a filter of Flower's own.
    """
    by_name = until_listed(
        # (a recovery is shown RECOVERED from its start, before it has a result: wait for the result)
        flower, run_id, lambda t: t["state"] == "RECOVERED" and (t["outcome"] or {}).get("done") == "ran", timeout_s,
        taskname=RECOVER,
    )  # fmt: skip
    assert by_name["parsed_args"][3] in ("recover", "recheck"), by_name
    assert by_name["uuid"] in {t["uuid"] for t in tasks(flower, state="RECOVERED")}
    return by_name


def final(task: dict[str, Any]) -> bool:
    """Whether a task Flower lists has ended (in any state but those of a task not yet done)."""
    return task["state"] not in ("PENDING", "RECEIVED", "STARTED")


async def inside_hold_seats(deployment: Deployment, show: str) -> tuple[str, str]:
    """Flower, beat, and a ticket run (``<prefix>-<show>``) on worker w1, now inside its slow hold_seats.

    Returns Flower's base URL and the run id; the test kills w1 as it needs, and starts the next worker.
    """
    flower = deployment.start_flower(f"{USER}:{PASSWORD}")
    deployment.set_delay(1.5, 1.5)
    deployment.start_worker("w1")
    deployment.start_beat()
    run_id = await deployment.client.start("tickets", {"show": show}, run_id=f"{deployment.prefix}-{show}")
    await deployment.until_started(run_id, "hold_seats")
    deployment.set_delay(0.0, 0.0)  # for the workers started next
    return flower, run_id
