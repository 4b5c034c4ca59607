"""Two workers on one run: the claim is a compare-and-set, and a cut-off worker is fenced."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import durable_kit as kit
import pytest
from durable_kit import BATCH, LOOKUP, ORDER, TICKETS, Crash

from agentflow.exec.checkpoints import CheckpointConflict
from agentflow.flow import RunResult

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


@pytest.fixture(params=kit.STORE_KINDS)
async def env(request, tmp_path):
    async with kit.open_env(request.param, tmp_path) as opened:
        yield opened


async def crashed_tickets(env: kit.Env, run_id: str) -> None:
    first = env.runner()
    first.checkpoints.crash("save", step=2)
    with pytest.raises(Crash):
        await first.run(TICKETS, ORDER, run_id=run_id)


@pytest.mark.parametrize("flow", [TICKETS, kit.SWITCHED], ids=["same-flow", "other-flow"])
async def test_starting_a_run_with_a_taken_run_id_is_a_conflict(env, flow):
    # Given a run that is under way (its worker died after step 1)
    await crashed_tickets(env, "order-1")
    before, steps = kit.snapshot(), len(await env.history("order-1"))

    # When another worker starts a run with the same id (step 0 only for a new run)
    # Then CheckpointConflict before any tool runs, and the stored run is untouched
    with pytest.raises(CheckpointConflict):
        await env.runner().run(flow, ORDER, run_id="order-1")
    assert kit.LEDGER == before
    assert len(await env.history("order-1")) == steps


async def test_two_workers_recovering_one_run_exactly_one_wins(env):
    # Given a crashed run, and two workers that both read its checkpoint and call log before either claims
    await crashed_tickets(env, "order-1")
    one, two = env.runner(), env.runner()
    one.checkpoints.rendezvous = two.checkpoints.rendezvous = asyncio.Barrier(2)

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
    assert loser.checkpoints.writes == []
    assert [op for op, _ in loser.checkpoints.refused] == ["save"]
    # and each tool ran once in all
    assert kit.LEDGER == {"hold_seats": 1, "charge_card": 1, "email_tickets": 1}


async def test_cut_off_worker_has_its_next_started_record_refused(env):
    # Given worker A inside slow_lookup (held open), in a node that will call charge_card next
    release, entered = kit.gate("slow_lookup")
    a = env.runner()
    a_run = asyncio.create_task(a.run(BATCH, ORDER, run_id="batch-1"))
    await asyncio.wait_for(entered.wait(), 10)

    # When worker B, taking A for dead, recovers the run (so it holds a new segment), charges and mails,
    # and dies before its last checkpoint: the run is still running, held by B's segment
    b = env.runner()
    b.checkpoints.crash("save", step=3)
    with pytest.raises(Crash):
        await b.recover(BATCH, "batch-1")
    latest = (await env.history("batch-1"))[-1]
    assert (latest.status, latest.segment) == ("running", 1)
    assert kit.LEDGER["charge_card"] == 1

    # And A wakes up and goes on to its next call
    release.set()
    with pytest.raises(CheckpointConflict):
        await asyncio.wait_for(a_run, 10)

    # Then A's `started` record for charge_card was refused (fenced), so A never charged, and A saved nothing
    assert [op for op, _ in a.checkpoints.refused] == ["record_call:started"]
    assert [w for w in a.checkpoints.writes if w.startswith("save:")] == ["save:0:running"]
    assert kit.LEDGER == {"hold_seats": 1, "slow_lookup": 2, "charge_card": 1, "email_tickets": 1}

    # And a third worker finishes the run without charging or mailing again
    result = await env.runner().recover(BATCH, "batch-1")
    assert result.status == "done"
    assert kit.LEDGER == {"hold_seats": 1, "slow_lookup": 2, "charge_card": 1, "email_tickets": 1}


async def test_cut_off_worker_has_its_next_save_refused(env):
    # Given worker A inside slow_lookup (held open), the only call of its superstep
    release, entered = kit.gate("slow_lookup")
    a = env.runner()
    a_run = asyncio.create_task(a.run(LOOKUP, ORDER, run_id="lookup-1"))
    await asyncio.wait_for(entered.wait(), 10)

    # When worker B recovers the run, pays and mails, and dies before its last checkpoint
    b = env.runner()
    b.checkpoints.crash("save", step=4)
    with pytest.raises(Crash):
        await b.recover(LOOKUP, "lookup-1")
    history = await env.history("lookup-1")
    assert (history[-1].status, history[-1].segment) == ("running", 1)
    steps = len(history)

    # And A wakes up and ends its superstep
    release.set()
    with pytest.raises(CheckpointConflict):
        await asyncio.wait_for(a_run, 10)

    # Then A's checkpoint save was refused (B holds the run) and A started no call
    assert [op for op, _ in a.checkpoints.refused] == ["save"]
    assert len(await env.history("lookup-1")) == steps
    assert kit.LEDGER == {"slow_lookup": 2, "charge_card": 1, "email_tickets": 1}

    # And a third worker finishes the run without charging or mailing again
    result = await env.runner().recover(LOOKUP, "lookup-1")
    assert result.status == "done"
    assert kit.LEDGER == {"slow_lookup": 2, "charge_card": 1, "email_tickets": 1}


# -- distributed handoffs (FlowRunner.advance) ----------------------------------------------


async def test_a_clean_handoff_continues_the_segment_with_one_checkpoint_per_superstep(env):
    # Given a run whose step 0 is saved and that workers advance one superstep at a time
    await env.runner().run(TICKETS, ORDER, run_id="order-1", max_supersteps=0)

    # When three workers in turn each take a clean handoff
    for step in range(3):
        result = await env.runner().advance(TICKETS, "order-1", expected_step=step, handoff=True)

    # Then the run is done with one checkpoint per superstep and no claim: one segment throughout
    assert result.status == "done" and result.replayed == []
    history = await env.history("order-1")
    assert [(c.step, c.segment) for c in history] == [(0, 0), (1, 0), (2, 0), (3, 0)]
    assert not any("claim" in kit.body(c) for c in history)
    # and the call records of all three workers are numbered on, without a gap
    calls = await env.calls("order-1")
    assert [(c.segment, c.seq) for c in calls] == [(0, n) for n in range(6)]
    assert kit.LEDGER == {"hold_seats": 1, "charge_card": 1, "email_tickets": 1}


async def test_two_workers_taking_one_clean_handoff_act_once(env):
    # Given a handed-over run, and two workers that both read it before either writes
    # (a duplicate delivery whose lease lapsed: the case the lease is there to prevent)
    await env.runner().run(TICKETS, ORDER, run_id="order-1", max_supersteps=0)
    one, two = env.runner(), env.runner()
    one.checkpoints.rendezvous = two.checkpoints.rendezvous = asyncio.Barrier(2)

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
    assert loser.checkpoints.writes == []
    assert [op for op, _ in loser.checkpoints.refused] == ["record_call:started"]
    # and the tool ran once
    assert kit.LEDGER == {"hold_seats": 1}


async def test_a_handoff_to_a_superstep_with_records_is_claimed_as_a_recovery(env):
    # Given a run whose worker logged hold_seats (started, done) and died before saving step 1
    first = env.runner()
    first.checkpoints.crash("save", step=1)
    with pytest.raises(Crash):
        await first.run(TICKETS, ORDER, run_id="order-1")

    # When a worker takes the handoff message for step 0 (a redelivery)
    result = await env.runner().advance(TICKETS, "order-1", expected_step=0, handoff=True)

    # Then it claims the run with a new segment as a recovery and replays the finished call
    history = await env.history("order-1")
    assert (history[1].segment, kit.body(history[1])["claim"]) == (1, "recovery")
    assert result.replayed and kit.LEDGER == {"hold_seats": 1}


_RACER = """
import asyncio, json, sys
import durable_kit
print(json.dumps(asyncio.run(durable_kit.race_recover(*sys.argv[1:]))), flush=True)
"""


async def test_two_processes_recovering_one_run_on_sqlite_exactly_one_wins(tmp_path):
    # Given a run that crashed in this process, stored in an SQLite file
    async with kit.open_env("sqlite", tmp_path) as env:
        await crashed_tickets(env, "order-1")
        assert env.path is not None
        path = env.path
        parent_ledger = kit.snapshot()

    # When two worker processes recover it at once (both read the log before either claims)
    meet = tmp_path / "meet"
    meet.mkdir()
    child_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO)])}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, str(path), "order-1", str(n), str(meet)],
            cwd=HERE,
            env=child_env,
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
