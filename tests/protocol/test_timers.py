"""Durable timers: a `Wait` node, and approvals with a deadline; a due run is woken once, by any sweeper.

Every rule runs on every store set-up (the ``workers`` fixture). Time is passed in (``now=``)
where a test needs a timer to be due: nothing here sleeps.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import pytest
from _kit.faults import body
from _kit.tickets import ORDER, Order, Refund, amount_args, order_args, show_args, was_denied, went_out

from agentflow import Call, Flow, RunStatus, Wait
from agentflow._errors import CheckpointConflict
from agentflow.errors import FlowError
from agentflow.exec.run.timers import NotDue

HOUR = 3600.0

#: hold -> (wait an hour) -> pay -> send.
COOLED = (
    Flow("cooled", state=Order)
    .node("hold", Call("hold_seats", args=order_args, into="held"))
    .node("cool", Wait(seconds=HOUR))
    .node("pay", Call("charge_card", args=order_args, into="paid"))
    .node("send", Call("email_tickets", args=show_args, into="sent"))
    .edge("hold", "cool")
    .edge("cool", "pay")
    .edge("pay", "send")
    .end("send")
)


def refunds_with_deadline(on_timeout: str) -> Flow[Refund]:
    """refund (approval over 100, a one-hour deadline) -> notify | apologize (and escalate, the detour's)."""
    flow = (
        Flow("deadlines", state=Refund)
        .node(
            "refund",
            Call("refund", args=amount_args, into="outcome", on_deny="denied", timeout_s=HOUR, on_timeout=on_timeout),
        )  # fmt: skip
        .node("notify", Call("notify", args=amount_args, into="after"))
        .node("apologize", Call("apologize", args=amount_args, into="after"))
        .edge("refund", "notify", when=went_out)
        .edge("refund", "apologize", when=was_denied)
        .end("notify", "apologize")
    )
    if on_timeout == "escalate":
        flow.node("escalate", Call("apologize", args=lambda r: {"amount": r.amount + 1}, into="after")).end("escalate")
    return flow


async def test_a_wait_pauses_the_run_with_its_wake_time_signed_and_holds_nothing(workers):
    before = time.time()
    result = await workers.runner().run(COOLED, ORDER, run_id="order-1")
    # Then the run is paused with no pending call, and its checkpoint carries the wake time
    assert result.status == RunStatus.PAUSED and result.pending == []
    latest = (await workers.history("order-1"))[-1]
    wake = body(latest)["wake"]
    assert wake["for"] == "timer" and before + HOUR <= wake["at"] <= time.time() + HOUR
    assert body(latest)["frontier"] == ["pay"]
    assert (await workers.raw.leases(["order-1"])) == {}
    assert workers.ran("order-1") == {"hold_seats": 1}


async def test_a_wait_is_not_woken_early_and_is_woken_once_when_due(workers):
    await workers.runner().run(COOLED, ORDER, run_id="order-1")
    at = body((await workers.history("order-1"))[-1])["wake"]["at"]
    before = await workers.history("order-1")
    # When someone asks to wake it before its time
    with pytest.raises(NotDue):
        await workers.runner().wake(COOLED, "order-1")
    assert await workers.runner().wake_due(COOLED) == {}
    assert await workers.history("order-1") == before
    # When the time comes, two sweepers look at once
    first, second = await asyncio.gather(
        workers.runner().wake_due(COOLED, now=at + 1), workers.runner().wake_due(COOLED, now=at + 1)
    )
    # Then exactly one woke it, and it finished: the card was charged once
    woken = [r for r in (first.get("order-1"), second.get("order-1")) if r is not None]
    assert len(woken) == 1 and woken[0].status == RunStatus.DONE
    assert workers.ran("order-1") == {"hold_seats": 1, "charge_card": 1, "email_tickets": 1}
    claims = [body(r) for r in await workers.history("order-1") if body(r).get("claim") == "wake"]
    assert len(claims) == 1 and claims[0]["woke"]["for"] == "timer" and claims[0]["woke"]["at"] == at
    assert len(workers.named("run.woken")) == 1


async def test_wait_until_a_time_from_the_state_and_a_time_past_does_not_wait(workers):
    soon = datetime.now(UTC) + timedelta(hours=2)
    until = (
        Flow("until", state=Order)
        .node("w", Wait(until=lambda o: soon))
        .node("send", Call("email_tickets", args=show_args, into="sent"))
        .edge("w", "send")
        .end("send")
    )
    paused = await workers.runner().run(until, ORDER, run_id="u-1")
    assert paused.status == RunStatus.PAUSED
    assert body((await workers.history("u-1"))[-1])["wake"]["at"] == soon.timestamp()
    past = (
        Flow("past", state=Order)
        .node("w", Wait(seconds=0))
        .node("send", Call("email_tickets", args=show_args, into="sent"))
        .edge("w", "send")
        .end("send")
    )
    assert (await workers.runner().run(past, ORDER, run_id="p-1")).status == RunStatus.DONE


def test_a_wait_needs_one_time_and_a_time_it_can_read():
    with pytest.raises(FlowError, match="seconds= or until="):
        Wait()
    with pytest.raises(FlowError, match="0 or more"):
        Wait(seconds=-1)
    with pytest.raises(FlowError, match="without a time zone"):
        Wait(until=lambda s: datetime(2030, 1, 1)).wake_at(ORDER, 0.0)
    with pytest.raises(FlowError, match="positive number"):
        Call("refund", timeout_s=0)
    with pytest.raises(FlowError, match="on_timeout='nowhere'"):
        refunds_with_deadline("nowhere").validate()


@pytest.mark.parametrize(
    ("on_timeout", "ran", "after"),
    [
        ("deny", {"apologize": 1}, "apologized 500"),
        ("approve", {"refund": 1, "notify": 1}, "notified 500"),
        ("escalate", {"apologize": 1}, "apologized 501"),
    ],
)
async def test_an_approval_deadline_decides_by_on_timeout_once(workers, on_timeout, ran, after):
    flow = refunds_with_deadline(on_timeout)
    paused = await workers.runner().run(flow, Refund(amount=500), run_id="refund-1")
    at = body((await workers.history("refund-1"))[-1])["wake"]
    assert paused.status == RunStatus.PAUSED and at["for"] == "approval"
    # When the deadline passes, and a late second sweep comes too
    woken = await workers.runner().wake_due(flow, now=at["at"] + 1)
    assert await workers.runner().wake_due(flow, now=at["at"] + 2) == {}
    # Then on_timeout decided, once
    assert woken["refund-1"].status == RunStatus.DONE and woken["refund-1"].state.after == after
    assert workers.ran("refund-1") == ran
    claim = next(body(r) for r in await workers.history("refund-1") if body(r).get("claim") == "wake")
    assert list(claim["woke"]["decided"].values()) == ["approve" if on_timeout == "approve" else "deny"]


async def test_a_person_who_decides_before_the_deadline_leaves_the_timer_nothing_to_do(workers):
    flow = refunds_with_deadline("approve")
    await workers.runner().run(flow, Refund(amount=500), run_id="refund-1")
    at = body((await workers.history("refund-1"))[-1])["wake"]["at"]
    denied = await workers.runner().resume(flow, "refund-1", approve=False)
    assert denied.status == RunStatus.DONE
    assert await workers.runner().wake_due(flow, now=at + 1) == {}
    with pytest.raises(CheckpointConflict, match="not waiting on a timer"):
        await workers.runner().wake(flow, "refund-1", now=at + 1)
    assert workers.ran("refund-1") == {"apologize": 1}


async def test_an_approval_without_a_deadline_waits_for_a_person(workers):
    plain = Flow("plain", state=Refund).node("refund", Call("refund", args=amount_args, into="outcome")).end("refund")
    await workers.runner().run(plain, Refund(amount=500), run_id="refund-1")
    assert "wake" not in body((await workers.history("refund-1"))[-1])
    assert await workers.runner().wake_due(plain, now=time.time() + 10 * HOUR) == {}
