"""A tool runs only while its worker surely holds the run (`Tenure.confirm`, called by the call log).

Between a call's ``started`` and its tool a worker may stall past its lease (a frozen process,
an approval port that takes long, a retry's backoff) and be taken over. Right before each
attempt of a tool, its worker confirms the lease: by its own clock while it is sure, else by
one renewal. A worker that cannot confirm runs nothing (`LeaseLost`), and the call stays in
doubt for whoever holds the run now. The real-process form (a worker frozen with SIGSTOP) is
in tests/protocol/test_ownership.py; the simulation checks the rule under every schedule.
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
from agentflow.exec.checkpoints import MemoryCheckpointStore
from agentflow.exec.run.lease import SURE, Ownership, holding, take

RUN = "confirm-1"
ME = Ownership("me@host:1", lease_s=0.3)
RIVAL = Ownership("rival@host:2", lease_s=30.0)


class CountedRenewals(MemoryCheckpointStore):
    """A memory store that counts renewals, and can answer them as if the lease was taken over."""

    def __init__(self) -> None:
        super().__init__()
        self.renewals = 0
        self.taken_over = False

    async def renew_lease(self, run_id: str, token: str, ttl_s: float) -> Any:
        self.renewals += 1
        if self.taken_over:
            return None
        return await super().renew_lease(run_id, token, ttl_s)


async def test_a_lease_sure_by_the_holders_clock_is_confirmed_without_a_round_trip():
    store = CountedRenewals()
    async with holding(store, RUN, Ownership("me@host:1", lease_s=30.0)) as tenure:
        # Given a lease just taken: sure for nine tenths of its term, counted from before the take was sent
        assert time.monotonic() < tenure.sure_until <= time.monotonic() + 30.0 * SURE
        # When a tool confirms it
        # Then it is confirmed, and nothing went to the store
        assert await tenure.confirm()
        assert store.renewals == 0


async def test_a_lease_past_its_sure_part_is_confirmed_by_one_renewal_while_it_is_still_held():
    store = CountedRenewals()
    async with holding(store, RUN, Ownership("me@host:1", lease_s=30.0)) as tenure:
        # Given a holder whose clock says its lease is no longer sure (it stalled, say)
        tenure.sure_until = -math.inf
        # When a tool confirms it
        # Then one renewal confirms it, and the lease is sure again from that renewal on
        assert await tenure.confirm()
        assert store.renewals == 1
        assert tenure.sure_until > time.monotonic()


async def test_a_lease_taken_over_is_not_confirmed_and_is_reported_lost():
    store = MemoryCheckpointStore()
    lost: list[Event] = []
    events = Executor(Registry()).events
    events.subscribe(lost.append, names={"lease.lost"})
    async with holding(store, RUN, Ownership("me@host:1", lease_s=30.0, events=events)) as tenure:
        # Given a holder that stalled past its lease, and a rival that took the run meanwhile
        tenure.sure_until = -math.inf
        assert await store.release_lease(RUN, tenure.lease.token)
        rival = await take(store, RUN, RIVAL)
        # When a tool of the stalled holder confirms its lease
        # Then it is not confirmed, and the loss is reported once
        assert not await tenure.confirm()
        assert not await tenure.confirm()
        assert [e.data["owner"] for e in lost] == ["me@host:1"]
    # and leaving the block left the rival's lease alone
    assert (await store.leases([RUN]))[RUN].token == rival.token


async def test_a_lease_a_save_gave_up_is_not_confirmed():
    async with holding(MemoryCheckpointStore(), RUN, ME) as tenure:
        tenure.given_up = True
        assert not await tenure.confirm()


# -- through the call log ----------------------------------------------------------------------


class Wire(BaseModel):
    amount: int
    wired: str = ""


WIRES = (
    Flow("wires", state=Wire).node("wire", Call("wire", args=lambda s: {"amount": s.amount}, into="wired")).end("wire")
)


class Loser:
    """Makes the store answer renewals as if the run was taken over, and waits until the renewer saw it."""

    def __init__(self) -> None:
        self.store = CountedRenewals()
        self.seen: list[Event] = []

    def watch(self, runner: FlowRunner) -> None:
        runner.events.subscribe(self.seen.append, names={"lease.lost", "tool.withheld"})

    async def lose(self) -> None:
        self.store.taken_over = True

        async def noticed() -> bool:
            return any(e.name == "lease.lost" for e in self.seen)

        await until(noticed, "the renewer to find the lease lost")


def wire_tools(ran: list[int], loser: Loser, *, retries: int = 0) -> Registry:
    """`wire`: with `retries`, its first attempt loses the lease and then fails; without, it needs approval."""
    registry = Registry()

    @registry.tool(approval=not retries, retries=retries, backoff_s=0.0)
    async def wire(amount: int) -> str:
        ran.append(amount)
        if retries and len(ran) == 1:
            await loser.lose()
            raise ConnectionError("the bank timed out")
        return f"wired {amount}"

    return registry


async def test_a_tool_whose_worker_lost_its_lease_while_the_approval_port_decided_does_not_run():
    ran: list[int] = []
    loser = Loser()

    async def port(request: Any) -> bool:  # the port decides while the lease is lost
        await loser.lose()
        return True

    # Given a runner whose approval port is asked about a wire (after its started is stored)
    tools = wire_tools(ran, loser)
    runner = FlowRunner(Executor(tools, approver=port), checkpoints=loser.store, lease_s=0.3)
    loser.watch(runner)
    # When the worker's lease is lost before the port answers
    with pytest.raises(LeaseLost, match="the tool did not run") as lost:
        await runner.run(WIRES, Wire(amount=40), run_id=RUN)

    # Then the tool did not run, and the refusal says which call and that it is in doubt
    assert ran == []
    assert "'wire'" in str(lost.value) and "stays in doubt" in str(lost.value)
    assert [e.name for e in loser.seen] == ["lease.lost", "tool.withheld"]
    assert loser.seen[1].data["tool"] == "wire"
    # And the call stays in doubt: whoever holds the run next asks for a decision, and a rerun wires once
    loser.store.taken_over = False
    later = FlowRunner(Executor(tools, approver=lambda request: True), checkpoints=loser.store)
    with pytest.raises(RecoveryNeedsDecision, match="wire"):
        await later.recover(WIRES, RUN)
    await later.decide_in_doubt(WIRES, RUN, operator="ops")  # every call in doubt reruns
    assert (await later.recover(WIRES, RUN)).status == "done"
    assert ran == [40]


async def test_a_retry_after_the_lease_was_lost_is_not_attempted():
    ran: list[int] = []
    loser = Loser()
    # Given a wire that may be tried three times, whose first attempt fails after the lease was lost
    runner = FlowRunner(Executor(wire_tools(ran, loser, retries=2)), checkpoints=loser.store, lease_s=0.3)
    loser.watch(runner)
    # When the run goes
    with pytest.raises(LeaseLost):
        await runner.run(WIRES, Wire(amount=40), run_id=RUN)
    # Then no later attempt ran, and nothing says the call failed: it is in doubt
    assert ran == [40]
    assert [c.kind for c in await loser.store.calls(RUN)] == ["started"]
