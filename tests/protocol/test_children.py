"""Child flows: a `Child` node starts another flow as a child run, waits for its end durably, and takes its result.

Every rule runs on every store set-up (the ``workers`` fixture). In process, a child runs
inline to its end or its first pause; the Celery tests cover children on the queue.
"""

from __future__ import annotations

from typing import Any

import pytest
from _kit.faults import body
from _kit.tickets import KEY, Crash, Refund, amount_args
from _kit.workers import faulty
from pydantic import BaseModel

from agentflow import Call, Child, Flow, RunStatus
from agentflow.errors import FlowError
from agentflow.exec.run.read import read_run
from agentflow.exec.seal import Sealer

#: The child: a refund (over 100: it waits for an approval).
REFUND = (
    Flow("refund_child", state=Refund).node("refund", Call("refund", args=amount_args, into="outcome")).end("refund")
)


class Case(BaseModel):
    amount: int
    refund: dict[str, Any] = {}
    note: str = ""


#: The parent: start a refund as a child, then notify with its outcome.
CASES = (
    Flow("cases", state=Case)
    .node("refund", Child(REFUND, state=lambda c: {"amount": c.amount}, into="refund"))
    .node("notify", Call("notify", args=lambda c: {"amount": c.amount}, into="note"))
    .edge("refund", "notify")
    .end("notify")
)


async def test_a_child_runs_to_its_end_and_its_result_goes_into_the_parent(workers):
    result = await workers.runner().run(CASES, Case(amount=50), run_id="case-1")
    assert result.status == RunStatus.DONE
    assert result.state.refund["outcome"] == "refunded 50" and result.state.note == "notified 50"
    child = (await workers.history("case-1.refund.0"))[-1]
    assert child.status == "done" and body(child)["parent"] == {"run": "case-1", "node": "refund", "superstep": 0}
    assert workers.ran("case-1.refund.0") == {"refund": 1} and workers.ran("case-1") == {"notify": 1}


async def test_a_parent_waits_for_a_paused_child_and_goes_on_once_it_ended(workers):
    # Given a parent whose child waits for an approval
    paused = await workers.runner().run(CASES, Case(amount=500), run_id="case-1")
    assert paused.status == RunStatus.PAUSED and paused.pending == []
    wake = body((await workers.history("case-1"))[-1])["wake"]
    assert wake["for"] == "child" and wake["runs"] == ["case-1.refund.0"]
    # When the sweeper looks before the child ended, Then nothing moves
    assert await workers.runner().wake_due(CASES) == {}
    # When the child is approved and ends, and the sweeper looks again (twice)
    assert (await workers.runner().resume(REFUND, "case-1.refund.0", approve=True)).status == RunStatus.DONE
    woken = await workers.runner().wake_due(CASES)
    assert await workers.runner().wake_due(CASES) == {}
    # Then the parent went on once with the child's result; the child ran once
    assert woken["case-1"].status == RunStatus.DONE and woken["case-1"].state.refund["outcome"] == "refunded 500"
    assert workers.ran("case-1.refund.0") == {"refund": 1} and workers.ran("case-1") == {"notify": 1}
    # And the read model links them both ways
    assert (await read_run(workers.raw, Sealer(KEY), "case-1")).children == ["case-1.refund.0"]
    assert (await read_run(workers.raw, Sealer(KEY), "case-1.refund.0")).parent == "case-1"


@pytest.mark.parametrize(
    ("nth_save", "where"),
    [(2, "before the child's step 0"), (3, "while the child runs"), (4, "after the child ended")],
)
async def test_a_parent_that_dies_at_any_point_ends_with_one_child_and_one_result(workers, nth_save, where):
    # Given a parent whose worker dies at a save: the parent's step 0 is the 1st, the child's step 0
    # the 2nd, the child's end the 3rd, the parent's checkpoint after the child the 4th
    runner = workers.runner()
    faulty(runner).crash("save", nth=nth_save)
    with pytest.raises(Crash):
        await runner.run(CASES, Case(amount=50), run_id="case-1")
    # When another worker recovers the parent
    result = await workers.runner().recover(CASES, "case-1")
    # Then there is one child, its refund ran once, and the parent has one result
    assert result.status == RunStatus.DONE and result.state.refund["outcome"] == "refunded 50", where
    assert workers.ran("case-1.refund.0") == {"refund": 1} and workers.ran("case-1") == {"notify": 1}
    starts = [r for r in await workers.history("case-1.refund.0") if r.step == 0]
    assert len(starts) == 1 and body(starts[0])["parent"]["run"] == "case-1"


async def test_a_failed_child_fails_its_parents_node(workers):
    def boom(state: Refund) -> dict[str, Any]:
        raise ValueError("the ledger is closed")

    failing = Flow("failing_child", state=Refund).node("boom", boom).end("boom")
    parent = Flow("p", state=Case).node("c", Child(failing, state=lambda c: {"amount": c.amount})).end("c")
    result = await workers.runner().run(parent, Case(amount=1), run_id="case-1")
    assert result.status == RunStatus.FAILED
    assert "ChildEnded: child run 'case-1.c.0' of flow 'failing_child' ended failed" in (result.error or "")
    assert "the ledger is closed" in (result.error or "")


async def test_cancelling_a_parent_cancels_the_child_it_waits_for(workers):
    await workers.runner().run(CASES, Case(amount=500), run_id="case-1")
    cancelled = await workers.runner().cancel(CASES, "case-1", reason="withdrawn", operator="ops")
    assert cancelled.status == RunStatus.CANCELLED
    child = (await workers.history("case-1.refund.0"))[-1]
    assert child.status == "cancelled" and "its parent run case-1 was cancelled" in body(child)["error"]
    assert workers.ran("case-1.refund.0") == {}


async def test_a_run_under_the_childs_id_that_the_parent_did_not_start_is_not_adopted(workers):
    # Given someone started a refund under the id the parent's child will have
    await workers.runner().run(REFUND, Refund(amount=500), run_id="case-1.refund.0")
    # When the parent runs, Then its node refuses the run (no parent lineage) and the parent fails, loudly
    with pytest.raises(FlowError, match="not adopted"):
        await workers.runner().run(CASES, Case(amount=500), run_id="case-1")
    assert (await workers.history("case-1"))[-1].status == "failed"
    assert workers.ran("case-1.refund.0") == {}
    # And the parent's start retried gives the failed run as it stands (it attaches), adopting nothing
    steps = len(await workers.history("case-1"))
    again = await workers.runner().run(CASES, Case(amount=500), run_id="case-1")
    assert again.status == "failed" and len(await workers.history("case-1")) == steps
    assert workers.ran("case-1.refund.0") == {}


def test_a_child_node_takes_a_flow_and_names_a_field_the_state_has():
    with pytest.raises(FlowError, match="takes a Flow"):
        Flow("p", state=Case).node("c", Child("refund_child", state=lambda c: {}))
    with pytest.raises(FlowError, match="names a field"):
        Flow("p", state=Case).node("c", Child(REFUND, state=lambda c: {}, into="nope"))
