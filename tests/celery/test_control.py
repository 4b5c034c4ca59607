"""A message grants nothing: real workers rerun a call in doubt only on a decision signed with their key.

Each test parks a ticket run on charge_card in doubt (`Deployment.parked_run`: its worker was
SIGKILLed right after the charge), then tries to let it go on: by a hand-written marker, by a
decision signed with another key, and the right way, through `FlowClient.decide_in_doubt`.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter

import pytest
import redis
from _kit.tickets import OTHER_KEY
from celery_kit import ROOT, Deployment, ended

from agentflow import Happened

pytestmark = [pytest.mark.celery, pytest.mark.redis, pytest.mark.timeout(120)]


async def send_rerun(deployment: Deployment, run_id: str, step: int) -> dict[str, object]:
    """Send a superstep with cause ``rerun`` pointing at `step`; return the task's result."""
    sent = deployment.tasks.superstep.apply_async(
        args=("tickets", run_id, step, "rerun"), queue=deployment.values["queue"]
    )
    assert (await ended(sent))["done"] == "refused" and sent.state == "REFUSED", sent.info
    result: dict[str, object] = sent.info
    return result


async def still_parked(deployment: Deployment, run_id: str, step: int, before: Counter[tuple[str, str]]) -> None:
    """The run is where the worker parked it (same step, waiting for a decision), and no tool ran since `before`."""
    view = await deployment.client.status(run_id)
    assert (view.status, view.step) == ("running", step)
    assert view.waiting_for_decision and "charge_card" in view.waiting_for_decision
    assert deployment.effects() == before


async def test_a_hand_written_rerun_marker_and_a_rerun_message_are_refused(deployment):
    # Given a run parked on charge_card in doubt
    run_id = await deployment.parked_run()
    step = (await deployment.client.status(run_id)).step
    before = deployment.effects()
    # When someone with access to Redis writes the old rerun marker and sends a rerun superstep
    client = redis.Redis.from_url(deployment.redis_url)
    try:
        client.set(f"{deployment.prefix}:rerun:{{{run_id}}}", step)
    finally:
        client.close()
    result = await send_rerun(deployment, run_id, step)
    # Then the worker refuses it (no signed decision is at that step), logs it, and runs nothing
    assert result["done"] == "refused", result
    assert len(deployment.refusals("w2", "rerun", run_id)) == 1
    await still_parked(deployment, run_id, step, before)


async def test_a_decision_signed_with_another_key_is_refused(deployment):
    # Given a run parked on charge_card in doubt
    run_id = await deployment.parked_run()
    before = deployment.effects()
    # When a process that reads with the workers' keys but signs with another one (a key the
    # workers do not have) stores a decision to rerun the charge, and sends the rerun message
    worker = deployment.tasks.worker
    keys = worker.checkpoint_key if isinstance(worker.checkpoint_key, list) else [worker.checkpoint_key]
    forger = worker.flow_app.runner(worker.store, [OTHER_KEY, *keys], owner="forger@elsewhere:1")
    step = await forger.decide_in_doubt(worker.flow_app.flow("tickets"), run_id, operator="mallory")
    result = await send_rerun(deployment, run_id, step)
    # Then the worker refuses it (the decision fails its signature check) and the charge does not run again
    assert result["done"] == "refused", result
    assert "does not have" in str(result["why"]), result
    assert len(deployment.refusals("w2", "rerun", run_id)) == 1
    assert (await worker.store.latest(run_id)).step == step
    assert deployment.effects() == before


async def test_an_operators_decision_through_the_client_reruns_the_charge_once_and_names_the_operator(deployment):
    # Given a run parked on charge_card in doubt
    run_id = await deployment.parked_run()
    # When alice, having checked the charge at the payment system, decides through the client
    step = await deployment.client.decide_in_doubt(run_id, operator="alice")
    view = await deployment.client.settle(run_id, timeout_s=30)
    # Then a worker spends her decision: the charge reruns once and the run finishes
    assert view.status == "done", view
    effects = deployment.effects()
    assert (effects[("charge_card", run_id)], effects[("email_tickets", run_id)]) == (2, 1)
    # and the read model names alice as the one who decided the rerun of the charge
    report = await deployment.report(run_id)
    decided = [s for s in report.segments if s.how == "decision"]
    assert [(s.first_step, s.operator) for s in decided] == [(step, "alice")]
    assert [cid.split("/")[1] for cid in decided[0].rerun] == ["pay"]
    # and so does `agentflow runs show`
    shown = subprocess.run(
        [sys.executable, "-m", "agentflow.cli", "runs", "show", run_id,
         "--store", f"{deployment.redis_url}?prefix={deployment.prefix}"],
        cwd=ROOT, env=deployment.env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "decided by alice" in shown.stdout, shown.stdout


async def test_the_client_names_each_call_in_doubt_and_its_worker_and_shows_a_happened_decision(deployment):
    # Given a run parked on charge_card in doubt: worker w1 was SIGKILLed right after the charge
    run_id = await deployment.parked_run()
    # When the operator reads it through the client
    view = await deployment.client.status(run_id)
    # Then the view names the call in doubt (its id, tool and arguments) and the worker it started on
    (call,) = view.in_doubt
    assert (call.tool, call.args) == ("charge_card", {"show": "parked", "seats": 2})
    assert call.started_on is not None and call.started_on.startswith("w1@"), call
    assert call.started_at is not None and call.started_at <= time.time()
    assert call.started_on in (view.waiting_for_decision or "")
    # When alice, who found the charge at the payment system, says it happened and with what result
    step = await deployment.client.decide_in_doubt(run_id, calls={call.call_id: Happened("charged 80 for parked")},
                                                   operator="alice")  # fmt: skip
    done = await deployment.client.settle(run_id, timeout_s=30)
    # Then the run finishes without charging again, and the client and `runs show` say what alice supplied
    assert done.status == "done" and deployment.effects()[("charge_card", run_id)] == 1
    (decided,) = [s for s in done.segments if s.how == "decision"]
    assert (decided.first_step, decided.operator) == (step, "alice")
    assert decided.settled == ((call.call_id, "happened", "charged 80 for parked"),)
    shown = subprocess.run(
        [sys.executable, "-m", "agentflow.cli", "runs", "show", run_id,
         "--store", f"{deployment.redis_url}?prefix={deployment.prefix}"],
        cwd=ROOT, env=deployment.env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert f"{call.call_id} happened: result charged 80 for parked" in shown.stdout, shown.stdout
    assert "happened, said alice" in shown.stdout, shown.stdout
