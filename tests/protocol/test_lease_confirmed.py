"""A tool runs only while its worker surely holds the run (`Tenure.confirm`, called by the call log).

Between a call's ``started`` and its tool a worker may stall past its lease (a frozen process,
an approval port that takes long, a retry's backoff) and be taken over. Right before each
attempt of a tool, its worker confirms the lease: by its own clock while it is sure, else by
one renewal, else, if the lease lapsed and nobody took it, by taking it back and finding the
run unclaimed. A worker that cannot confirm runs nothing (`LeaseLost`), and the call stays in
doubt for whoever holds the run now. A tool that works long before its effect confirms the
lease itself right before it (`CallInfo.confirm_held`). The real-process forms (a worker frozen
with SIGSTOP before its tool, and inside one) are in tests/protocol/test_ownership.py; the
simulation checks the rule under every schedule.
"""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
from _kit.poll import until
from pydantic import BaseModel

from agentflow import Call, Executor, Flow, FlowRunner, Registry
from agentflow._events import Event
from agentflow.errors import LeaseLost, RecoveryNeedsDecision
from agentflow.exec import current_call
from agentflow.exec.checkpoints import CheckpointStore, MemoryCheckpointStore
from agentflow.exec.run.lease import SURE, Ownership, holding, take

RUN = "confirm-1"
ME = Ownership("me@host:1", lease_s=30.0)
RIVAL = Ownership("rival@host:2", lease_s=30.0)


class CountedRenewals(MemoryCheckpointStore):
    """A memory store that counts renewals."""

    def __init__(self) -> None:
        super().__init__()
        self.renewals = 0

    async def renew_lease(self, run_id: str, token: str, ttl_s: float) -> Any:
        self.renewals += 1
        return await super().renew_lease(run_id, token, ttl_s)


async def unclaimed() -> bool:
    return True


async def claimed() -> bool:
    return False


async def test_a_lease_sure_by_the_holders_clock_is_confirmed_without_a_round_trip():
    store = CountedRenewals()
    async with holding(store, RUN, ME) as tenure:
        # Given a lease just taken: sure for nine tenths of its term, counted from before the take was sent
        assert time.monotonic() < tenure.sure_until <= time.monotonic() + ME.lease_s * SURE
        # When a tool confirms it
        # Then it is confirmed, and nothing went to the store
        assert await tenure.confirm(unclaimed)
        assert store.renewals == 0


async def test_a_lease_past_its_sure_part_is_confirmed_by_one_renewal_while_it_is_still_held():
    store = CountedRenewals()
    async with holding(store, RUN, ME) as tenure:
        # Given a holder whose clock says its lease is no longer sure (it stalled, say)
        tenure.sure_until = -math.inf
        # When a tool confirms it
        # Then one renewal confirms it, and the lease is sure again from that renewal on
        assert await tenure.confirm(claimed)  # a renewal needs no look at the run: nobody could claim it
        assert store.renewals == 1
        assert tenure.sure_until > time.monotonic()


async def test_a_lease_taken_over_is_not_confirmed_and_is_reported_lost():
    store = MemoryCheckpointStore()
    lost: list[Event] = []
    events = Executor(Registry()).events
    events.subscribe(lost.append, names={"lease.lost"})
    async with holding(store, RUN, Ownership(ME.owner, ME.lease_s, events=events)) as tenure:
        # Given a holder that stalled past its lease, and a rival that took the run meanwhile
        tenure.sure_until = -math.inf
        assert await store.release_lease(RUN, tenure.lease.token)
        rival = await take(store, RUN, RIVAL)
        # When a tool of the stalled holder confirms its lease
        # Then it is not confirmed, and the loss is reported once
        assert not await tenure.confirm(unclaimed)
        assert not await tenure.confirm(unclaimed)
        assert [e.data["owner"] for e in lost] == [ME.owner]
    # and leaving the block left the rival's lease alone
    assert (await store.leases([RUN]))[RUN].token == rival.token


async def test_a_lease_that_lapsed_while_nobody_wanted_the_run_is_taken_back_and_confirmed():
    store = MemoryCheckpointStore()
    async with holding(store, RUN, ME) as tenure:
        # Given a holder that stalled past its lease, which lapsed with nobody taking the run
        tenure.sure_until = -math.inf
        assert await store.release_lease(RUN, tenure.lease.token)
        # When a tool confirms it, and the run's head shows no claim
        # Then it is confirmed: the lease is the holder's again, with the same token, and sure
        assert await tenure.confirm(unclaimed)
        assert (await store.leases([RUN]))[RUN].token == tenure.lease.token
        assert tenure.sure_until > time.monotonic()


async def test_a_lease_taken_back_is_not_confirmed_when_the_run_was_claimed_meanwhile():
    store = MemoryCheckpointStore()
    async with holding(store, RUN, ME) as tenure:
        # Given a holder whose lease lapsed, and a rival that took the run, claimed it, and let it go
        tenure.sure_until = -math.inf
        assert await store.release_lease(RUN, tenure.lease.token)
        # When a tool confirms it, and the run's head shows that claim
        # Then it is not confirmed
        assert not await tenure.confirm(claimed)


async def test_a_lease_a_save_gave_up_is_not_confirmed():
    async with holding(MemoryCheckpointStore(), RUN, ME) as tenure:
        tenure.given_up = True
        assert not await tenure.confirm(unclaimed)


# -- through the call log ----------------------------------------------------------------------


class Wire(BaseModel):
    amount: int
    wired: str = ""


WIRES = (
    Flow("wires", state=Wire).node("wire", Call("wire", args=lambda s: {"amount": s.amount}, into="wired")).end("wire")
)


class Rival:
    """Takes a worker's run from it (its lease, as a worker that found it lapsed would), and waits until it noticed."""

    def __init__(self, store: CheckpointStore) -> None:
        self.store = store
        self.seen: list[Event] = []

    def watch(self, runner: FlowRunner) -> None:
        runner.events.subscribe(self.seen.append, names={"lease.lost", "tool.withheld"})

    async def take_over(self) -> None:
        held = (await self.store.leases([RUN]))[RUN]
        assert await self.store.release_lease(RUN, held.token)
        await take(self.store, RUN, RIVAL)

        async def noticed() -> bool:
            return any(e.name == "lease.lost" for e in self.seen)

        await until(noticed, "the worker's renewer to find its lease lost")

    async def let_go(self) -> None:
        held = (await self.store.leases([RUN]))[RUN]
        assert held.owner == RIVAL.owner and await self.store.release_lease(RUN, held.token)


def wire_tools(ran: list[int], rival: Rival, *, retries: int = 0) -> Registry:
    """`wire`: with `retries`, its first attempt loses the run to `rival`, then fails; without, it needs approval."""
    registry = Registry()

    @registry.tool(approval=not retries, retries=retries, backoff_s=0.0)
    async def wire(amount: int) -> str:
        ran.append(amount)
        if retries and len(ran) == 1:
            await rival.take_over()
            raise ConnectionError("the bank timed out")
        return f"wired {amount}"

    return registry


async def test_a_tool_whose_worker_lost_the_run_while_the_approval_port_decided_does_not_run():
    ran: list[int] = []
    store = MemoryCheckpointStore()
    rival = Rival(store)

    async def port(request: Any) -> bool:  # the port decides while another worker takes the run
        await rival.take_over()
        return True

    # Given a runner whose approval port is asked about a wire (after its started is stored), its lease 0.3 s
    tools = wire_tools(ran, rival)
    runner = FlowRunner(Executor(tools, approver=port), checkpoints=store, lease_s=0.3)
    rival.watch(runner)
    # When another worker takes the run before the port answers
    with pytest.raises(LeaseLost, match="the tool did not run") as lost:
        await runner.run(WIRES, Wire(amount=40), run_id=RUN)

    # Then the tool did not run, and the refusal says which call and that it is in doubt
    assert ran == []
    assert "'wire'" in str(lost.value) and "stays in doubt" in str(lost.value)
    assert [e.name for e in rival.seen] == ["lease.lost", "tool.withheld"]
    assert rival.seen[1].data["tool"] == "wire"
    # And the call stays in doubt: whoever holds the run next asks for a decision, and a rerun wires once
    await rival.let_go()
    later = FlowRunner(Executor(tools, approver=lambda request: True), checkpoints=store)
    with pytest.raises(RecoveryNeedsDecision, match="wire"):
        await later.recover(WIRES, RUN)
    await later.decide_in_doubt(WIRES, RUN, operator="ops")  # every call in doubt reruns
    assert (await later.recover(WIRES, RUN)).status == "done"
    assert ran == [40]


async def test_a_tool_whose_worker_stalled_while_nobody_wanted_the_run_runs():
    ran: list[int] = []
    store = MemoryCheckpointStore()
    lost: list[Event] = []

    async def port(request: Any) -> bool:  # the port outlasts the lease, and nobody wants the run meanwhile
        held = (await store.leases([RUN]))[RUN]
        assert await store.release_lease(RUN, held.token)  # as if it lapsed

        async def noticed() -> bool:
            return bool(lost)

        await until(noticed, "the worker's renewer to find its lease gone")
        return True

    # Given a runner whose approval port is asked about a wire, its lease 0.3 s
    runner = FlowRunner(Executor(wire_tools(ran, Rival(store)), approver=port), checkpoints=store, lease_s=0.3)
    runner.events.subscribe(lost.append, names={"lease.lost"})
    # When its lease lapses while the port decides, with nobody taking the run
    result = await runner.run(WIRES, Wire(amount=40), run_id=RUN)
    # Then the worker took its lease back, found the run unclaimed, and the wire went out once
    assert result.status == "done" and ran == [40]
    assert len(lost) == 1


async def test_a_retry_after_the_run_was_taken_over_is_not_attempted():
    ran: list[int] = []
    store = MemoryCheckpointStore()
    rival = Rival(store)
    # Given a wire that may be tried three times, whose first attempt fails after another worker took the run
    runner = FlowRunner(Executor(wire_tools(ran, rival, retries=2)), checkpoints=store, lease_s=0.3)
    rival.watch(runner)
    # When the run goes
    with pytest.raises(LeaseLost):
        await runner.run(WIRES, Wire(amount=40), run_id=RUN)
    # Then no later attempt ran, and nothing says the call failed: it is in doubt
    assert ran == [40]
    assert [c.kind for c in await store.calls(RUN)] == ["started"]


# -- from inside the tool (`CallInfo.confirm_held`) ------------------------------------------------


async def quick_work() -> None:
    """The work before the effect of a tool whose worker keeps its hold throughout."""


def confirming_wire(ran: list[int], before_effect: Any) -> Registry:
    """`wire`: does `before_effect` (its long work), confirms its worker's lease itself, then wires."""
    registry = Registry()

    @registry.tool
    async def wire(amount: int) -> str:
        await before_effect()
        await current_call().confirm_held()
        ran.append(amount)
        return f"wired {amount}"

    return registry


async def test_a_tool_that_confirms_its_lease_after_a_takeover_stops_before_its_effect():
    ran: list[int] = []
    store = MemoryCheckpointStore()
    rival = Rival(store)
    # Given a wire whose long work before its effect outlasts its worker's hold: another worker takes the run
    runner = FlowRunner(Executor(confirming_wire(ran, rival.take_over)), checkpoints=store, lease_s=0.3)
    rival.watch(runner)
    # When the tool confirms the lease right before its effect
    with pytest.raises(LeaseLost, match="stopped before its effect"):
        await runner.run(WIRES, Wire(amount=40), run_id=RUN)
    # Then it had no effect, and the call is in doubt: started, and nothing says it failed
    assert ran == []
    assert [e.name for e in rival.seen] == ["lease.lost", "tool.withheld"]
    assert [c.kind for c in await store.calls(RUN)] == ["started"]
    # And whoever holds the run next asks for a decision about it; a rerun wires once
    await rival.let_go()
    later = FlowRunner(Executor(confirming_wire(ran, quick_work)), checkpoints=store)
    with pytest.raises(RecoveryNeedsDecision, match="wire"):
        await later.recover(WIRES, RUN)
    await later.decide_in_doubt(WIRES, RUN, operator="ops")
    assert (await later.recover(WIRES, RUN)).status == "done"
    assert ran == [40]


async def test_a_tool_that_confirms_a_lease_its_worker_surely_holds_goes_on_with_no_round_trip():
    ran: list[int] = []
    store = CountedRenewals()
    runner = FlowRunner(Executor(confirming_wire(ran, quick_work)), checkpoints=store)
    result = await runner.run(WIRES, Wire(amount=40), run_id=RUN)
    assert result.status == "done" and ran == [40]
    assert store.renewals == 0


async def test_a_tool_run_outside_a_held_run_confirms_at_once():
    # A tool called by a bare executor (no store, no lease) has nothing to confirm
    ran: list[int] = []
    assert await Executor(confirming_wire(ran, quick_work)).run("wire", {"amount": 40}) == "wired 40"
    assert ran == [40]
