"""A distributed resume: a decision stored by one process, spent by the worker that takes the handoff.

A flow can pause in a superstep whose other calls already finished: the entry fans out to
`charge` (runs at once, not idempotent) and `wire` (needs approval). `FlowClient.resume`
stores the decision as a claim checkpoint without running anything; a worker then takes
the "resume" message as a handoff (`FlowRunner.advance(..., handoff=True)`). That worker
must replay `charge` from the log, never run it again, on every store, including those
whose per-segment record counts let a plain handoff skip reading the log.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator

import pytest
from pydantic import BaseModel
from storespec import make_store

from agentflow import Call, Executor, Flow, FlowRunner, Registry
from agentflow.exec.checkpoints import CheckpointStore

KEY = b"resume-handoff-test-key-0123456789"
RAN: Counter[str] = Counter()

registry = Registry()


@registry.tool(idempotent=True)
async def begin(order: str) -> str:
    return f"began {order}"


@registry.tool
async def charge(order: str) -> str:
    RAN["charge"] += 1
    return f"charged {order}"


@registry.tool(approval=True)
async def wire(order: str) -> str:
    RAN["wire"] += 1
    return f"wired {order}"


class Order(BaseModel):
    order: str = "A1"
    began: str = ""
    charged: str = ""
    wired: str = ""


def args(o: Order) -> dict[str, str]:
    return {"order": o.order}


FLOW = (
    Flow("fanout", state=Order)
    .node("begin", Call("begin", args=args, into="began"))
    .node("charge", Call("charge", args=args, into="charged"))
    .node("wire", Call("wire", args=args, into="wired"))
    .edge("begin", "charge")
    .edge("begin", "wire")
    .end("charge", "wire")
)


@pytest.fixture
async def store(shared_store: str) -> AsyncIterator[CheckpointStore]:
    """The store `shared_store` names (tests/conftest.py removes its keys or tables afterwards)."""
    RAN.clear()
    made: CheckpointStore = make_store(shared_store)
    yield made
    await made.aclose()


def runner(store: CheckpointStore) -> FlowRunner:
    return FlowRunner(Executor(registry), checkpoints=store, checkpoint_key=KEY)


@pytest.mark.parametrize(
    "shared_store",
    ["sqlite", pytest.param("redis", marks=pytest.mark.redis), pytest.param("sql", marks=pytest.mark.postgres)],
    indirect=True,
)
async def test_a_worker_spending_a_stored_decision_replays_the_calls_that_finished_before_the_pause(store):
    # Given a run paused on wire, after charge ran in the same superstep
    paused = await runner(store).run(FLOW, Order(), run_id="r1")
    assert paused.status == "paused" and [p.tool for p in paused.pending] == ["wire"]
    assert RAN == {"charge": 1}
    # When one process stores the approval without running anything (what FlowClient.resume does)
    decided = await runner(store).resume(FLOW, "r1", approve=True, max_supersteps=0)
    assert RAN == {"charge": 1}
    # And a worker takes the resume message as a handoff
    result = await runner(store).advance(FLOW, "r1", expected_step=decided.step, handoff=True)
    # Then wire ran once, charge was replayed from the log and not run again, and the run ended
    assert result.status == "done"
    assert RAN == {"charge": 1, "wire": 1}
    assert [cid.split("/")[1] for cid in result.replayed] == ["charge"]
    assert (result.state.charged, result.state.wired) == ("charged A1", "wired A1")
    # And it went on in the decision's segment: a resume, not a recovery claim
    after = [cp.segment for cp in await store.history("r1") if cp.step >= decided.step]
    assert len(after) > 1 and set(after) == {after[0]}


@pytest.mark.parametrize(
    "shared_store",
    ["sqlite", pytest.param("redis", marks=pytest.mark.redis), pytest.param("sql", marks=pytest.mark.postgres)],
    indirect=True,
)
async def test_a_worker_spending_a_stored_denial_never_runs_the_denied_call(store):
    # Given a run paused on wire after charge ran, and a denial stored without running anything
    await runner(store).run(FLOW, Order(), run_id="r1")
    decided = await runner(store).resume(FLOW, "r1", approve=False, note="not today", max_supersteps=0)
    # When a worker takes the resume message as a handoff
    result = await runner(store).advance(FLOW, "r1", expected_step=decided.step, handoff=True)
    # Then wire never ran, charge was not run again, and the run failed with the denial (wire has no on_deny)
    assert RAN == {"charge": 1}
    assert result.status == "failed"
    assert result.error is not None and "denied" in result.error and "not today" in result.error
