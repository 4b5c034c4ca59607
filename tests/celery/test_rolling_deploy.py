"""A rolling deploy on real Celery workers: runs of version 1 finish on version 1, new runs start on version 2.

Given refunds paused for approval on version 1, the workers are replaced by a version-1
worker and a version-2 worker side by side, then by the version-2 worker alone. Every run
finishes on the version it started on, or is listed as needing migration and left
untouched; one is migrated and finishes on version 2. The ledger shows no effect twice.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from _kit.poll import until
from celery_kit import Deployment
from versioned_flows import to_v2

from agentflow import Happened

pytestmark = [pytest.mark.celery, pytest.mark.redis]  # starts Celery worker processes on Redis

V1, V2, BOTH = "versioned_flows:v1", "versioned_flows:v2", "versioned_flows:both"
CHARGE_IDEMPOTENT = "versioned_flows:charge_idempotent"


async def test_a_deploy_that_declares_a_tool_idempotent_leaves_the_old_cut_off_call_to_a_decision(
    deployment: Deployment,
) -> None:
    # Given a worker of the first deploy (charge_card not idempotent) killed right after the charge, and a
    # worker of a deploy that declares charge_card idempotent taking the run over:
    # Then (parked_run checks it) the run is parked with the charge in doubt, charged once
    run_id = await deployment.parked_run(successor_app=CHARGE_IDEMPOTENT)
    v2 = deployment.client_for(CHARGE_IDEMPOTENT)
    view = await v2.status(run_id)
    [call] = view.in_doubt
    assert "not idempotent when the call started" in (view.waiting_for_decision or ""), view
    # When the operator, having found the charge at the bank, says it happened
    await v2.decide_in_doubt(run_id, calls={call.call_id: Happened("charged 80 for parked")}, operator="zoe")
    # Then the new deploy's worker finishes the run and the card was charged once
    done = await v2.settle(run_id, timeout_s=60)
    assert done.status == "done", done
    assert deployment.effects()[("charge_card", run_id)] == 1


async def test_a_rolling_deploy_finishes_every_run_on_its_version_or_lists_it_for_migration(
    deployment: Deployment,
) -> None:
    old, new, ops = deployment.client_for(V1), deployment.client_for(V2), deployment.client_for(BOTH)
    # Given four refunds paused for approval, started while only version 1 was deployed
    deployment.start_worker_of("old", V1)
    paused = [await old.start("refunds", {"amount": 500}, run_id=f"{deployment.prefix}-r{i}") for i in range(4)]
    for view in (await _wait_all(old, paused)).values():
        assert view.status == "paused" and view.version == "1", view
    a, b, c, d = paused
    deployment.kill_group("old")

    # When a version-2 worker starts alone, and a message for a version-1 run reaches it
    deployment.start_worker_of("v2", V2)
    runner = ops.runner
    resumed = await runner.resume(ops.flow_app.flow_versions("refunds"), b, approve=True, max_supersteps=0)
    deployment.tasks.send_superstep("refunds", b, resumed.step, "resume")  # no version: the deployment's queue
    # Then it touches nothing and sends the message on to version 1's queue
    await until(lambda: "which this worker does not have: sent it on" in deployment.log("v2"), "v2 sending b on")
    assert (await ops.status(b)).status == "running" and deployment.effects()[("refund", b)] == 0

    # When a version-1 worker joins it (old and new side by side)
    deployment.start_worker_of("v1", V1)
    await ops.resume(a, approve=True, operator="alice")
    started = await ops.start("refunds", {"amount": 50, "currency": "USD"}, run_id=f"{deployment.prefix}-n")
    views = await _wait_all(ops, [a, b, started])
    # Then the version-1 runs finished on version 1 (by the version-1 worker), the new one on version 2
    assert [views[r].status for r in (a, b, started)] == ["done", "done", "done"], views
    assert [views[r].version for r in (a, b, started)] == ["1", "1", "2"]
    for run_id, worker in ((a, "v1@"), (b, "v1@"), (started, "v2@")):
        assert ((await deployment.report(run_id)).checkpoints[-1].by or "").startswith(worker)

    # When only version 2 is left
    deployment.kill_group("v1")
    swept = deployment.tasks.recover_all.apply_async(queue=deployment.values["queue"]).get(timeout=30)
    # Then the two paused version-1 runs are listed as needing migration, and a version-2 client says so
    assert sorted(swept.get("needs_migration", {})) == sorted([c, d]), swept
    view = await new.status(c)
    assert view.needs_migration and view.version == "1" and view.state["amount"] == 500

    # When an operator migrates one of them to version 2 and approves it there
    await new.migrate(c, to_version="2", state=to_v2, operator="bob")
    assert (await new.settle(c, timeout_s=30)).status == "paused"  # version 2 asks for the approval again
    await new.resume(c, approve=True, operator="bob")
    done = await new.settle(c, timeout_s=30)
    # Then it finished on version 2; the other waits, untouched, on version 1
    assert done.status == "done" and done.version == "2" and done.state.currency == "EUR"
    left = await new.status(d)
    assert left.status == "paused" and left.needs_migration and left.step == 1

    # And nothing ran twice: one refund and one notice per finished run, nothing for the one left
    effects = deployment.effects()
    for run_id in (a, b, started, c):
        assert (effects[("refund", run_id)], effects[("notify", run_id)]) == (1, 1), (run_id, effects)
    assert effects[("refund", d)] == 0 and effects[("apologize", a)] == 0


async def _wait_all(client: Any, run_ids: list[str]) -> dict[str, Any]:
    """Each run as `client` sees it once settled."""
    views = await asyncio.gather(*(client.settle(r, timeout_s=60, poll_s=0.2) for r in run_ids))
    return dict(zip(run_ids, views, strict=True))
