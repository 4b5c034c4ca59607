"""Operator actions through the client on a real deployment: the operator's process decides, the workers run the tools.

`FlowClient.decide_in_doubt` with `Happened`, `FlowClient.cancel` and `FlowClient.fork`:
each stores a signed record in the client's process (it holds the key), and every tool
call that follows runs on a worker.
"""

from __future__ import annotations

import pytest
from celery_kit import Deployment, ended
from pydantic import BaseModel

from agentflow import Happened
from agentflow.exec.calls.read import read_log

pytestmark = [pytest.mark.celery, pytest.mark.redis, pytest.mark.timeout(120)]


async def charge_call(deployment: Deployment, run_id: str) -> str:
    worker = deployment.tasks.worker
    records = await read_log(worker.store, worker.sealer, run_id)
    (started,) = [r for r in records if r.kind == "started" and r.body.get("tool") == "charge_card"]
    return str(started.body["call_id"])


async def test_it_happened_lets_a_parked_run_finish_on_a_worker_without_charging_again(deployment: Deployment) -> None:
    # Given a run parked on charge_card in doubt (its worker was killed right after the charge)
    run_id = await deployment.parked_run()
    call_id = await charge_call(deployment, run_id)
    # When the operator, having found the charge at the bank, says it happened with its result
    await deployment.client.decide_in_doubt(run_id, calls={call_id: Happened("charged 80 for parked")}, operator="zoe")
    # Then a worker finishes the run, mailing once, and the card was charged once
    done = await deployment.client.settle(run_id, timeout_s=60)
    assert done.status == "done", done
    assert deployment.effects()[("charge_card", run_id)] == 1
    assert deployment.effects()[("email_tickets", run_id)] == 1
    assert any(s.operator == "zoe" for s in done.segments)


async def test_a_forked_run_runs_on_a_worker_and_the_old_run_is_untouched(shared: Deployment) -> None:
    # Given a finished run
    run_id = await shared.client.start("tickets", {"show": "Norma"})
    assert (await shared.client.settle(run_id, timeout_s=60)).status == "done"
    before = shared.effects()
    # When the operator forks it from step 1 with another show
    forked = await shared.client.fork(run_id, at_step=1, patch={"show": "Carmen"}, operator="yan")
    # Then a worker runs the new run's calls (new calls: charge and mail once more), and the old run is as it was
    view = await shared.client.settle(forked, timeout_s=60)
    assert view.status == "done" and isinstance(view.state, BaseModel) and view.state.show == "Carmen"  # type: ignore[attr-defined]
    after = shared.effects()
    assert after[("charge_card", forked)] == 1 and after[("email_tickets", forked)] == 1
    assert {k: v for k, v in after.items() if k[1] == run_id} == {k: v for k, v in before.items() if k[1] == run_id}


async def test_a_paused_run_is_cancelled_and_no_worker_runs_its_call(shared: Deployment) -> None:
    # Given a run paused for approval of wire_money
    run_id = await shared.client.start("fanout", {"show": "Lulu"})
    assert (await shared.client.settle(run_id, timeout_s=30)).status == "paused"
    before = shared.effects()
    # When the operator cancels it
    assert await shared.client.cancel(run_id, reason="fraud check", operator="xia") == "cancelled"
    # Then it is final, and nothing more ran
    view = await shared.client.status(run_id)
    assert view.status == "cancelled" and view.error == "cancelled by xia: fraud check"
    assert shared.effects() == before


async def test_a_run_on_a_worker_is_cancelled_before_its_next_call_and_its_call_in_flight_is_logged(
    deployment: Deployment,
) -> None:
    # Given a ticket run whose worker is inside hold_seats (each tool takes about a second)
    deployment.set_delay(0.8, 0.8)
    deployment.start_worker("w1")
    run_id = await deployment.client.start("tickets", {"show": "Manon"})
    await deployment.until_started(run_id, "hold_seats")
    # When the operator cancels it, Then the request is left for the worker that holds it
    assert await deployment.client.cancel(run_id, reason="sold out", operator="wen") == "running"
    # And the worker finishes hold_seats, logs it, and ends the run before charging the card
    view = await deployment.client.settle(run_id, timeout_s=60)
    assert view.status == "cancelled" and view.error == "cancelled by wen: sold out", view
    assert deployment.effects()[("hold_seats", run_id)] == 1
    assert ("charge_card", run_id) not in deployment.effects()
    report = await deployment.report(run_id)
    assert [(c.tool, c.kind) for c in report.calls] == [("hold_seats", "done")]


async def test_a_failed_run_is_retried_on_a_worker_once_its_tools_work_again(deployment: Deployment) -> None:
    # Given a run that failed because the workers' tools were broken
    deployment.break_tools()
    deployment.start_worker("w1")
    run_id = await deployment.client.start("tickets", {"show": "Werther"})
    failed = await deployment.client.settle(run_id, timeout_s=30)
    assert failed.status == "failed" and failed.error is not None and "broken" in failed.error
    # When the tools work again (a fresh worker) and an operator retries the run through the client
    deployment.kill_group("w1")
    deployment.set_delay(0.0, 0.0)
    deployment.start_worker("w2")
    await deployment.client.retry(run_id, operator="ivy")
    # Then a worker runs it from the superstep that failed to its end
    done = await deployment.client.settle(run_id, timeout_s=60)
    assert done.status == "done", done
    effects = deployment.effects()
    assert (effects[("hold_seats", run_id)], effects[("charge_card", run_id)]) == (1, 1)
    assert any(s.operator == "ivy" for s in done.segments)


async def test_a_retry_message_without_a_signed_retry_is_refused(deployment: Deployment) -> None:
    # Given a failed run
    deployment.break_tools()
    deployment.start_worker("w1")
    run_id = await deployment.client.start("tickets", {"show": "Otello"})
    failed = await deployment.client.settle(run_id, timeout_s=30)
    assert failed.status == "failed"
    # When someone who can write to the broker sends a retry superstep for it
    sent = deployment.tasks.recover_superstep.apply_async(
        args=("tickets", run_id, failed.step, "retry"), queue=deployment.values["queue"]
    )
    result = await ended(sent)
    # Then it is refused (its task ends REFUSED) and the run stays failed
    assert result["done"] == "refused" and sent.state == "REFUSED"
    assert (await deployment.client.status(run_id)).status == "failed"
