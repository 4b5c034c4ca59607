"""`RunReport.waiting`: what a run that stopped moving waits for, the same for every kind of run.

Each rule is held on a report as `read_run` fills it (the fields it sets from the checked rows):
a parked run waits for a decision on its calls in doubt, a paused one for an approval, its timer
or its child runs, a run whose store could not confirm a write for durability; a run a live
worker holds, or one that ended, waits for nothing.
"""

from __future__ import annotations

import pytest

from agentflow import RunKind
from agentflow.exec.checkpoints.records import Lease
from agentflow.exec.run.view import IN_DOUBT, CallView, CheckpointView, RunReport, StoreWait, WaitingCall

AT = 1_800_000_000.0


def report(status: str, kind: RunKind = RunKind.FLOW) -> RunReport:
    """A checked run at step 3 (superstep 2), of `kind`, in `status`."""
    made = RunReport("r-1", "tickets" if kind is RunKind.FLOW else "loop:support", kind, status, 3, AT)
    made.checkpoints = [CheckpointView(3, AT, status, 3, superstep=2, what="claim (parked)")]
    return made


def in_doubt(call_id: str, tool: str) -> CallView:
    return CallView(call_id, tool, "pay", 2, "started", {"amount": 5}, [0], state=IN_DOUBT, note="no result")


@pytest.mark.parametrize("kind", list(RunKind))
def test_a_parked_run_waits_for_a_decision_naming_each_call_in_doubt_with_its_reason(kind: RunKind) -> None:
    # Given a run parked on two calls of one tool and one of another, in doubt (the claim's reasons in log order)
    parked = report("running", kind)
    parked.calls = [in_doubt("2/pay/0/a", "charge"), in_doubt("2/pay/1/b", "charge"), in_doubt("2/pay/2/c", "mail")]
    parked.awaiting = [("charge", "first"), ("charge", "second"), ("mail", "third")]
    # Then it waits for a decision on exactly those calls, each with the reason given for it
    waiting = parked.waiting
    assert waiting is not None and waiting.what == "decision" and waiting.until is None
    assert waiting.calls == (
        WaitingCall("2/pay/0/a", "charge", {"amount": 5}, "first"),
        WaitingCall("2/pay/1/b", "charge", {"amount": 5}, "second"),
        WaitingCall("2/pay/2/c", "mail", {"amount": 5}, "third"),
    )
    assert waiting.why == "a decision on calls in doubt: charge (first); charge (second); mail (third)"


def test_a_parked_run_a_live_worker_holds_waits_for_nothing_yet() -> None:
    parked = report("running")
    parked.calls, parked.awaiting = [in_doubt("2/pay/0/a", "charge")], [("charge", "no result")]
    parked.lease = Lease("r-1", "w1@host:1", "token", AT + 30)
    assert parked.waiting is None


def test_a_paused_run_waits_for_an_approval_of_its_pending_calls_until_its_deadline() -> None:
    paused = report("paused")
    paused.pending = [{"call_id": "1/refund/0/d", "tool": "refund", "args": {"amount": 500}, "node": "refund"}]
    paused.wake = {"at": AT + 60, "for": "approval"}
    waiting = paused.waiting
    assert waiting is not None and waiting.what == "approval" and waiting.until == AT + 60
    assert waiting.calls == (WaitingCall("1/refund/0/d", "refund", {"amount": 500}, "needs approval"),)


def test_a_paused_run_waits_for_its_timer_or_its_child_runs() -> None:
    timer, parent = report("paused"), report("paused")
    timer.wake = {"at": AT + 5, "for": "timer"}
    parent.wake = {"at": AT + 1, "for": "child", "runs": ["child-1", "child-2"]}
    assert timer.waiting is not None and (timer.waiting.what, timer.waiting.until) == ("timer", AT + 5)
    assert parent.waiting is not None and (parent.waiting.what, parent.waiting.runs) == (
        "child",
        ("child-1", "child-2"),
    )
    assert parent.waiting.why == "its child run(s) child-1, child-2 to end"


def test_a_run_whose_store_could_not_confirm_a_write_waits_for_durability() -> None:
    stopped = report("running")
    stopped.waiting_for_store = StoreWait(3, "WAIT acknowledged by 0 of 1 replicas", AT, AT + 2)
    assert stopped.waiting is not None and (stopped.waiting.what, stopped.waiting.until) == ("durability", AT + 2)


@pytest.mark.parametrize("status", ["done", "failed", "cancelled"])
def test_a_run_that_ended_or_moves_on_its_own_waits_for_nothing(status: str) -> None:
    assert report(status).waiting is None
    assert report("running").waiting is None  # nobody parked it: a worker or the sweep carries it on
