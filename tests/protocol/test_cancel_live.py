"""Cancelling a run a live worker holds: a signed request, honoured before the next call starts.

Every rule runs on every store set-up (the ``workers`` fixture).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from _kit.faults import body
from _kit.tickets import BATCH, KEY, KEY_B, LOOKUP, ORDER, REFUNDS, Order, Refund, make_tickets, show_args
from _kit.workers import Workers

from agentflow import Call, Flow, RunResult, RunStatus
from agentflow.exec import LoopRunner, run_tool_loop
from agentflow.exec.run.cancel import KIND, REQUEST_TTL_S, CancelRequest
from agentflow.exec.run.markers import key_of, marker_value
from agentflow.exec.seal import Sealer
from agentflow.models import Message, ScriptedModel, ToolCall


async def _inside_slow_lookup(
    workers: Workers, flow: Flow[Order], run_id: str
) -> tuple[asyncio.Event, asyncio.Task[RunResult[Order]]]:
    """Start `flow` on a worker and return once its slow_lookup call is in flight (gate closed)."""
    release, entered = workers.tickets.gate("slow_lookup")
    running = asyncio.create_task(workers.runner().run(flow, ORDER, run_id=run_id))
    await asyncio.wait_for(entered.wait(), 10)
    return release, running


async def _request(workers: Workers, run_id: str) -> str | None:
    """What the cancel request marker holds (None: no request)."""
    mark = (await workers.raw.peek_markers([key_of(KIND, run_id)])).get(key_of(KIND, run_id))
    return None if mark is None else mark.value


async def _leave(workers: Workers, run_id: str, value: str) -> None:
    """Write `value` as the run's cancel marker, straight into the store (as an attacker or an old request would)."""
    await workers.raw.put_marker(key_of(KIND, run_id), value, "t" * 32, REQUEST_TTL_S)


def _signed(key: bytes, run_id: str, request: CancelRequest, now: float | None = None) -> str:
    return marker_value(Sealer(key), KIND, run_id, request.body(), REQUEST_TTL_S, now)[1]


async def test_a_held_run_finishes_its_call_in_flight_then_ends_cancelled_before_the_next(workers):
    # Given a run whose worker is inside slow_lookup (it holds the run's lease)
    release, running = await _inside_slow_lookup(workers, LOOKUP, "lookup-1")
    # When an operator cancels it
    asked = await workers.runner().cancel(LOOKUP, "lookup-1", reason="customer left", operator="alice")
    # Then the request is posted (the run still runs), naming the holder
    assert asked.status == RunStatus.RUNNING
    (requested,) = workers.named("run.cancel_requested")
    assert requested.data["operator"] == "alice" and requested.data["holder"].startswith("runner@")
    # And when the call in flight finishes, the worker logs it and stops before charging the card
    release.set()
    result = await asyncio.wait_for(running, 10)
    assert result.status == RunStatus.CANCELLED
    assert result.error == "cancelled by alice: customer left"
    assert workers.ran("lookup-1") == {"slow_lookup": 1}
    kinds = [(r.kind, body(r)["call_id"].split("/")[1]) for r in await workers.calls("lookup-1")]
    assert kinds == [("started", "look"), ("done", "look")]
    latest = (await workers.history("lookup-1"))[-1]
    assert latest.status == "cancelled"
    assert body(latest)["claim"] == "cancel" and body(latest)["operator"] == "alice"
    assert body(latest)["reason"] == "customer left"
    # And the request is spent: its marker is gone
    assert await _request(workers, "lookup-1") is None


#: One superstep: its only call is also its last.
ONE_STEP = Flow("one-step", state=Order).node("look", Call("slow_lookup", args=show_args, into="looked")).end("look")


async def test_a_request_during_the_last_call_ends_the_run_cancelled_with_the_call_logged(workers):
    # Given a one-superstep run inside its only call
    release, running = await _inside_slow_lookup(workers, ONE_STEP, "one-1")
    # When it is cancelled and the call then finishes
    await workers.runner().cancel(ONE_STEP, "one-1", reason="not needed", operator="gus")
    release.set()
    # Then the run ends cancelled, not done: the call's result is in the log, not in the state
    result = await asyncio.wait_for(running, 10)
    assert result.status == RunStatus.CANCELLED and result.state.looked == ""
    assert [r.kind for r in await workers.calls("one-1")] == ["started", "done"]


async def test_a_node_calling_several_tools_starts_none_after_the_request(workers):
    # Given a node that holds seats, looks up (in flight) and would then charge the card
    release, running = await _inside_slow_lookup(workers, BATCH, "batch-1")
    # When the run is cancelled while the lookup is in flight
    await workers.runner().cancel(BATCH, "batch-1", reason="stop", operator="bob")
    release.set()
    # Then the lookup finishes and is logged, and the card is never charged
    assert (await asyncio.wait_for(running, 10)).status == RunStatus.CANCELLED
    assert "charge_card" not in workers.ran("batch-1")
    assert workers.ran("batch-1")["slow_lookup"] == 1
    finished = [body(r)["call_id"] for r in await workers.calls("batch-1") if r.kind == "done"]
    assert any("/batch/" in call for call in finished)


async def test_a_second_request_keeps_the_first_reason(workers):
    release, running = await _inside_slow_lookup(workers, LOOKUP, "lookup-1")
    await workers.runner().cancel(LOOKUP, "lookup-1", reason="first", operator="alice")
    await workers.runner().cancel(LOOKUP, "lookup-1", reason="second", operator="bob")
    release.set()
    result = await asyncio.wait_for(running, 10)
    assert result.error == "cancelled by alice: first"


@pytest.mark.parametrize(
    "forged",
    [
        "not a request",
        # signed, but with a key the workers do not hold
        _signed(KEY_B, "lookup-1", CancelRequest("lookup-1", "forged", "mallory", time.time())),
        # signed with the right key, but for another run
        _signed(KEY, "other", CancelRequest("other", "moved", "mallory", time.time())),
        # signed for this run, but meant to lapse two days ago (an old request written back)
        _signed(KEY, "lookup-1", CancelRequest("lookup-1", "old", "mallory", 0.0), now=time.time() - 2 * 86400),
    ],
    ids=["unsigned", "other-key", "other-run", "lapsed"],
)
async def test_a_request_that_does_not_check_is_ignored_and_removed(workers, forged):
    # Given a run in flight, and a cancel marker someone wrote into the store's markers
    release, running = await _inside_slow_lookup(workers, LOOKUP, "lookup-1")
    await _leave(workers, "lookup-1", forged)
    release.set()
    # Then the run finishes, the marker is reported and removed
    assert (await asyncio.wait_for(running, 10)).status == RunStatus.DONE
    assert workers.ran("lookup-1") == {"slow_lookup": 1, "charge_card": 1, "email_tickets": 1}
    (refused,) = workers.named("control.refused")
    assert refused.run_id == "lookup-1" and refused.data["kind"] == "cancel"
    assert await _request(workers, "lookup-1") is None


async def test_a_forged_marker_does_not_keep_a_real_request_out(workers):
    release, running = await _inside_slow_lookup(workers, LOOKUP, "lookup-1")
    await _leave(workers, "lookup-1", "forged")
    await workers.runner().cancel(LOOKUP, "lookup-1", reason="real", operator="carol")
    release.set()
    assert (await asyncio.wait_for(running, 10)).error == "cancelled by carol: real"


async def test_a_request_that_finds_the_run_let_go_cancels_it_at_once(workers):
    # Given a paused run (nobody holds it) and a request left for a holder that is gone
    await workers.runner().run(REFUNDS, Refund(amount=500), run_id="refund-1")
    request = CancelRequest("refund-1", "left over", "dave", time.time())
    await _leave(workers, "refund-1", _signed(KEY, "refund-1", request))
    # When someone resumes it, Then the request stops it before the pending call runs
    result = await workers.runner().resume(REFUNDS, "refund-1", approve=True)
    assert result.status == RunStatus.CANCELLED and result.error == "cancelled by dave: left over"
    assert workers.ran("refund-1") == {}


async def test_a_tool_loop_a_worker_holds_stops_before_its_next_model_call(store_setup):
    # Given a tool loop inside slow_lookup, its model ready to ask for more
    tickets = make_tickets()
    release, entered = tickets.gate("slow_lookup")
    look = Message.assistant("", tool_calls=[ToolCall(id="c1", name="slow_lookup", arguments={"show": "x"})])
    more = Message.assistant("", tool_calls=[ToolCall(id="c2", name="email_tickets", arguments={"show": "x"})])
    model = ScriptedModel([look, more, Message.assistant("done")])
    common = {"checkpoints": store_setup.raw, "checkpoint_key": KEY}
    running = asyncio.create_task(
        run_tool_loop(model, tickets.registry, [Message.user("go")], run_id="loop-1", **common)
    )
    await asyncio.wait_for(entered.wait(), 10)
    # When it is cancelled
    asked = await LoopRunner(None, tickets.registry, **common).cancel("loop-1", reason="enough", operator="erin")
    assert asked.status == RunStatus.RUNNING
    release.set()
    # Then the lookup finishes, and the model is not asked again
    result = await asyncio.wait_for(running, 10)
    assert result.status == RunStatus.CANCELLED and result.error == "cancelled by erin: enough"
    assert tickets.ledger.counts() == {"slow_lookup": 1}
    assert result.model_calls == 1


async def test_a_request_left_from_an_earlier_run_of_the_same_id_is_removed_not_obeyed(workers):
    # Given a signed request made an hour ago for "order-9" (a run of that id since pruned)
    old = CancelRequest("order-9", "for the run before", "ivy", time.time() - 3600)
    await _leave(workers, "order-9", _signed(KEY, "order-9", old))
    # When a new run takes that id, Then it runs to its end, and the old request is gone
    result = await workers.runner().run(LOOKUP, ORDER, run_id="order-9")
    assert result.status == RunStatus.DONE
    assert await _request(workers, "order-9") is None
