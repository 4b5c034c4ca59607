"""Flower tells the truth about workers: it knows only the real ones, and a LOST task names the worker that died.

A superstep that settles an earlier task (``LOST``: its worker died; ``ANSWERED``: its question
was answered) sends that task's event under its own worker's node name, never Celery's
anonymous ``gen<pid>@<host>`` (which Flower would list as a worker, online for two minutes).
A client's cancel leaves the settling to a worker (``agentflow.mark_answered``). Flower is read
through its HTTP API: its event state (``/api/workers?status=true``) and its workers page's list.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from _kit.poll import until
from celery_kit import Deployment
from flower_kit import (
    PASSWORD,
    USER,
    final,
    inside_hold_seats,
    recovered_task,
    tasks,
    until_listed,
    workers_known,
    workers_listed,
)

pytestmark = [pytest.mark.celery, pytest.mark.redis, pytest.mark.timeout(180)]

HOST = socket.gethostname()
W1, W2 = f"w1@{HOST}", f"w2@{HOST}"


async def _until_offline(flower: str, name: str) -> dict[str, bool]:
    """Wait until Flower counts worker `name` offline (its heartbeats stopped); return every worker it knows then."""

    async def known() -> dict[str, bool] | None:
        seen = await asyncio.to_thread(workers_known, flower)
        return seen if seen.get(name) is False else None

    return await until(known, f"Flower counting {name} offline", timeout_s=30, every=0.3)


def _workers_of_tasks(flower: str) -> set[Any]:
    """The names in the Worker column of every task Flower lists (None: a task no worker took yet)."""
    return {t["worker"] for t in tasks(flower)}


async def test_flower_names_the_worker_that_died_on_its_lost_task_and_counts_it_offline(deployment: Deployment) -> None:
    # Given Flower, beat, and a ticket run whose worker w1 is SIGKILLed (all its processes) inside hold_seats
    flower, run_id = await inside_hold_seats(deployment, "lost")
    pool = deployment.children("w1")
    deployment.kill_group("w1")
    # When w2 starts and recovers the run
    deployment.start_worker("w2")
    assert (await deployment.client.settle(run_id, timeout_s=60)).status == "done"
    # Then the task w1 died in is LOST, and its result names w1 as the worker it was lost on
    recovery = recovered_task(flower, run_id)
    lost = until_listed(flower, run_id, lambda t: t["uuid"] != recovery["uuid"], state="LOST")
    pid = lost["outcome"].get("lost_pid")
    assert lost["outcome"] == {"run_id": run_id, "recovered_by": recovery["uuid"], "lost_on": W1, "lost_pid": pid}
    assert pid in pool  # and the pool process of w1 it ran in
    # and its Worker column names the live worker that marked it lost (naming w1 there would count w1 online)
    assert lost["worker"] == W2
    # and once w1's heartbeats stopped, Flower counts it offline and knows no worker but w1 and w2
    assert await _until_offline(flower, W1) == {W1: False, W2: True}
    assert workers_listed(flower) == {W1: False, W2: True}
    assert _workers_of_tasks(flower) <= {W1, W2, None}


async def test_flower_knows_no_pseudo_worker_after_a_cancel_and_a_decision(deployment: Deployment) -> None:
    # Given Flower, a ticket run parked on its charge in doubt (w1 died in it, w2 parked it), and a paused run
    flower = deployment.start_flower(f"{USER}:{PASSWORD}")
    parked = await deployment.parked_run("w1", "w2")
    paused = await deployment.client.start("fanout", {"show": "wire"}, run_id=f"{deployment.prefix}-paused")
    assert (await deployment.client.settle(paused, timeout_s=30)).status == "paused"
    asking = until_listed(flower, paused, final, state="PAUSED")
    # When a client cancels the paused run and an operator decides on the parked one
    assert await deployment.client.cancel(paused, reason="not wanted", operator="bob") == "cancelled"
    await deployment.client.decide_in_doubt(parked, operator="alice")
    assert (await deployment.client.settle(parked, timeout_s=30)).status == "done"
    # Then the task that asked for the approval is ANSWERED, moved by a worker (w2, the only one alive)
    answered = until_listed(flower, paused, lambda t: t["uuid"] == asking["uuid"], state="ANSWERED")
    assert answered["outcome"] == {"run_id": paused, "answered_by": "cancel"}
    assert answered["worker"] == W2
    assert deployment.celery_app.AsyncResult(asking["uuid"]).state == "ANSWERED"
    # and so is the task that parked the run on its charge, by the superstep that spent the decision
    decided = until_listed(flower, parked, lambda t: t["parsed_args"][3] != "rerun", state="ANSWERED")
    assert decided["worker"] == W2
    # and Flower knows w1 and w2 only, in its event state, on its workers page and in its tasks' Worker column
    assert await _until_offline(flower, W1) == {W1: False, W2: True}
    assert workers_listed(flower) == {W1: False, W2: True}
    assert _workers_of_tasks(flower) <= {W1, W2, None}
