"""Approvals in durable runs: a pause is not a crash; a resume is stored, then spent; a port wait is in doubt.

Every test runs on every store set-up (`_kit.stores`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from _kit.faults import body, meet
from _kit.tickets import ORDER, REFUNDS, TICKETS, WIRES, Crash, Refund
from _kit.workers import Workers, faulty

from agentflow import Flow, RunContext
from agentflow.errors import IdentityMismatch
from agentflow.exec.checkpoints import CheckpointConflict, RecoveryNeedsDecision
from agentflow.flow import RunResult

BIG = Refund(amount=500)
SMALL = Refund(amount=50)


async def paused_refund(workers: Workers, run_id: str = "refund-1", ctx: RunContext | None = None) -> RunResult[Refund]:
    result = await workers.runner().run(REFUNDS, BIG, run_id=run_id, ctx=ctx)
    assert result.status == "paused"
    return result


async def test_tool_needing_approval_pauses_the_run_and_nothing_is_in_doubt(workers):
    # Given a refund over 100 (its tool's policy asks for approval) and no approval port
    runner = workers.runner()

    # When the run reaches the call
    result = await runner.run(REFUNDS, BIG, run_id="refund-1")

    # Then the run pauses with the request, the checkpoint says paused, a `pending` record is logged
    assert result.status == "paused"
    (request,) = result.pending
    assert (request.tool, request.args, request.node) == ("refund", {"amount": 500}, "refund")
    assert request.call_id.startswith("0/refund/0/")
    history = await workers.history("refund-1")
    assert [c.status for c in history] == ["running", "paused"]
    records = await workers.calls("refund-1")
    assert [r.kind for r in records] == ["pending"]
    assert body(records[0])["call_id"] == request.call_id
    assert workers.ran()["refund"] == 0
    assert list(await workers.raw.list_unfinished("refunds")) == ["refund-1"]

    # When a worker recovers it (no decision given)
    recovered = await workers.runner().recover(REFUNDS, "refund-1")

    # Then it comes back as the same paused result: nothing in doubt, nothing run, nothing claimed
    assert recovered.status == "paused"
    assert [p.call_id for p in recovered.pending] == [request.call_id]
    assert workers.ran()["refund"] == 0
    assert len(await workers.history("refund-1")) == 2


async def test_recover_all_gives_paused_runs_back_as_paused(workers):
    # Given a paused refund
    paused = await paused_refund(workers)

    # When a worker starting up recovers every unfinished run of the flow
    out = await workers.runner().recover_all(REFUNDS)

    # Then the paused run comes back paused with its request; nothing ran
    result = out["refund-1"]
    assert isinstance(result, RunResult) and result.status == "paused"
    assert [p.call_id for p in result.pending] == [p.call_id for p in paused.pending]
    assert workers.ran() == {}


async def test_plain_resume_is_not_reported_as_a_recovery(workers):
    # Given a paused refund (paused, not crashed)
    await paused_refund(workers)

    # When it is resumed
    await workers.runner().resume(REFUNDS, "refund-1", approve=True)

    # Then no run.recovered event says it was recovered
    assert workers.named("run.recovered") == []


async def test_approval_policy_pauses_only_the_calls_it_picks(workers):
    # Given the refund tool's policy `amount > 100`
    runner = workers.runner()

    # When a small and a big refund run
    small = await runner.run(REFUNDS, SMALL, run_id="small")
    big = await runner.run(REFUNDS, BIG, run_id="big")

    # Then only the big one pauses; the small one ran and finished
    assert small.status == "done" and small.state.outcome == "refunded 50"
    assert big.status == "paused"
    assert workers.ran() == {"refund": 1, "notify": 1}


async def test_resume_with_approval_runs_the_call_once_and_finishes(workers):
    # Given a paused refund
    await paused_refund(workers)

    # When it is resumed with approve=True (by another worker)
    result = await workers.runner().resume(REFUNDS, "refund-1", approve=True)

    # Then the refund ran once and the run finished
    assert result.status == "done"
    assert (result.state.outcome, result.state.after) == ("refunded 500", "notified 500")
    assert workers.ran() == {"refund": 1, "notify": 1}
    assert [r.kind for r in await workers.calls("refund-1")] == ["pending", "started", "done", "started", "done"]
    assert (await workers.history("refund-1"))[-1].status == "done"


async def test_resume_with_denial_does_not_run_the_tool_and_on_deny_lets_the_flow_branch(workers):
    # Given a paused refund whose Call has on_deny="denied"
    await paused_refund(workers)

    # When it is resumed with approve=False
    result = await workers.runner().resume(REFUNDS, "refund-1", approve=False)

    # Then the refund never ran, its field got "denied" and the flow took the apologize branch
    assert result.status == "done"
    assert (result.state.outcome, result.state.after) == ("denied", "apologized 500")
    assert workers.ran() == {"apologize": 1}
    assert "denied" in [r.kind for r in await workers.calls("refund-1")]


async def test_denial_without_on_deny_fails_the_run_with_approval_denied(workers):
    # Given a paused wire (always needs approval; its Call has no on_deny)
    paused = await workers.runner().run(WIRES, Refund(amount=10), run_id="wire-1")
    assert paused.status == "paused"

    # When it is resumed with approve=False
    result = await workers.runner().resume(WIRES, "wire-1", approve=False)

    # Then the run failed with ApprovalDenied and the wire never ran
    assert result.status == "failed"
    assert result.error is not None and "ApprovalDenied" in result.error
    assert workers.ran() == {}
    assert (await workers.history("wire-1"))[-1].status == "failed"


@pytest.mark.parametrize("state", ["done", "running", "resumed"])
async def test_resume_of_a_run_that_is_not_paused_is_a_conflict(workers, state):
    # Given a run that is not paused: finished, crashed while running, or paused and already resumed
    flow: Flow[Any]
    if state == "done":
        flow = TICKETS
        await workers.runner().run(TICKETS, ORDER, run_id="run-1")
    elif state == "running":
        flow = TICKETS
        first = workers.runner()
        faulty(first).crash("save", step=2)
        with pytest.raises(Crash):
            await first.run(TICKETS, ORDER, run_id="run-1")
    else:
        flow = REFUNDS
        await paused_refund(workers, "run-1")
        await workers.runner().resume(REFUNDS, "run-1", approve=True)
    before, steps = workers.ran(), len(await workers.history("run-1"))

    # When someone resumes it
    # Then CheckpointConflict, and nothing ran or was saved
    with pytest.raises(CheckpointConflict):
        await workers.runner().resume(flow, "run-1", approve=True)
    assert workers.ran() == before
    assert len(await workers.history("run-1")) == steps


async def test_two_racing_resumes_exactly_one_wins(workers):
    # Given a paused refund and two workers that both read it before either claims
    await paused_refund(workers)
    one, two = workers.runner(), workers.runner()
    meet(faulty(one), faulty(two))

    # When both resume it at once
    outcomes = await asyncio.gather(
        one.resume(REFUNDS, "refund-1", approve=True),
        two.resume(REFUNDS, "refund-1", approve=True),
        return_exceptions=True,
    )

    # Then exactly one wins, the other gets CheckpointConflict, and the refund ran once
    assert sorted(type(o).__name__ for o in outcomes) == ["CheckpointConflict", "RunResult"], outcomes
    (won,) = [o for o in outcomes if isinstance(o, RunResult)]
    assert won.status == "done"
    assert workers.ran() == {"refund": 1, "notify": 1}


async def test_a_resume_that_reads_the_log_after_a_rival_resume_took_the_run_is_a_conflict(workers):
    # Given a paused refund, read (still paused) by a worker that is slow to go on
    await paused_refund(workers)
    paused_row = await workers.raw.latest("refund-1")
    # and a rival resume that won the claim, logged `started` for the refund and died
    rival = workers.runner()
    faulty(rival).crash("started", when="after", node="refund")
    with pytest.raises(Crash):
        await rival.resume(REFUNDS, "refund-1", approve=True)
    slow = workers.runner()

    faulty(slow).stale_latest = paused_row
    # When the slow worker goes on from the paused checkpoint it read, and reads the log
    # Then it is told another resume won (not that a call is in doubt), and writes nothing
    with pytest.raises(CheckpointConflict, match="resumed by another worker"):
        await slow.resume(REFUNDS, "refund-1", approve=True)
    assert faulty(slow).writes == []
    assert workers.ran() == {}


@pytest.mark.parametrize(
    ("approve", "record", "outcome", "ledger"),
    [
        (True, "started", "refunded 500", {"refund": 1, "notify": 1}),
        (False, "denied", "denied", {"apologize": 1}),
    ],
    ids=["approved", "denied"],
)
async def test_crash_after_the_resume_save_is_recovered_by_spending_the_stored_decision(
    workers, approve, record, outcome, ledger
):
    # Given a paused refund, resumed by a worker that dies right after saving the decision
    # (before it writes the call's next record)
    await paused_refund(workers)
    resumer = workers.runner()
    faulty(resumer).crash(record, node="refund")
    with pytest.raises(Crash):
        await resumer.resume(REFUNDS, "refund-1", approve=approve)
    latest = (await workers.history("refund-1"))[-1]
    assert latest.status == "running"
    assert workers.ran() == {}

    # When another worker recovers it, giving no decision
    result = await workers.runner().recover(REFUNDS, "refund-1")

    # Then the stored decision is spent without asking again, once
    assert result.status == "done"
    assert result.state.outcome == outcome
    assert workers.ran() == ledger


async def test_crash_before_the_resume_save_leaves_the_run_paused_and_resumable(workers):
    # Given a paused refund, resumed by a worker that dies before saving the decision
    await paused_refund(workers)
    resumer = workers.runner()
    faulty(resumer).crash("save")
    with pytest.raises(Crash):
        await resumer.resume(REFUNDS, "refund-1", approve=True)

    # Then the run is still paused, nothing ran
    assert (await workers.history("refund-1"))[-1].status == "paused"
    assert (await workers.runner().recover(REFUNDS, "refund-1")).status == "paused"
    assert workers.ran() == {}

    # And it can be resumed again
    result = await workers.runner().resume(REFUNDS, "refund-1", approve=True)
    assert result.status == "done"
    assert workers.ran() == {"refund": 1, "notify": 1}


async def test_sync_approval_port_is_asked_after_the_call_is_logged_started(workers):
    # Given a synchronous approval port that looks at the call log when it is asked
    seen: list[list[tuple[str, str | None]]] = []

    async def approver(request):
        seen.append([(r.kind, body(r).get("tool")) for r in await workers.calls("wire-1")])
        return True

    runner = workers.runner(approver=approver)

    # When a run makes a call that needs approval
    result = await runner.run(WIRES, Refund(amount=10), run_id="wire-1")

    # Then the port was asked once, with the call already logged `started`; the run did not pause
    assert seen == [[("started", "wire")]]
    assert result.status == "done"
    assert workers.ran() == {"wire": 1, "notify": 1}


async def test_crash_while_the_approval_port_waits_leaves_the_call_in_doubt(workers):
    # Given a synchronous approval port during whose wait the worker dies
    def dying_approver(request):
        raise Crash("the worker died while the approver was waiting")

    with pytest.raises(Crash):
        await workers.runner(approver=dying_approver).run(WIRES, Refund(amount=10), run_id="wire-1")
    assert [r.kind for r in await workers.calls("wire-1")] == ["started"]

    # When a worker recovers it without a decision
    # Then the call is in doubt (the wire is not idempotent) and nothing ran
    with pytest.raises(RecoveryNeedsDecision) as caught:
        await workers.runner(approver=lambda request: True).recover(WIRES, "wire-1")
    assert [tool for tool, _ in caught.value.calls] == ["wire"]
    assert workers.ran() == {}

    # And after checking, it can be rerun (and approved again)
    result = await workers.runner(approver=lambda request: True).recover(WIRES, "wire-1", rerun_in_doubt=True)
    assert result.status == "done"
    assert workers.ran() == {"wire": 1, "notify": 1}


@pytest.mark.parametrize(
    ("owner", "intruder"),
    [
        (RunContext(user="alice", thread="t1"), RunContext(user="mallory", thread="t1")),
        (RunContext(user="alice", thread="t1"), RunContext(user="alice", thread="t2")),
        (RunContext(user="alice", thread="t1", principal="tok-alice"), None),
        (RunContext(user="alice", thread="t1", principal="tok-alice"), RunContext(principal="tok-mallory")),
    ],
    ids=["other-user", "other-thread", "missing-principal", "wrong-principal"],
)
async def test_resume_applies_the_identity_rules(workers, owner, intruder):
    # Given a refund paused for its owner
    await paused_refund(workers, ctx=owner)

    # When someone else resumes it
    # Then IdentityMismatch, nothing ran, the run is still paused
    with pytest.raises(IdentityMismatch):
        await workers.runner().resume(REFUNDS, "refund-1", approve=True, ctx=intruder)
    assert workers.ran() == {}
    assert (await workers.history("refund-1"))[-1].status == "paused"

    # And its owner can resume it
    result = await workers.runner().resume(REFUNDS, "refund-1", approve=True, ctx=owner)
    assert result.status == "done"
    assert workers.ran() == {"refund": 1, "notify": 1}
