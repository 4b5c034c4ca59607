"""Without beat, a run whose worker was killed moves again within one lease: the next worker looks again then.

No beat process runs in this test (the deployment's ``recover_interval_s`` only configures
beat, which is never started), so nothing runs recover_all on a schedule: the only looks at
the run are the new worker's start-up recover_all and the ``recheck`` superstep it sends for
a run that was still held, due just after that lease ends. The leases last 5 s here, longer
than a worker takes to start on a machine at rest, so the new worker finds the run still held
and rechecks it (the test says which way the run moved when it fails). A worker starting later
than the lease lasts (a loaded machine: the Celery tests run on every xdist process) finds the
run free and claims it from its start-up sweep at once: the bounds count from whichever comes
last, the lease's end or the new worker's start.
"""

from __future__ import annotations

import time

import pytest
from _kit.poll import until
from celery_kit import Deployment

from agentflow.celery.worker import RECOVER_ALL_LOCK

pytestmark = [pytest.mark.celery, pytest.mark.redis, pytest.mark.timeout(120)]

#: The workers' leases: longer than a worker takes to start.
LEASE_S = 5.0
#: Time for a superstep's round trip through the broker, and a start-up sweep's (counted from the worker's start).
SLACK_S = 4.0


async def until_claimed(deployment: Deployment, run_id: str, timeout_s: float) -> int:
    """Wait until a claim checkpoint (a new segment past step 0) of the run is stored; return its step."""
    store = deployment.tasks.worker.store

    async def claimed() -> int | None:
        claims = [row.step for row in await store.history(run_id) if row.step > 0 and row.segment == row.step]
        return claims[0] if claims else None

    return await until(claimed, f"a claim of {run_id}", timeout_s=timeout_s, every=0.05)


async def killed_in_hold_seats(deployment: Deployment, name: str) -> tuple[str, float]:
    """A ticket run whose worker w1 was SIGKILLed inside its slow (idempotent) hold_seats; its id and when."""
    deployment.set_delay(3.0, 3.0)
    deployment.start_worker("w1")
    run_id = await deployment.client.start("tickets", {"show": name}, run_id=f"{deployment.prefix}-{name}")
    await deployment.until_started(run_id, "hold_seats")
    deployment.kill_group("w1")
    killed = time.monotonic()
    deployment.set_delay(0.0, 0.0)
    return run_id, killed


async def test_a_stranded_run_moves_again_within_one_lease_without_beat(deployment):
    deployment.set_lease(LEASE_S)
    margin_s = deployment.tasks.worker.settings.recheck_margin_s
    # Given one worker, no beat, and a ticket run inside its slow (idempotent) hold_seats
    # When the worker's whole process group is SIGKILLed there, and a new worker starts
    run_id, killed = await killed_in_hold_seats(deployment, "stranded")
    deployment.start_worker("w2")
    ready = time.monotonic() - killed
    # Then the run is claimed again within one lease of the kill (plus the recheck margin and some slack),
    # or, when the new worker was not up before the lease ended, at once after it is
    bound = max(LEASE_S + margin_s, ready) + SLACK_S
    step = await until_claimed(deployment, run_id, timeout_s=bound + 10)
    elapsed = time.monotonic() - killed
    how = "recheck" if f"af-{run_id}-0-recheck-" in deployment.log("w2") else "start-up recover_all"
    claim = deployment.tasks.worker.sealer.open_checkpoint(
        (await deployment.tasks.worker.store.history(run_id))[step], run_id
    )
    assert claim["claim"] == "recovery", claim
    assert elapsed < bound, (
        f"claimed {elapsed:.1f} s after the kill (bound {bound:.1f} s: lease {LEASE_S} s + margin {margin_s} s + "
        f"slack {SLACK_S} s); the new worker was ready after {ready:.1f} s; it moved by {how}"
    )
    # and it finishes, every tool having had its effect once (hold_seats never got to its effect before the kill)
    view = await deployment.client.settle(run_id, timeout_s=30)
    assert view.status == "done", view
    effects = deployment.effects()
    assert [effects[(t, run_id)] for t in ("hold_seats", "charge_card", "email_tickets")] == [1, 1, 1]
    print(f"\nclaimed {elapsed:.1f} s after the kill by {how}; new worker ready after {ready:.1f} s")


async def test_a_recheck_lost_with_the_worker_that_held_it_is_sent_again_by_the_next_start(deployment):
    # The run must still be held when the third worker has started, after two starts one after the
    # other: the lease is sized from a start timed now (a loaded machine starts a worker in seconds)
    began = time.monotonic()
    deployment.start_worker("w0")
    start_s = time.monotonic() - began
    deployment.kill_group("w0")
    lease_s = max(8.0, 2 * start_s + SLACK_S)
    deployment.set_lease(lease_s)
    margin_s = deployment.tasks.worker.settings.recheck_margin_s
    # Given a run whose worker was SIGKILLed inside its slow hold_seats (its lease has up to `lease_s` left)
    run_id, killed = await killed_in_hold_seats(deployment, "twice")
    # and a new worker whose start-up recover_all sent the run's recheck (a delayed message, which that
    # worker keeps unacknowledged until it is due) and took the recheck marker, then was SIGKILLed too
    deployment.start_worker("w2")
    await until(lambda: f"af-{run_id}-0-recheck-" in deployment.log("w2"), "w2 holding the recheck", timeout_s=20)
    deployment.kill_group("w2")
    # When a third worker starts (no beat runs: nothing else would look before the broker hands
    # w2's message out again, after its visibility timeout)
    deployment.start_worker("w3")
    # Then the third worker's start sends its own recheck, and the run is claimed just after the lease ends
    bound = lease_s + margin_s + SLACK_S
    await until_claimed(deployment, run_id, timeout_s=bound + 10)
    elapsed = time.monotonic() - killed
    assert elapsed < bound, f"claimed {elapsed:.1f} s after the first kill (bound {bound:.1f} s)"
    assert f"af-{run_id}-0-recheck-" in deployment.log("w3"), (
        f"a worker started in {start_s:.1f} s; lease {lease_s:.1f} s"
    )
    view = await deployment.client.settle(run_id, timeout_s=30)
    assert view.status == "done", view


async def test_a_sweep_lock_left_by_a_worker_that_died_in_its_sweep_delays_a_start_by_seconds(deployment):
    deployment.set_lease(LEASE_S)
    settings = deployment.tasks.worker.settings
    # Given a run whose worker was SIGKILLed inside its slow hold_seats
    run_id, killed = await killed_in_hold_seats(deployment, "locked")
    # and recover_all's lock as a worker killed inside its sweep leaves it: put, never renewed nor taken
    await deployment.tasks.worker.markers.put(*RECOVER_ALL_LOCK, {"owner": "w0@gone:1"}, settings.recover_lock_s)
    # When a new worker starts (no beat: its start-up sweep is the only look at the run)
    deployment.start_worker("w2")
    ready = time.monotonic() - killed
    # Then its sweep, kept out by the lock, comes again once the lock lapses, and the run is claimed
    # within the lock's lifetime and a lease (not at the broker's visibility timeout, nor at beat's tick)
    bound = max(settings.recover_lock_s + LEASE_S + settings.recheck_margin_s, ready) + SLACK_S
    await until_claimed(deployment, run_id, timeout_s=bound + 10)
    elapsed = time.monotonic() - killed
    assert elapsed < bound, f"claimed {elapsed:.1f} s after the kill (bound {bound:.1f} s)"
    assert (await deployment.client.settle(run_id, timeout_s=30)).status == "done"
