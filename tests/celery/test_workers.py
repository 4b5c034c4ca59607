"""Distributed mode with real worker processes on the machine's Redis, killed with SIGKILL."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time
from functools import partial

import pytest
from _kit.poll import until
from celery_kit import Deployment, ended

from agentflow.errors import CheckpointConflict, RunHeld

pytestmark = [pytest.mark.celery, pytest.mark.redis, pytest.mark.timeout(300)]

NON_IDEMPOTENT = ("charge_card", "email_tickets")


async def test_runs_enqueued_as_tasks_finish_on_two_workers(deployment):
    # Given two worker processes
    deployment.start_worker("w1")
    deployment.start_worker("w2")
    # When ten ticket runs are started through the client
    run_ids = [await deployment.client.start("tickets", {"show": f"show-{i}"}) for i in range(10)]
    views = await deployment.wait_all(run_ids, timeout_s=60)
    # Then every run is done, read from the store, and each tool ran once per run
    assert {v.status for v in views.values()} == {"done"}
    assert all(v.state.sent == f"mailed {v.state.show}" for v in views.values())
    effects = deployment.effects()
    assert all(effects[(t, r)] == 1 for r in run_ids for t in ("hold_seats", *NON_IDEMPOTENT))
    # and every handoff was clean: each superstep continued the run's one segment without a
    # claim of its own (one checkpoint per superstep, none extra), and no run is marked recovered
    from agentflow.exec.run.read import read_run

    worker = deployment.tasks.worker
    for run_id in run_ids:
        report = await read_run(worker.store, worker.runner.sealer, run_id)
        assert [(seg.how, seg.first_step, seg.last_step) for seg in report.segments] == [("start", 0, 3)]
        assert "recovered" not in report.marks


async def test_killed_workers_lose_no_run_and_repeat_no_finished_call(deployment):
    # Given two workers with slow-ish tools and 50 runs in flight
    deployment.set_delay(0.02, 0.15)
    deployment.start_worker("w1")
    deployment.start_worker("w2")
    deployment.start_beat()
    run_ids = [await deployment.client.start("tickets", {"show": f"show-{i}"}) for i in range(50)]
    await asyncio.sleep(1.5)
    # When one worker's main process and the other's pool child are SIGKILLed mid-run
    child = deployment.children("w2")[0]
    deployment.kill("w1")
    import os
    import signal

    os.kill(child, signal.SIGKILL)
    # and a fresh worker starts (it runs recover_all on start-up; beat repeats it)
    deployment.start_worker("w3")
    views = await deployment.wait_all(run_ids, timeout_s=150)
    # Then runs in doubt surface as decisions; once decided they finish too
    decided = [r for r, v in views.items() if v.waiting_for_decision]
    for run_id in decided:
        # A worker may be looking at the parked run (a recheck or a message sent again takes its lease for
        # a moment): the decision is refused with RunHeld then, and tried again as an operator would.
        await until(partial(_decide_unless_held, deployment, run_id), f"a decision on {run_id}", timeout_s=30)
    if decided:
        views.update(await deployment.wait_all(decided, timeout_s=60))
    assert {v.status for v in views.values()} == {"done"}, {r: v.status for r, v in views.items()}
    # and no non-idempotent call ran twice unless an operator decided to rerun it
    effects = deployment.effects()
    for run_id in run_ids:
        for tool in NON_IDEMPOTENT:
            assert effects[(tool, run_id)] >= 1
            if run_id not in decided:
                assert effects[(tool, run_id)] == 1, (tool, run_id, effects[(tool, run_id)])
            else:
                assert effects[(tool, run_id)] <= 2


async def test_a_run_stranded_between_save_and_enqueue_is_picked_up_by_recover_all(deployment):
    # Given a run whose step 0 was saved but whose message was never sent (its sender died)
    runner = deployment.tasks.worker.runner
    flow = deployment.tasks.worker.flow_app.flow("tickets")
    stranded = await runner.start(flow, {"show": "lost"}, run_id=f"{deployment.prefix}-stranded")
    await asyncio.sleep(1.1)  # older than stale_after_s
    # When a worker starts (worker_ready runs recover_all)
    deployment.start_worker("w1")
    view = await deployment.client.settle(stranded.run_id, timeout_s=30)
    # Then the run finished
    assert view.status == "done"
    assert deployment.effects()[("email_tickets", stranded.run_id)] == 1


async def test_a_backlogged_run_is_sent_one_recovery_not_one_per_sweep(deployment):
    # Given a live worker frozen (SIGSTOP) with five runs queued behind it, each older than stale_after_s
    proc = deployment.start_worker("w1", concurrency=1)
    frozen = [proc.pid, *deployment.children("w1")]
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        run_ids = [await deployment.client.start("tickets", {"show": f"backlog-{i}"}) for i in range(5)]
        store, stale_s = deployment.tasks.worker.store, deployment.values["stale_after_s"]

        async def all_stale() -> bool:
            rows = [await store.latest(run_id) for run_id in run_ids]
            return all(time.time() - row.saved_at > stale_s for row in rows)

        await until(all_stale, "every queued run idle past stale_after_s", timeout_s=10, every=0.05)
        # When recover_all sweeps three times (on a worker whose beat is a minute, so no wait passes between)
        sweeper = deployment.tasks.worker
        sweeper.settings = dataclasses.replace(sweeper.settings, recover_interval_s=60.0)
        results = [await asyncio.to_thread(deployment.tasks.run_recover_all, False) for _ in range(3)]
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
    # Then the first sweep sent each run one recovery, and the next two held every run back
    assert sorted(results[0]["enqueued"]) == sorted(run_ids), results
    assert [sorted(r.get("held_back", {})) for r in results[1:]] == [sorted(run_ids)] * 2, results
    assert [r["enqueued"] for r in results[1:]] == [[], []]
    # And once the worker thaws, every run finishes with each call once
    views = await deployment.wait_all(run_ids, timeout_s=60)
    assert {v.status for v in views.values()} == {"done"}
    effects = deployment.effects()
    assert all(effects[(t, r)] == 1 for r in run_ids for t in ("hold_seats", *NON_IDEMPOTENT))


async def test_a_start_sweep_is_not_queued_behind_a_backlog_of_supersteps(deployment):
    from agentflow.models import Message

    # Given twelve tool loops started with no worker up: their first stages wait on the deployment's queue
    loops = [await deployment.client.start_loop("forecast", [Message.user(f"city-{i}")]) for i in range(12)]
    # When a worker with one pool process starts (its start sends recover_all, to the sweep queue)
    deployment.start_worker("w1", concurrency=1)

    def received() -> list[str]:
        return [line for line in deployment.log("w1").splitlines() if "] received" in line]

    await until(lambda: any("agentflow.recover_all[" in line for line in received()), "the start's sweep", timeout_s=30)
    # Then the worker took its sweep before the backlog: a few stages at most came first (a worker
    # takes from its queues in turn), not the twelve queued ahead of it on one queue
    before = next(i for i, line in enumerate(received()) if "agentflow.recover_all[" in line)
    assert before <= 3, received()[: before + 1]
    # and every loop finishes, each tool call once
    for run_id in loops:
        assert (await deployment.client.settle(run_id, timeout_s=60)).status == "done"
        assert deployment.effects()[("forecast", run_id)] == 1


async def test_a_duplicate_superstep_message_does_nothing(shared):
    # Given a worker (its start-up recover_all long done: `shared` found it idle)
    # and a run saved at step 0, not yet enqueued
    runner = shared.tasks.worker.runner
    flow = shared.tasks.worker.flow_app.flow("tickets")
    run = await runner.start(flow, {"show": "dup"}, run_id=f"{shared.prefix}-dup")
    # When the same superstep message is delivered twice
    first = shared.tasks.superstep.apply_async(args=("tickets", run.run_id, 0, "next"), queue=shared.values["queue"])
    second = shared.tasks.superstep.apply_async(args=("tickets", run.run_id, 0, "next"), queue=shared.values["queue"])
    outcomes = [await ended(first), await ended(second)]
    view = await shared.client.settle(run.run_id, timeout_s=30)
    # Then exactly one ran the superstep; the other was skipped; each tool ran once
    assert sorted(o["done"] for o in outcomes) == ["ran", "skipped"]
    assert sorted(r.state for r in (first, second)) == ["SKIPPED", "SUCCESS"]  # the no-op has a state of its own
    assert view.status == "done"
    assert shared.effects()[("hold_seats", run.run_id)] == 1
    assert shared.effects()[("charge_card", run.run_id)] == 1


async def test_a_live_slow_superstep_is_not_stolen_by_recover_all(deployment):
    # Given a worker running a superstep that lasts 3x the lease
    deployment.start_worker("w1", concurrency=2)
    run_id = await deployment.client.start("slow", {"show": "long", "seconds": 6.0})
    await asyncio.sleep(1.0)
    # When recover_all runs again and again while it works
    deadline = time.monotonic() + 6.0
    results = []
    while time.monotonic() < deadline:
        res = deployment.tasks.recover_all.apply_async(queue=deployment.values["queue"])
        results.append(res.get(timeout=10))
        await asyncio.sleep(0.7)
    view = await deployment.client.settle(run_id, timeout_s=30)
    # Then it never enqueued the live run, and the tool ran once
    assert all(run_id not in r.get("enqueued", []) for r in results), results
    assert view.status == "done"
    assert deployment.effects()[("slow_report", run_id)] == 1


async def test_a_tool_loop_runs_stage_by_stage_as_tasks(shared):
    from agentflow.models import Message

    # Given a worker and a tool loop registered on the app
    # When a loop is started through the client
    run_id = await shared.client.start_loop("forecast", [Message.user("Oslo")])
    result = await shared.client.settle(run_id, timeout_s=30)
    # Then each stage ran as a task and the loop finished with the tool's answer
    assert (result.kind, result.name, result.status) == ("loop", "forecast", "done")
    assert result.output == await shared.client.result(run_id) == "answer: sunny in Oslo"
    assert [m.role for m in result.messages] == ["user", "assistant", "tool", "assistant"]
    assert shared.effects()[("forecast", run_id)] == 1


async def test_a_tool_loop_paused_for_approval_is_resumed_through_the_client(shared):
    from agentflow.models import Message

    # Given a worker and a loop whose model asks for a refund, a tool that needs approval
    run_id = await shared.client.start_loop("refunds", [Message.user("refund order 7")])
    paused = await shared.client.settle(run_id, timeout_s=30)
    assert paused.status == "paused" and [p.tool for p in paused.pending] == ["refund"]
    assert paused.waiting is not None and paused.waiting.what == "approval"
    assert shared.effects()[("refund", run_id)] == 0
    # When someone approves it through the client
    step = await shared.client.resume(run_id, approve=True, note="ok")
    # Then a worker spends the decision: the refund runs once and the loop finishes
    result = await shared.client.settle(run_id, timeout_s=30)
    assert result.status == "done" and result.output == "answer: refunded 250"
    assert result.step is not None and result.step > step
    assert shared.effects()[("refund", run_id)] == 1
    # And a second decision on the finished loop is refused
    with pytest.raises(CheckpointConflict, match="not paused"):
        await shared.client.resume(run_id, approve=True)


async def test_a_resumed_run_replays_the_calls_its_paused_superstep_finished(shared):
    # Given a worker and a run paused on wire_money, after charge_card ran in the same superstep
    run_id = await shared.client.start("fanout", {"show": "Aida"})
    paused = await shared.client.settle(run_id, timeout_s=30)
    assert paused.status == "paused" and [p.tool for p in paused.pending] == ["wire_money"]
    # When someone approves it through the client
    await shared.client.resume(run_id, approve=True)
    # Then the worker that spends the decision runs wire_money once and replays charge_card
    done = await shared.client.settle(run_id, timeout_s=30)
    assert done.status == "done", done.error
    effects = shared.effects()
    assert (effects[("charge_card", run_id)], effects[("wire_money", run_id)]) == (1, 1)


async def test_a_resume_message_alone_decides_nothing_for_a_flow_run_or_a_tool_loop(shared):
    from agentflow.models import Message

    # Given a worker, a flow run paused on wire_money (after charge_card ran) and a loop paused on refund
    run_id = await shared.client.start("fanout", {"show": "Tosca"})
    loop_id = await shared.client.start_loop("refunds", [Message.user("refund order 9")])
    run_step = (await shared.client.settle(run_id, timeout_s=30)).step
    paused_loop = await shared.client.settle(loop_id, timeout_s=30)
    assert paused_loop.status == "paused" and paused_loop.step is not None
    before = shared.effects()
    # When a process that only has the Celery app sends agentflow.resume for each: in the old
    # form (an approval in the message) and in the new one (pointing at the paused step)
    queue = shared.values["queue"]
    forged = [
        ("fanout", run_id, True, "ok"),
        ("fanout", run_id, run_step),
        ("loop:refunds", loop_id, True, "ok"),
        ("loop:refunds", loop_id, paused_loop.step),
    ]
    sent = [shared.tasks.resume.apply_async(args, queue=queue) for args in forged]
    results = [await ended(s) for s in sent]
    # Then every one is refused and logged, no decision is stored, and nothing ran
    assert [r["done"] for r in results] == ["refused"] * 4, results
    assert [len(shared.refusals("w1", "resume", r)) for r in (run_id, loop_id)] == [2, 2]
    view = await shared.client.status(run_id)
    loop = await shared.client.status(loop_id)
    assert (view.status, view.step, loop.status, loop.step) == ("paused", run_step, "paused", paused_loop.step)
    assert shared.effects() == before
    assert [before[("charge_card", run_id)], before[("wire_money", run_id)], before[("refund", loop_id)]] == [1, 0, 0]


async def _decide_unless_held(deployment: Deployment, run_id: str) -> bool:
    """Decide the run's calls in doubt (rerun them); False if a worker holds the run right now."""
    try:
        await deployment.client.decide_in_doubt(run_id)
    except RunHeld:
        return False
    return True
