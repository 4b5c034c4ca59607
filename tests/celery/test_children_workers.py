"""A parent and its child run on real Celery workers, a worker SIGKILLed at each boundary.

The parent prepares (a slow report), starts its child (a slow report of its own, on the
queue), waits for it, then mails. A worker is killed before the child starts, while the
child runs, and right after the child ended (before or as its parent is woken): the run
ends with one child run, one parent result and one mail.
"""

from __future__ import annotations

from typing import Any

import pytest
from _kit.poll import until
from celery_kit import Deployment

from agentflow import Happened, Rerun
from agentflow.errors import CheckpointNotFound

pytestmark = [pytest.mark.celery, pytest.mark.redis]  # starts Celery worker processes on Redis


@pytest.mark.timeout(240)
async def test_kills_at_every_boundary_end_with_one_child_and_one_parent_result(deployment: Deployment) -> None:
    deployment.start_beat()
    client = deployment.client
    parent = await client.start("family", {"show": "Aida", "seconds": 3.0}, run_id=f"{deployment.prefix}-p")
    child = f"{parent}.child.1"
    # Killed before the child starts: inside the parent's first superstep
    deployment.start_worker("w1")
    await deployment.until_started(parent, "slow_report")
    deployment.kill_group("w1")
    # Killed while the child runs: inside the child's report
    deployment.start_worker("w2")
    await until(lambda: reporting(deployment, child), "the child's report under way", timeout_s=60, every=0.05)
    deployment.kill_group("w2")
    # Killed right after the child ended: before (or while) its parent is woken
    deployment.start_worker("w3")

    async def child_done() -> bool:
        return (await deployment.report(child)).status == "done"

    await until(child_done, "the child ending", timeout_s=60, every=0.05)
    deployment.kill_group("w3")
    # Then another worker finishes the parent. If the kill came after the woken parent had logged its
    # mail as started, that mail is in doubt and waits for a decision: an operator looks at the ledger
    deployment.start_worker("w4")

    async def parent_settled() -> Any:  # done, or waiting for a decision (paused for its child is neither)
        seen = await client.status(parent)
        return seen if seen.status == "done" or seen.waiting_for_decision else None

    seen = await until(parent_settled, "the parent ending or asking about its mail", timeout_s=90, every=0.2)
    if seen.status != "done":
        assert "email_tickets" in (seen.waiting_for_decision or ""), seen
        sent = deployment.effects()[("email_tickets", parent)] == 1
        (call,) = (await deployment.report(parent)).in_doubt
        await client.decide_in_doubt(parent, calls={call.call_id: Happened("mailed Aida") if sent else Rerun()})

    async def parent_done() -> Any:
        seen = await client.status(parent)
        return seen if seen.status == "done" else None

    done = await until(parent_done, "the parent ending", timeout_s=90, every=0.2)
    assert done.state.paid == "reported Aida" and done.state.sent == "mailed Aida"
    report = await deployment.report(child)
    assert [c.step for c in report.checkpoints].count(0) == 1  # one child run, started once
    assert deployment.effects()[("email_tickets", parent)] == 1
    assert deployment.effects()[("slow_report", child)] >= 1


async def reporting(deployment: Deployment, run_id: str) -> bool:
    """Whether the run exists and its slow report is under way (logged started, no result yet)."""
    try:
        calls = (await deployment.report(run_id)).calls
    except CheckpointNotFound:
        return False  # not started yet
    return any(c.tool == "slow_report" and c.kind == "started" for c in calls)
