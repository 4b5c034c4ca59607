"""A map of 1,000 elements on real Celery workers, SIGKILLed twice in the middle.

Every finished element's effect happens exactly once (the ledger), the elements in doubt
are surfaced for a decision each time (the tool is not idempotent), and what the store
keeps per element does not grow with the list.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from _kit.poll import until
from _kit.tickets import Ledger
from celery_kit import Deployment

from agentflow import Happened, Rerun

pytestmark = [pytest.mark.celery, pytest.mark.redis]  # starts Celery worker processes on Redis

ELEMENTS = 1000


def published_keys(deployment: Deployment, run_id: str) -> list[str]:
    """The idempotency keys `publish` ran with in the run, in every process, in order."""
    return [e.key for e in Ledger(deployment.ledger).entries() if e.tool == "publish" and e.run_id == run_id]


def key_of(run_id: str, call_id: str) -> str:
    """The idempotency key a call's tool sees (`agentflow.exec.idempotency_key`), from outside the call."""
    return "af-" + hashlib.sha256(f"{run_id}\n{call_id}".encode()).hexdigest()[:40]


async def settle_doubt(deployment: Deployment, run_id: str) -> int:
    """Decide each element in doubt as an operator would: it happened if the ledger has it, else rerun it."""
    report = await deployment.report(run_id)
    published = set(published_keys(deployment, run_id))
    decisions: dict[str, Any] = {}
    for call in report.in_doubt:
        item = call.args["item"]
        happened = key_of(run_id, call.call_id) in published
        decisions[call.call_id] = Happened(f"published {item}") if happened else Rerun()
    assert decisions, "the run waits for a decision about no call"
    await deployment.client.decide_in_doubt(run_id, calls=decisions, operator="ops")
    return len(decisions)


async def stored_bytes(deployment: Deployment, run_id: str) -> int:
    store = deployment.tasks.worker.store
    calls = sum(len(c.payload) for c in await store.calls(run_id))
    return calls + sum(len(c.payload) for c in await store.history(run_id))


@pytest.mark.timeout(300)
async def test_a_map_of_a_thousand_elements_survives_two_kills_with_each_effect_once(deployment: Deployment) -> None:
    # Slow enough (20 in flight, about 130 a second) that the test sees each kill point before the map is past it
    deployment.set_delay(0.1, 0.2)
    run_id = await deployment.client.start("mapped", {"items": list(range(ELEMENTS))}, run_id=f"{deployment.prefix}-m")
    decided = 0
    for worker, kill_at in (("w1", 250), ("w2", 600)):
        # Given a worker publishing the elements, killed (its whole process group) in the middle
        deployment.start_worker(worker)
        await until(published(deployment, run_id, kill_at), f"{kill_at} published", timeout_s=120)
        deployment.kill_group(worker)
        # When the next worker takes the run over, Then it surfaces the elements in doubt for a decision
        deployment.start_worker(f"{worker}-next")
        view = await deployment.client.settle(run_id, timeout_s=60)
        assert view.status == "running" and view.waiting_for_decision and "publish" in view.waiting_for_decision
        # (that worker stops before the decision: the rerun it sends is for the next iteration's worker,
        # which must be the one publishing when it is killed, however fast this machine publishes)
        deployment.kill_group(f"{worker}-next")
        decided += await settle_doubt(deployment, run_id)
    # And once decided, a worker finishes the map
    deployment.set_delay(0.0, 0.0)
    deployment.start_worker("w3")

    async def finished() -> Any:
        seen = await deployment.client.status(run_id)
        return seen if seen.status == "done" else None

    done = await until(finished, "the map finishing", timeout_s=120, every=0.5)
    assert done.state.results == [f"published {i}" for i in range(ELEMENTS)]
    # Then every element was published exactly once, the ones in doubt included
    keys = published_keys(deployment, run_id)
    assert len(keys) == len(set(keys)) == ELEMENTS, (len(keys), len(set(keys)))
    assert decided >= 2
    # And what the store keeps per element is about what a map of a tenth the size keeps
    small = await deployment.client.start(
        "mapped", {"items": list(range(ELEMENTS // 10))}, run_id=f"{deployment.prefix}-s"
    )
    await until(finished_of(deployment, small), "the small map finishing", timeout_s=60, every=0.2)
    per_big = await stored_bytes(deployment, run_id) / ELEMENTS
    per_small = await stored_bytes(deployment, small) / (ELEMENTS // 10)
    print(f"\nstored per element: {per_big:.0f} B (1,000 elements, two kills), {per_small:.0f} B (100 elements)")
    assert per_big < per_small * 1.3, (per_big, per_small)


def finished_of(deployment: Deployment, run_id: str) -> Any:
    async def check() -> bool:
        return (await deployment.client.status(run_id)).status == "done"

    return check


def published(deployment: Deployment, run_id: str, count: int) -> Any:
    """A check: at least `count` elements of the run published (in the ledger)."""
    return lambda: deployment.effects()[("publish", run_id)] >= count
