"""Two workers on one run: the claim is a compare-and-set, and a cut-off worker is fenced.

Every test runs on every store set-up (`_kit.stores`); the cross-process race on each set-up
that another process can open.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from _kit.faults import body, meet
from _kit.stores import SHARED_SETUPS, StoreSetup, child_env, setups
from _kit.tickets import BATCH, LOOKUP, ORDER, TICKETS, Crash, switched_flow
from _kit.workers import Workers, faulty

from agentflow.exec.checkpoints import CheckpointConflict
from agentflow.flow import RunResult


async def crashed_tickets(workers: Workers, run_id: str) -> None:
    first = workers.runner()
    faulty(first).crash("save", step=2)
    with pytest.raises(Crash):
        await first.run(TICKETS, ORDER, run_id=run_id)


@pytest.mark.parametrize("other", ["input", "flow"])
async def test_starting_another_run_with_a_taken_run_id_is_a_conflict(workers, other):
    # Given a run that is under way (its worker died after step 1)
    await crashed_tickets(workers, "order-1")
    flow = TICKETS if other == "input" else switched_flow(workers.tickets)
    order = ORDER.model_copy(update={"seats": ORDER.seats + 1}) if other == "input" else ORDER
    before, steps = workers.ran(), len(await workers.history("order-1"))

    # When another worker starts another run (other input, or another flow) under the same id
    # (a start retried with the same flow and input attaches instead: tests/protocol/test_retried_start.py)
    # Then CheckpointConflict before any tool runs, and the stored run is untouched
    with pytest.raises(CheckpointConflict):
        await workers.runner().run(flow, order, run_id="order-1")
    assert workers.ran() == before
    assert len(await workers.history("order-1")) == steps


async def test_two_workers_recovering_one_run_exactly_one_wins(workers):
    # Given a crashed run, and two workers that both read its checkpoint and call log before either claims
    await crashed_tickets(workers, "order-1")
    one, two = workers.runner(), workers.runner()
    meet(faulty(one), faulty(two))

    # When both recover it at once
    outcomes = await asyncio.gather(
        one.recover(TICKETS, "order-1"), two.recover(TICKETS, "order-1"), return_exceptions=True
    )

    # Then exactly one completes and the other gets CheckpointConflict on its claim, having written nothing
    won = [o for o in outcomes if isinstance(o, RunResult)]
    lost = [o for o in outcomes if isinstance(o, CheckpointConflict)]
    assert len(won) == 1 and len(lost) == 1, outcomes
    assert won[0].status == "done"
    loser = (one, two)[outcomes.index(lost[0])]
    assert faulty(loser).writes == []
    assert [op for op, _ in faulty(loser).refused] == ["save"]
    # and each tool ran once in all
    assert workers.ran() == {"hold_seats": 1, "charge_card": 1, "email_tickets": 1}


async def test_cut_off_worker_has_its_next_started_record_refused(workers):
    # Given worker A inside slow_lookup (held open), in a node that will call charge_card next
    release, entered = workers.tickets.gate("slow_lookup")
    a = workers.runner()
    a_run = asyncio.create_task(a.run(BATCH, ORDER, run_id="batch-1"))
    await asyncio.wait_for(entered.wait(), 10)

    # When worker B, taking A for dead, recovers the run (so it holds a new segment), charges and mails,
    # and dies before its last checkpoint: the run is still running, held by B's segment
    b = workers.runner()
    faulty(b).rivals_lapsed = True  # A froze past its lease: B may take the run
    faulty(b).crash("save", step=3)
    with pytest.raises(Crash):
        await b.recover(BATCH, "batch-1")
    latest = (await workers.history("batch-1"))[-1]
    assert (latest.status, latest.segment) == ("running", 1)
    assert workers.ran()["charge_card"] == 1

    # And A wakes up and goes on to its next call
    release.set()
    with pytest.raises(CheckpointConflict):
        await asyncio.wait_for(a_run, 10)

    # Then A's `started` record for charge_card was refused (fenced), so A never charged, and A saved nothing
    assert [op for op, _ in faulty(a).refused] == ["record_call:started"]
    assert [w for w in faulty(a).writes if w.startswith("save:")] == ["save:0:running"]
    assert workers.ran() == {"hold_seats": 1, "slow_lookup": 2, "charge_card": 1, "email_tickets": 1}

    # And a third worker finishes the run without charging or mailing again
    result = await workers.runner().recover(BATCH, "batch-1")
    assert result.status == "done"
    assert workers.ran() == {"hold_seats": 1, "slow_lookup": 2, "charge_card": 1, "email_tickets": 1}


async def test_cut_off_worker_has_its_next_save_refused(workers):
    # Given worker A inside slow_lookup (held open), the only call of its superstep
    release, entered = workers.tickets.gate("slow_lookup")
    a = workers.runner()
    a_run = asyncio.create_task(a.run(LOOKUP, ORDER, run_id="lookup-1"))
    await asyncio.wait_for(entered.wait(), 10)

    # When worker B recovers the run (A froze past its lease), pays and mails, and dies before its last checkpoint
    b = workers.runner()
    faulty(b).rivals_lapsed = True
    faulty(b).crash("save", step=4)
    with pytest.raises(Crash):
        await b.recover(LOOKUP, "lookup-1")
    history = await workers.history("lookup-1")
    assert (history[-1].status, history[-1].segment) == ("running", 1)
    steps = len(history)

    # And A wakes up and ends its superstep
    release.set()
    with pytest.raises(CheckpointConflict):
        await asyncio.wait_for(a_run, 10)

    # Then A's checkpoint save was refused (B holds the run) and A started no call
    assert [op for op, _ in faulty(a).refused] == ["save"]
    assert len(await workers.history("lookup-1")) == steps
    assert workers.ran() == {"slow_lookup": 2, "charge_card": 1, "email_tickets": 1}

    # And a third worker finishes the run without charging or mailing again
    result = await workers.runner().recover(LOOKUP, "lookup-1")
    assert result.status == "done"
    assert workers.ran() == {"slow_lookup": 2, "charge_card": 1, "email_tickets": 1}


# -- distributed handoffs (FlowRunner.advance) ----------------------------------------------


async def test_a_clean_handoff_continues_the_segment_with_one_checkpoint_per_superstep(workers):
    # Given a run whose step 0 is saved and that workers advance one superstep at a time
    await workers.runner().run(TICKETS, ORDER, run_id="order-1", max_supersteps=0)

    # When three workers in turn each take a clean handoff
    for step in range(3):
        result = await workers.runner().advance(TICKETS, "order-1", expected_step=step, handoff=True)

    # Then the run is done with one checkpoint per superstep and no claim: one segment throughout
    assert result.status == "done" and result.replayed == []
    history = await workers.history("order-1")
    assert [(c.step, c.segment) for c in history] == [(0, 0), (1, 0), (2, 0), (3, 0)]
    assert not any("claim" in body(c) for c in history)
    # and the call records of all three workers are numbered on, without a gap
    calls = await workers.calls("order-1")
    assert [(c.segment, c.seq) for c in calls] == [(0, n) for n in range(6)]
    assert workers.ran() == {"hold_seats": 1, "charge_card": 1, "email_tickets": 1}


async def test_two_workers_taking_one_clean_handoff_act_once(workers):
    # Given a handed-over run, and two workers that both read it before either writes
    # (a duplicate delivery whose lease lapsed: the case the lease is there to prevent)
    await workers.runner().run(TICKETS, ORDER, run_id="order-1", max_supersteps=0)
    one, two = workers.runner(), workers.runner()
    meet(faulty(one), faulty(two))

    # When both advance it, continuing the same segment without a claim
    outcomes = await asyncio.gather(
        one.advance(TICKETS, "order-1", expected_step=0, handoff=True),
        two.advance(TICKETS, "order-1", expected_step=0, handoff=True),
        return_exceptions=True,
    )

    # Then the numbering fences: one saves the superstep, the other's first record is refused
    won = [o for o in outcomes if isinstance(o, RunResult)]
    lost = [o for o in outcomes if isinstance(o, CheckpointConflict)]
    assert len(won) == 1 and len(lost) == 1, outcomes
    loser = (one, two)[outcomes.index(lost[0])]
    assert faulty(loser).writes == []
    assert [op for op, _ in faulty(loser).refused] == ["record_call:started"]
    # and the tool ran once
    assert workers.ran() == {"hold_seats": 1}


async def test_a_handoff_to_a_superstep_with_records_is_claimed_as_a_recovery(workers):
    # Given a run whose worker logged hold_seats (started, done) and died before saving step 1
    first = workers.runner()
    faulty(first).crash("save", step=1)
    with pytest.raises(Crash):
        await first.run(TICKETS, ORDER, run_id="order-1")

    # When a worker takes the handoff message for step 0 (a redelivery)
    result = await workers.runner().advance(TICKETS, "order-1", expected_step=0, handoff=True)

    # Then it claims the run with a new segment as a recovery and replays the finished call
    history = await workers.history("order-1")
    assert (history[1].segment, body(history[1])["claim"]) == (1, "recovery")
    assert result.replayed and workers.ran() == {"hold_seats": 1}


_RACER = """
import asyncio, json, sys
from pathlib import Path

from _kit.faults import FaultyStore, file_rendezvous
from _kit.stores import open_spec
from _kit.tickets import KEY, TICKETS, make_tickets

from agentflow import Executor, FlowRunner
from agentflow.exec.checkpoints import CheckpointConflict


async def race(spec, run_id, me, folder):
    tickets = make_tickets()
    store = FaultyStore(open_spec(spec))
    store.rendezvous = file_rendezvous(Path(folder), me, 2)  # every racer has read the run before any claims
    store.rivals_lapsed = True  # both got past the lease (as after a lapse): the claim decides
    runner = FlowRunner(Executor(tickets.registry), checkpoints=store, checkpoint_key=KEY)
    try:
        await store.latest(run_id)  # connect before the race starts
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        try:
            result = await runner.recover(TICKETS, run_id)
            outcome, status = "won", str(result.status)
        except CheckpointConflict:
            outcome, status = "conflict", None
    finally:
        await store.aclose()
    return {"outcome": outcome, "status": status, "ledger": dict(tickets.counts()), "writes": store.writes}


print(json.dumps(asyncio.run(race(*sys.argv[1:]))), flush=True)
"""


@pytest.mark.slow  # two worker processes
@pytest.mark.parametrize("store_setup", setups(*SHARED_SETUPS), indirect=True)
async def test_two_processes_recovering_one_run_exactly_one_wins(store_setup: StoreSetup, tmp_path: Path) -> None:
    # Given a run that crashed in this process, in storage other processes can open
    workers = Workers(store_setup)
    await crashed_tickets(workers, "order-1")
    parent_ledger = workers.ran()
    assert store_setup.spec is not None

    # When two worker processes recover it at once (both read the run before either claims)
    meet_dir = tmp_path / "meet"
    meet_dir.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, store_setup.spec, "order-1", str(n), str(meet_dir)],
            env=child_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(2)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = await asyncio.to_thread(proc.stdout.readline)
            assert line.strip() == "ready", proc.stderr.read() if proc.stderr else line
        for proc in procs:  # start both before waiting for either
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = [await asyncio.to_thread(proc.communicate, None, 60) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    reports = []
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))

    # Then exactly one exits with "won" (the run done) and the other with "conflict", having written nothing
    assert sorted(r["outcome"] for r in reports) == ["conflict", "won"], reports
    (winner,) = [r for r in reports if r["outcome"] == "won"]
    (loser,) = [r for r in reports if r["outcome"] == "conflict"]
    assert winner["status"] == "done"
    assert loser["writes"] == [] and loser["ledger"] == {}
    # and each tool ran once across the three processes (charge_card replayed, email_tickets by the winner)
    assert parent_ledger == {"hold_seats": 1, "charge_card": 1}
    assert winner["ledger"] == {"email_tickets": 1}
