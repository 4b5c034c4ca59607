"""The scale-out configuration on the real servers: RabbitMQ as the broker, PostgreSQL as the store.

What changes against one Redis: the queues are quorum queues (each flow version's too), a
countdown waits in the broker (native delayed delivery), a message whose worker died goes
back to its queue at once (the channel closed with it unacknowledged: no visibility
timeout), and the broker may go away and come back without a run being lost. The chaos
soak on this configuration is in test_chaos.py.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest
from _kit.poll import until
from celery_kit import Deployment
from rabbit_kit import ctl, own_rabbitmq, rabbitmq_vhost, scale_out_deployment, scale_out_on

#: Runs under way when the broker goes down.
RESTART_RUNS = 8

__all__ = ["rabbitmq_vhost", "scale_out_deployment"]  # the scale-out deployment's fixtures

pytestmark = [pytest.mark.celery, pytest.mark.postgres, pytest.mark.slow, pytest.mark.timeout(180)]


def queues(vhost_url: str) -> dict[str, tuple[str, int]]:
    """Each queue of the vhost: its type and how many messages it holds."""
    vhost = vhost_url.rsplit("/", 1)[1]
    out = ctl("list_queues", "-p", vhost, "name", "type", "messages", "--no-table-headers", "--quiet")
    found = {}
    for line in out.splitlines():
        if line.strip():
            name, kind, messages = line.split()
            found[name] = (kind, int(messages))
    return found


def received_at(deployment: Deployment, worker: str, task_id: str) -> float | None:
    """When (epoch seconds) `worker` logged that it received the task (`task_id`: the id, or how it starts)."""
    for line in deployment.log(worker).splitlines():
        if f"[{task_id}" in line and "] received" in line:
            stamp = line[1:24]  # [2026-12-01 17:01:43,837: ...
            return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return None


async def test_runs_go_through_quorum_queues_and_a_countdown_waits_in_the_broker(
    scale_out_deployment: Deployment, rabbitmq_vhost: str
) -> None:
    rabbit = scale_out_deployment
    # Given a worker on RabbitMQ whose checkpoint store is PostgreSQL
    rabbit.start_worker("w1")
    # When a ticket run is started
    run_id = await rabbit.client.start("tickets", {"show": "rabbit", "seats": 2})
    # and another run is saved at step 0 and its first superstep sent with a countdown of 3 s
    flows = rabbit.client.flow_app.flow_versions("tickets")
    later = (await rabbit.client.runner.start(flows, {"show": "later"}, run_id=f"{rabbit.prefix}-later")).run_id
    sent = time.time()
    task_id = await asyncio.to_thread(rabbit.tasks.send_superstep, "tickets", later, 0, "start", 3.0)
    # Then the first run is done, each tool had its effect once
    assert (await rabbit.client.settle(run_id, timeout_s=30)).status == "done"
    effects = rabbit.effects()
    assert [effects[(tool, run_id)] for tool in ("hold_seats", "charge_card", "email_tickets")] == [1, 1, 1]
    # and the worker received the delayed message only once it was due: the broker held it
    # meanwhile (delay queues with a TTL per power of two), not the worker with an ETA in memory
    got = await until(lambda: received_at(rabbit, "w1", task_id), "the delayed message arriving", timeout_s=20)
    assert got - sent >= 2.9, got - sent
    assert (await rabbit.client.settle(later, timeout_s=30)).status == "done"
    # and every queue the runs went through is a quorum queue: the deployment's and the flow version's
    ours = {name: kind for name, (kind, _) in queues(rabbitmq_vhost).items() if name.startswith(rabbit.values["queue"])}
    assert {rabbit.values["queue"], f"{rabbit.values['queue']}.tickets.v1"} <= set(ours), ours
    assert set(ours.values()) == {"quorum"}, ours


async def test_a_dead_workers_message_is_redelivered_at_once(scale_out_deployment: Deployment) -> None:
    rabbit = scale_out_deployment
    # Given two workers and no beat, and tools that take a second before their effect
    rabbit.set_delay(1.0, 1.0)
    rabbit.start_worker("w1", wait=False)
    rabbit.start_worker("w2", wait=False)
    rabbit.wait_ready("w1")
    rabbit.wait_ready("w2")
    # When the worker running a run's first superstep is killed, main process and pool, mid-call
    run_id = await rabbit.client.start("tickets", {"show": "redelivered"}, run_id=f"{rabbit.prefix}-redelivered")
    await rabbit.until_started(run_id, "hold_seats")  # logged started: its worker is inside the call's second
    holder = (await rabbit.until_held(run_id)).owner.split("@")[0]
    other = {"w1": "w2", "w2": "w1"}[holder]
    killed = time.time()
    rabbit.kill_group(holder)
    # Then the broker hands its message to the other worker at once (no visibility timeout),
    got = await until(lambda: received_at(rabbit, other, f"af-{run_id}-0-start"), "the redelivery", timeout_s=10)
    assert got - killed < 5.0, got - killed  # on Redis: the visibility timeout (120 s in this kit)
    # which waits out the dead worker's lease (a recheck) and carries the run to the end: the
    # idempotent call in doubt reruns, the others run once
    assert (await rabbit.client.settle(run_id, timeout_s=30)).status == "done"
    effects = rabbit.effects()
    assert (effects[("charge_card", run_id)], effects[("email_tickets", run_id)]) == (1, 1)


async def test_a_broker_restart_loses_no_run(tmp_path: Path, postgres_url: str) -> None:
    # Given RabbitMQ of the test's own (the machine's is shared: never stopped), the store on PostgreSQL,
    async with own_rabbitmq(tmp_path) as broker, scale_out_on(tmp_path, broker.url, postgres_url) as rabbit:
        # a worker, beat, and runs under way whose tools take a while
        rabbit.set_delay(0.4, 0.8)
        rabbit.start_worker("w1")
        rabbit.start_beat()
        runs = [await rabbit.client.start("tickets", {"show": f"restart-{i}"}) for i in range(RESTART_RUNS)]
        await until(lambda: sum(rabbit.effects()[("hold_seats", r)] for r in runs) >= 2, "effects", timeout_s=20)
        # When RabbitMQ is stopped while they run, and started again
        began = time.monotonic()
        async with broker.stopped():
            stopped = {r for r in runs if not (await rabbit.client.status(r)).status == "done"}
        down_s = time.monotonic() - began
        assert stopped, "every run ended before the broker was down: the test saw no restart"
        # Then every run ends done (an operator reruns calls left in doubt): none is lost
        decided: Counter[str] = Counter()
        pending = set(runs)

        async def all_done() -> bool:
            for run_id in sorted(pending):
                view = await rabbit.client.status(run_id)
                if view.status == "done":
                    pending.discard(run_id)
                elif view.waiting_for_decision:
                    decided.update(part.split(":", 1)[0] for part in view.waiting_for_decision.split("; "))
                    await rabbit.client.decide_in_doubt(run_id, operator="test")
            return not pending

        await until(all_done, "every run done after the restart", timeout_s=90, every=0.2)
        # and no non-idempotent tool had an effect twice, but for a call in doubt the operator reran
        effects = rabbit.effects()
        for tool in ("charge_card", "email_tickets"):
            assert sum(effects[(tool, r)] for r in runs) <= len(runs) + decided[tool], (tool, effects, decided)
        print(
            f"\nbroker restart: {len(runs)} runs, {len(stopped)} not done while RabbitMQ was down ({down_s:.1f} s); "
            f"all done {time.monotonic() - began:.1f} s after the stop; calls in doubt rerun: {dict(decided)}"
        )
