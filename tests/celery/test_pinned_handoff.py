"""A real worker refuses a run whose records were cut from before its latest checkpoint (the claim pinned them)."""

from __future__ import annotations

import pytest
import redis.asyncio
from _kit.faults import body
from _kit.stores import RedisRows
from celery.result import AsyncResult
from celery_kit import ended

pytestmark = [pytest.mark.celery, pytest.mark.redis]  # starts Celery worker processes on Redis


async def test_a_worker_spending_a_stored_decision_refuses_a_cut_log_and_charges_once(shared):
    # Given a worker and a run paused on wire_money after charge_card ran in the same superstep
    run_id = await shared.client.start("fanout", {"show": "Nabucco"})
    paused = await shared.client.settle(run_id, timeout_s=30)
    assert paused.status == "paused" and [p.tool for p in paused.pending] == ["wire_money"]
    # and the decision stored with its claim (no worker has spent it yet)
    runner = shared.tasks.worker.runner
    flow = shared.tasks.worker.flow_app.flow("fanout")
    decided = await runner.resume(flow, run_id, approve=True, max_supersteps=0)
    assert decided.status == "running" and decided.step is not None
    # When segment 0's records of that superstep (charge_card's started and done, wire's pending)
    # are deleted from Redis, the way someone with write access to it could
    assert runner.checkpoints is not None
    records = list(await runner.checkpoints.calls(run_id))
    cut = [r for r in records if r.segment == 0 and body(r).get("superstep") == 1]
    assert len(cut) == 3
    rows = RedisRows(lambda: redis.asyncio.Redis.from_url(shared.redis_url), shared.prefix)
    for rec in reversed(cut):
        await rows.drop_call(rec)
    # and the superstep that spends the decision is sent to the worker
    task_id = shared.tasks.send_superstep("fanout", run_id, decided.step, "resume")
    result = AsyncResult(task_id, app=shared.celery_app)
    await ended(result)
    # Then the worker refused it as corrupt (the claim pinned segment 0's count), ran nothing,
    # and the run did not move
    assert result.state == "REFUSED", result.result
    assert result.result["done"] == "refused", result.result
    assert "segment 0" in result.result["why"], result.result
    assert len(shared.refusals("w1", "resume", run_id)) == 1
    effects = shared.effects()
    assert (effects[("charge_card", run_id)], effects[("wire_money", run_id)]) == (1, 0)
    assert (await runner.checkpoints.latest(run_id)).step == decided.step
