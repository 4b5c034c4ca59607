"""The read model says who did what, and never calls a live call "in doubt".

On every store set-up: a run whose worker is inside a tool is held (its lease is live), so
`read_run`, `read_runs` and `read_heads` show it as running on that worker and none of its
calls in doubt; the same run left by a dead worker shows its call in doubt. Each segment
names the process that held it, and each claim that carried a decision its operator.
"""

from __future__ import annotations

import asyncio

from _kit.tickets import KEY, LOOKUP, REFUNDS, TICKETS, Crash, Order, Refund, Tickets, make_tickets

from agentflow import Executor, FlowRunner
from agentflow.exec.checkpoints import CheckpointStore, RecoveryNeedsDecision
from agentflow.exec.run.read import read_heads, read_run, read_runs
from agentflow.exec.run.view import IN_DOUBT, LIVE, WAITING
from agentflow.exec.seal import Sealer

SEALER = Sealer(KEY)
WORKER = "worker-a@host-1:101"
OTHER = "worker-b@host-2:202"


def runner_on(store: CheckpointStore, owner: str = WORKER) -> tuple[FlowRunner, Tickets]:
    tickets = make_tickets()
    return FlowRunner(Executor(tickets.registry), checkpoints=store, checkpoint_key=KEY, owner=owner), tickets


async def test_a_run_inside_a_tool_is_running_on_its_worker_not_in_doubt(store_setup):
    # Given a worker inside slow_lookup (its call logged as started, no result yet)
    tickets = make_tickets()
    release, entered = tickets.gate("slow_lookup")
    runner = FlowRunner(Executor(tickets.registry), checkpoints=store_setup.open(), checkpoint_key=KEY, owner=WORKER)
    task = asyncio.create_task(runner.run(LOOKUP, Order(show="Tosca", seats=2), run_id="live-1"))
    try:
        await asyncio.wait_for(entered.wait(), 10)
        # When the run is read, listed in full, and listed by heads
        report = await read_run(store_setup.raw, SEALER, "live-1")
        (listed,) = [r for r in await read_runs(store_setup.raw, SEALER) if r.run_id == "live-1"]
        (head,) = [h for h in await read_heads(store_setup.raw, SEALER) if h.run_id == "live-1"]
    finally:
        release.set()
        result = await asyncio.wait_for(task, 10)
    # Then each says it runs on its worker, and none calls the started lookup "in doubt"
    for seen in (report, listed):
        assert seen.running_on == WORKER and seen.lease is not None
        assert seen.in_doubt == [] and IN_DOUBT not in seen.marks and LIVE in seen.marks
        assert [c.tool for c in seen.calls if c.state == IN_DOUBT] == ["slow_lookup"]  # started, no result yet
    assert head.running_on == WORKER
    # and once the worker let go of the run, nobody holds it
    assert result.status == "done"
    after = await read_run(store_setup.raw, SEALER, "live-1")
    assert after.lease is None and after.running_on is None and LIVE not in after.marks


async def test_a_held_lease_hides_calls_in_doubt_until_it_lapses(store_setup):
    # Given a run whose worker died inside charge_card (not idempotent): its call is in doubt
    runner, tickets = runner_on(store_setup.open())
    tickets.crash_in.add("charge_card")
    try:
        await runner.run(TICKETS, Order(show="Aida", seats=1), run_id="held-1")
    except Crash:
        pass
    dead = await read_run(store_setup.raw, SEALER, "held-1")
    assert [c.tool for c in dead.in_doubt] == ["charge_card"] and dead.running_on is None
    # When another process holds its lease
    lease = await store_setup.raw.take_lease("held-1", OTHER, "token-other", 30.0)
    assert lease.owner == OTHER
    held = await read_run(store_setup.raw, SEALER, "held-1")
    # Then the call is not in doubt while it is held: it may be running there
    assert held.running_on == OTHER and held.in_doubt == [] and LIVE in held.marks
    # and once the holder lets go, it is in doubt again
    assert await store_setup.raw.release_lease("held-1", "token-other")
    again = await read_run(store_setup.raw, SEALER, "held-1")
    assert again.running_on is None and [c.tool for c in again.in_doubt] == ["charge_card"]


async def test_segments_name_who_held_them_and_claims_who_decided(store_setup):
    # Given a refund paused for approval by one worker, then approved by alice through another
    first, _ = runner_on(store_setup.open(), WORKER)
    paused = await first.run(REFUNDS, Refund(amount=500), run_id="refund-1")
    assert paused.status == "paused"
    second, _ = runner_on(store_setup.open(), OTHER)
    # When alice approves it
    await second.resume(REFUNDS, "refund-1", approve=True, operator="alice")
    report = await read_run(store_setup.raw, SEALER, "refund-1")
    # Then the first segment is the first worker's, and the resume claim names both the process and alice
    start, resumed = report.segments
    assert (start.how, start.owner, start.operator) == ("start", WORKER, None)
    assert (resumed.how, resumed.owner, resumed.operator) == ("resume", OTHER, "alice")
    claim = next(c for c in report.checkpoints if c.step == resumed.first_step)
    assert (claim.what, claim.by, claim.operator) == ("claim (resume)", OTHER, "alice")
    assert all(c.by in (WORKER, OTHER) for c in report.checkpoints)
    assert report.status == "done" and report.lease is None


async def test_a_recovery_with_a_decision_names_its_operator(store_setup):
    # Given a run whose worker died inside charge_card
    runner, tickets = runner_on(store_setup.open(), WORKER)
    tickets.crash_in.add("charge_card")
    try:
        await runner.run(TICKETS, Order(show="Faust", seats=3), run_id="order-9")
    except Crash:
        pass
    # When bob checked the card and recovers it, rerunning the call in doubt
    recovering, _ = runner_on(store_setup.open(), OTHER)
    await recovering.recover(TICKETS, "order-9", rerun_in_doubt=True, operator="bob")
    report = await read_run(store_setup.raw, SEALER, "order-9")
    # Then the recovery's segment and its report name the process and bob
    claim = report.segments[-1]
    assert (claim.how, claim.owner, claim.operator) == ("recovery", OTHER, "bob")
    assert [c.split("/")[1] for c in claim.rerun] == ["pay"]
    (recovery,) = report.recoveries
    assert (recovery.by, recovery.operator) == (OTHER, "bob")


async def test_a_parked_run_waits_for_a_decision(store_setup):
    # Given a run whose worker died inside charge_card, advanced by a worker that parks it
    runner, tickets = runner_on(store_setup.open(), WORKER)
    tickets.crash_in.add("charge_card")
    try:
        await runner.run(TICKETS, Order(show="Cats", seats=2), run_id="park-1")
    except Crash:
        pass
    parker, _ = runner_on(store_setup.open(), OTHER)
    try:
        await parker.advance(TICKETS, "park-1", park=True)
    except RecoveryNeedsDecision:
        pass
    # When it is read
    report = await read_run(store_setup.raw, SEALER, "park-1")
    # Then it shows what it waits for, parked by that worker
    ((tool, why),) = report.awaiting
    assert tool == "charge_card" and why.endswith(" UTC and has no result")
    assert f"was started on {WORKER} at " in why  # the worker that died in it, named for the operator
    assert WAITING in report.marks and report.segments[-1].how == "parked"
    assert report.segments[-1].owner == OTHER and report.lease is None
    # and an operator's decision is shown as waiting for a worker to spend it
    step = await parker.decide_in_doubt(TICKETS, "park-1", operator="carol")
    decided = await read_run(store_setup.raw, SEALER, "park-1")
    assert decided.decision is not None and decided.decision.first_step == step
    assert (decided.decision.how, decided.decision.operator) == ("decision", "carol")
    assert WAITING not in decided.marks
