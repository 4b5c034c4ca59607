"""A run whose worker process was SIGKILLed moves again within lease + 10 s, without beat, whichever process died.

Each test SIGKILLs a worker process at a moment that leaves a run with no live message or a
lease nobody renews: its main process holding a run's message that no pool process started
(the broker keeps it from everyone for its visibility timeout: 120 s in this kit, an hour by
default), a pool process between the save that ended a superstep and the send of the next
message, or a pool process inside a tool. No beat runs: what moves the run is a worker's
start-up sweep, or the message that Celery sends again for a task whose pool process died.
Each waits for its moment by polling (the broker's hash of unacknowledged messages, a file the
stalled process leaves, the call log), never by a guessed sleep, and checks that the run
finished with every call's effect once. (A whole worker killed inside a tool, and a new
worker killed with the recheck its start sent: tests/celery/test_recheck.py.)
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time
from typing import Any

import pytest
from _kit.poll import until
from celery_kit import Deployment

pytestmark = [pytest.mark.celery, pytest.mark.redis, pytest.mark.timeout(120)]

#: The bound of issue 51: a stranded run moves again within one lease and this much.
SLACK_S = 10.0
#: The ticket flow's calls: hold_seats (idempotent), charge_card and email_tickets (not).
TOOLS = ("hold_seats", "charge_card", "email_tickets")


async def until_moved(deployment: Deployment, run_id: str, past: int, timeout_s: float) -> float:
    """Wait until the run's latest step is past `past`; when (``time.monotonic()``)."""
    store = deployment.tasks.worker.store

    async def moved() -> float | None:
        return time.monotonic() if (await store.latest(run_id)).step > past else None

    return await until(moved, f"{run_id} moving past step {past}", timeout_s=timeout_s, every=0.05)


async def finished_once(deployment: Deployment, run_id: str) -> None:
    """The run ends done, every ticket tool having had its effect once."""
    assert (await deployment.client.settle(run_id, timeout_s=30)).status == "done"
    effects = deployment.effects()
    assert [effects[(tool, run_id)] for tool in TOOLS] == [1, 1, 1], effects


def killed_with_its_pool(deployment: Deployment, name: str, pool: list[int]) -> float:
    """SIGKILL worker `name`'s main process (its frozen pool goes with it, as the kernel ends it); when."""
    deployment.kill(name)
    killed = time.monotonic()
    for pid in pool:  # the pool dies with its parent (PR_SET_PDEATHSIG); make sure of it, stopped or not
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return killed


async def swept(deployment: Deployment, run_id: str) -> dict[str, Any] | None:
    """One sweep as beat's tick runs it, once the run counts as stranded; its result (None: not yet)."""
    row = await deployment.tasks.worker.store.latest(run_id)
    if time.time() - row.saved_at <= deployment.values["stale_after_s"]:
        return None
    result: dict[str, Any] = await asyncio.to_thread(deployment.tasks.run_recover_all, False)
    return result


async def test_a_start_message_a_dead_main_process_held_is_replaced_by_the_next_start(deployment):
    # Runs count as stranded 6 s after their last save: longer than a worker takes to start here
    deployment.configure(stale_after_s=6.0)
    lease_s = deployment.values["lease_s"]
    # Given a worker whose pool process never starts a task (frozen), and a run whose first message
    # its main process took from the broker (unacknowledged: the broker keeps it for its visibility timeout)
    deployment.start_worker("w1", concurrency=1)
    pool = await deployment.freeze_pool("w1")
    run_id = await deployment.client.start("tickets", {"show": "held"}, run_id=f"{deployment.prefix}-held")
    await deployment.until_taken(run_id, "start")
    # When its main process is SIGKILLed, nobody holding the run (no pool process started it), and a new
    # worker starts at once: its start-up sweep finds the run saved a moment ago, held by nobody
    killed = killed_with_its_pool(deployment, "w1", pool)
    deployment.start_worker("w2")
    # Then the run moves again within lease + 10 s of the kill (the start sent a recovery for the
    # moment the run counts as stranded), and finishes with each call once
    moved = await until_moved(deployment, run_id, 0, timeout_s=lease_s + SLACK_S + 20) - killed
    assert moved < lease_s + SLACK_S, f"moved {moved:.1f} s after the kill"
    assert f"af-{run_id}-0-recover-" in deployment.log("w2")
    await finished_once(deployment, run_id)


async def test_a_recovery_a_dead_main_process_held_is_sent_again_by_the_next_start(deployment):
    # Beat's back-off is a minute here (its interval): a run sent a recovery is held back that long
    deployment.configure(recover_interval_s=60.0)
    sweeper = deployment.tasks.worker
    sweeper.settings = dataclasses.replace(sweeper.settings, recover_interval_s=60.0)
    lease_s = deployment.values["lease_s"]
    # Given a worker whose pool process never starts a task (frozen)
    deployment.start_worker("w1", concurrency=1)
    pool = await deployment.freeze_pool("w1")
    # and a stranded run (step 0 saved, its first message never sent) that a sweep sent a recovery,
    # noting it (the recovering marker), which the worker's main process took from the broker
    flow = sweeper.flow_app.flow("tickets")
    run_id = (await sweeper.runner.start(flow, {"show": "lost"}, run_id=f"{deployment.prefix}-lost")).run_id
    found = await until(lambda: swept(deployment, run_id), f"a sweep sending {run_id} a recovery", timeout_s=10)
    assert found["enqueued"] == [run_id], found
    await deployment.until_taken(run_id, "recover")
    # When its main process is SIGKILLed and a new worker starts at once
    killed = killed_with_its_pool(deployment, "w1", pool)
    deployment.start_worker("w2")
    # Then the new worker's start sends the run another recovery though the marker says one is on
    # its way, and the run moves again within lease + 10 s of the kill, each call once
    moved = await until_moved(deployment, run_id, 0, timeout_s=lease_s + SLACK_S + 20) - killed
    assert moved < lease_s + SLACK_S, f"moved {moved:.1f} s after the kill"
    await finished_once(deployment, run_id)


async def test_a_run_whose_pool_process_died_between_its_save_and_its_next_message_moves_again(deployment, tmp_path):
    lease_s = deployment.values["lease_s"]
    stalled = tmp_path / "stalled"
    stalled.mkdir()
    # Given a worker whose pool process stops before it sends a -stall run's next message (`celery_flows`)
    deployment.env["AGENTFLOW_TEST_STALL_NEXT"] = str(stalled)
    deployment.start_worker("w1", concurrency=1)
    # and a run whose first superstep (hold_seats) is saved, its lease given up, its next message not sent
    run_id = await deployment.client.start("tickets", {"show": "stalled"}, run_id=f"{deployment.prefix}-stall")
    pid = int(await until(lambda: (stalled / run_id).exists() and (stalled / run_id).read_text(), "the stall"))
    step = (await deployment.tasks.worker.store.latest(run_id)).step
    # When that pool process is SIGKILLed (its main process lives, and sends its task again)
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    # Then the task sent again finds the run moved on, at rest and held by nobody, and has it
    # recovered: it moves again within lease + 10 s of the kill, and finishes with each call once
    moved = await until_moved(deployment, run_id, step, timeout_s=lease_s + SLACK_S + 20) - killed
    assert moved < lease_s + SLACK_S, f"moved {moved:.1f} s after the kill"
    await finished_once(deployment, run_id)


async def test_a_run_whose_pool_process_died_inside_a_tool_moves_again(deployment):
    lease_s = deployment.values["lease_s"]
    # Given a worker inside a run's slow (idempotent) hold_seats, which waits 1.5 s before its effect
    deployment.set_delay(1.5, 1.5)
    deployment.start_worker("w1", concurrency=1)
    run_id = await deployment.client.start("tickets", {"show": "pool"}, run_id=f"{deployment.prefix}-pool")
    await deployment.until_started(run_id, "hold_seats")
    # When its pool process is SIGKILLed (the main process lives: it gives the process up after
    # `worker_lost_wait` and sends its task again)
    (pool,) = deployment.children("w1")
    os.kill(pool, signal.SIGKILL)
    killed = time.monotonic()
    # Then the task sent again (or its recheck, once the lease ends) claims the run within lease + 10 s
    moved = await until_moved(deployment, run_id, 0, timeout_s=lease_s + SLACK_S + 20) - killed
    assert moved < lease_s + SLACK_S, f"moved {moved:.1f} s after the kill"
    await finished_once(deployment, run_id)
