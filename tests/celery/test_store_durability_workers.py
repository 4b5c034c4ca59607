"""Real workers on a store that cannot confirm its writes: they try again with a back-off, and say why.

The store is a primary of our own whose replica is behind a link the test cuts
(`_kit.replication`); the workers wait for that replica (``wait_replicas=1``). A superstep
whose non-idempotent ``started`` the replica does not acknowledge stops before its tool
(`StoreNotDurable`). Its task is not a ``FAILURE``: it is sent again after a back-off
(``RETRY`` in Flower, with the store's message), a bounded number of times, then ends
``WAITING_FOR_STORE`` and leaves the run to recover_all; meanwhile ``runs show`` and the
viewer say the run waits for its store's durability. Once the replica is back the run goes
on, its call in doubt decided by an operator (its ``started`` survived), and the card is
charged once. A worker refuses at start-up a store whose server keeps nothing on disk
unless its settings allow it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _kit.poll import until
from _kit.ports import free_port
from _kit.replication import Server, replica_set, server_binary
from celery_kit import Deployment
from flower_kit import PASSWORD, USER, tasks, until_listed

from agentflow import Rerun
from agentflow.cli._show import run_text
from agentflow.exec.run.store_waits import KIND

pytestmark = [pytest.mark.celery, pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(150)]


async def test_a_superstep_the_store_cannot_confirm_is_retried_with_backoff_and_said_to_wait(
    tmp_path: Path, redis_url: str
) -> None:
    with replica_set(tmp_path / "store") as pair:
        waits = {"store_wait_replicas": 1, "store_wait_timeout_s": 0.3, "store_retries": 1, "store_retry_s": 1.5}
        dep = Deployment(tmp_path, redis_url, store_url=pair.primary.url, settings=waits)
        try:
            dep.start_worker("w1", concurrency=1)
            flower = dep.start_flower(f"{USER}:{PASSWORD}")
            run_id = await dep.client.start("tickets", {"show": "cut"}, run_id=f"{dep.prefix}-cut")
            # Given the replica cut off once the run's step 0 is acknowledged
            pair.link.cut()
            # When charge_card's started is not acknowledged: Flower shows the superstep RETRY, with the store's word
            # When charge_card's started is not acknowledged, the task is sent again after a back-off (Flower
            # shows the store's word on it), and the retry's claim (it parks the run: the call is in doubt) is not
            # acknowledged either
            retried = until_listed(flower, run_id, lambda t: "StoreNotDurable" in str(t.get("exception")))
            assert "wait_replicas" in str(retried["exception"]) and retried["retries"] >= 1
            # Then, its tries spent, the task ends WAITING_FOR_STORE, never FAILURE
            until_listed(flower, run_id, lambda t: True, timeout_s=30, state="WAITING_FOR_STORE")
            assert not [t for t in _failed(flower) if t["parsed_args"][1:2] == (run_id,)]
            assert dep.log("w1").count("its superstep is tried again in") == 1
            # And runs show says the run waits for its store (before the decision its unacknowledged claim asks for)
            report = await dep.report(run_id)
            assert report.waiting_for_store is not None and report.waiting_for_store.retry_at is None
            shown = run_text(report)
            assert "waiting for its store's durability" in shown and "tries are spent" in shown
            assert shown.index("waiting for its store's durability") < shown.index(
                "waiting for a decision about calls in doubt"
            )
            assert dep.effects()[("charge_card", run_id)] == 0
            # When the replica is back, the operator, who sees no charge at the bank, has the call run again
            pair.link.heal()
            await until(pair.in_sync, "the replica to catch up", timeout_s=30)
            view = await dep.client.settle(run_id, timeout_s=40)
            assert view.waiting_for_decision and "charge_card" in view.waiting_for_decision
            call = next(c.call_id for c in view.in_doubt if c.tool == "charge_card")
            await dep.client.decide_in_doubt(run_id, calls={call: Rerun()})
            done = await dep.client.settle(run_id, timeout_s=40)
            # Then the order ends with one charge, and nothing says it waits for its store any more
            assert done.status == "done"
            assert dep.effects()[("charge_card", run_id)] == 1
            assert await _store_wait_marker(dep, run_id) is None
            await dep.aclose_clients()
        finally:
            dep.close()


def _failed(flower: str) -> list[dict[str, Any]]:
    return tasks(flower, state="FAILURE")


async def _store_wait_marker(dep: Deployment, run_id: str) -> object:
    worker = dep.tasks.worker
    return (await worker.markers.peek(KIND, [run_id])).get(run_id)


def test_a_worker_refuses_a_store_that_keeps_nothing_when_it_starts_unless_allowed(
    tmp_path: Path, redis_url: str
) -> None:
    # Given a Redis of our own with no append-only file and no snapshots (the machine's shared one is not touched)
    server = Server(server_binary(), free_port(), tmp_path / "volatile", ["--save", "", "--appendonly", "no"]).start()
    (tmp_path / "strict").mkdir()
    (tmp_path / "allowed").mkdir()
    try:
        strict = Deployment(
            tmp_path / "strict", redis_url, store_url=server.url, settings={"store_allow_volatile": False}
        )
        try:
            # When a worker starts on it without the allowance, it stops at once, saying what to set
            proc = strict.start_worker("w1", wait=False)
            assert proc.wait(timeout=60) != 0
            said = strict.log("w1")
            assert "refusing to start on this checkpoint store" in said and "AGENTFLOW_STORE_ALLOW_VOLATILE=1" in said
        finally:
            strict.close()
        # And with the allowance (AGENTFLOW_STORE_ALLOW_VOLATILE=1, as the test deployments set) it starts
        allowed = Deployment(tmp_path / "allowed", redis_url, store_url=server.url)
        try:
            allowed.start_worker("w1")
        finally:
            allowed.close()
    finally:
        server.kill()
