"""A distributed resume: a decision stored by one process, spent by the worker that takes the handoff.

A flow can pause in a superstep whose other calls already finished: `FANOUT`'s hold fans out
to pay (charge_card: runs at once, not idempotent) and wire (wire_money: needs approval).
`FlowClient.resume` stores the decision as a claim checkpoint without running anything; a
worker then takes the "resume" message as a handoff (`FlowRunner.advance(..., handoff=True)`).
That worker must replay the charge from the log, never run it again, on every store set-up,
including those whose per-segment record counts let a plain handoff skip reading the log.
"""

from __future__ import annotations

import pytest
from _kit.tickets import FANOUT, ORDER
from _kit.workers import Workers


@pytest.fixture
def atomic(workers: Workers) -> Workers:
    """Workers whose stores write a held ``done`` with its checkpoint, as every shipped store does."""
    workers.atomic_saves = True
    return workers


async def test_a_worker_spending_a_stored_decision_replays_the_calls_that_finished_before_the_pause(atomic):
    workers = atomic
    # Given a run paused on wire, after pay ran in the same superstep
    paused = await workers.runner().run(FANOUT, ORDER, run_id="r1")
    assert paused.status == "paused" and [p.tool for p in paused.pending] == ["wire_money"]
    assert workers.ran() == {"hold_seats": 1, "charge_card": 1}
    # When one process stores the approval without running anything (what FlowClient.resume does)
    decided = await workers.runner().resume(FANOUT, "r1", approve=True, max_supersteps=0)
    assert workers.ran() == {"hold_seats": 1, "charge_card": 1}
    # And a worker takes the resume message as a handoff
    result = await workers.runner().advance(FANOUT, "r1", expected_step=decided.step, handoff=True)
    # Then wire ran once, pay was replayed from the log and not run again, and the run ended
    assert result.status == "done"
    assert workers.ran() == {"hold_seats": 1, "charge_card": 1, "wire_money": 1}
    assert [cid.split("/")[1] for cid in result.replayed] == ["pay"]
    assert (result.state.paid, result.state.wired) == ("charged 80 for Hamlet", "wired 80 for Hamlet")
    # And it went on in the decision's segment: a resume, not a recovery claim
    after = [cp.segment for cp in await workers.history("r1") if cp.step >= decided.step]
    assert len(after) > 1 and set(after) == {after[0]}


async def test_a_worker_spending_a_stored_denial_never_runs_the_denied_call(atomic):
    workers = atomic
    # Given a run paused on wire after pay ran, and a denial stored without running anything
    await workers.runner().run(FANOUT, ORDER, run_id="r1")
    decided = await workers.runner().resume(FANOUT, "r1", approve=False, note="not today", max_supersteps=0)
    # When a worker takes the resume message as a handoff
    result = await workers.runner().advance(FANOUT, "r1", expected_step=decided.step, handoff=True)
    # Then wire never ran, pay was not run again, and the run failed with the denial (wire has no on_deny)
    assert workers.ran() == {"hold_seats": 1, "charge_card": 1}
    assert result.status == "failed"
    assert result.error is not None and "denied" in result.error and "not today" in result.error
