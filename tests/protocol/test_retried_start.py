"""A start retried with the same run id attaches to the run its first try stored (`RunProtocol.begin`).

A start can fail after its step 0 is stored (`StoreNotDurable`: the replica did not
acknowledge it in time), or its answer can be lost. Retried with the same run id, flow,
input and identity, it carries on the run that is there (or returns it as it stands)
rather than refusing, so a client that retries never has to start a second run (a
second order) to be sure of one. Another input under the same id stays a conflict, and
the stored run is left as it was. Each test runs on every store set-up (`_kit.stores`);
the Redis primary whose replica does not answer is tests/checkpoints/test_redis_durability.py.
"""

from __future__ import annotations

import pytest
from _kit.stores import StoreSetup
from _kit.tickets import KEY, ORDER, TICKETS, make_tickets, tickets_flow

from agentflow import FlowRunner, RunContext, RunStatus
from agentflow.errors import CheckpointConflict
from agentflow.exec import Executor


async def test_a_start_retried_with_the_same_run_id_carries_on_the_run_its_first_try_stored(
    store_setup: StoreSetup,
) -> None:
    tickets = make_tickets()
    runner = FlowRunner(Executor(tickets.registry), checkpoints=store_setup.open(), checkpoint_key=KEY)
    # Given a start whose step 0 is stored but whose caller never heard back
    await runner.run(TICKETS, ORDER, run_id="order-1", max_supersteps=0)
    # When the caller retries the same start (a new runner: another process)
    again = FlowRunner(Executor(tickets.registry), checkpoints=store_setup.open(), checkpoint_key=KEY)
    result = await again.run(TICKETS, ORDER, run_id="order-1")
    # Then the run it stored goes to its end: one order, one charge
    assert result.status == RunStatus.DONE and result.state.paid
    assert tickets.counts() == {"hold_seats": 1, "charge_card": 1, "email_tickets": 1}
    # And a retry after the end returns the run as it ended, running nothing
    ended = await again.run(TICKETS, ORDER, run_id="order-1")
    assert ended.status == RunStatus.DONE and ended.state == result.state
    assert tickets.counts() == {"hold_seats": 1, "charge_card": 1, "email_tickets": 1}
    assert [c.step for c in await store_setup.history("order-1")][0] == 0


async def test_a_start_retried_with_max_supersteps_0_returns_the_run_as_it_stands(store_setup: StoreSetup) -> None:
    tickets = make_tickets()
    runner = FlowRunner(Executor(tickets.registry), checkpoints=store_setup.open(), checkpoint_key=KEY)
    ctx = RunContext(user="ana", thread="t1")
    await runner.start(TICKETS, ORDER, run_id="order-2", ctx=ctx)
    # When a client's start is sent again, as FlowClient.start does it
    attached = await runner.start(TICKETS, ORDER.model_dump(), run_id="order-2", ctx=ctx)
    # Then it is the same run, still at its step 0, nothing run
    assert attached.run_id == "order-2" and attached.status == RunStatus.RUNNING
    assert [c.step for c in await store_setup.history("order-2")] == [0]
    assert tickets.counts() == {}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("state", "started with another input, identity or lineage"),
        ("user", "started with another input, identity or lineage"),
        ("version", "started with another input, identity or lineage"),
        ("flow", "is a flow named 'tickets', not a flow named 'other'"),
    ],
)
async def test_a_start_with_another_input_under_a_taken_run_id_stays_a_conflict(
    store_setup: StoreSetup, change: str, message: str
) -> None:
    tickets = make_tickets()
    runner = FlowRunner(Executor(tickets.registry), checkpoints=store_setup.open(), checkpoint_key=KEY)
    await runner.start(TICKETS, ORDER, run_id="order-3", ctx=RunContext(user="ana"))
    before = await store_setup.history("order-3")
    flow, state, ctx = TICKETS, ORDER, RunContext(user="ana")
    if change == "state":
        state = ORDER.model_copy(update={"seats": 3})
    elif change == "user":
        ctx = RunContext(user="bob")
    elif change == "version":
        flow = tickets_flow(version="2")
    else:
        flow = tickets_flow(name="other")
    # When a start with something else under the same run id comes
    with pytest.raises(CheckpointConflict, match=message):
        await runner.run(flow, state, run_id="order-3", ctx=ctx)
    # Then the stored run is as it was and nothing ran
    assert await store_setup.history("order-3") == before
    assert tickets.counts() == {}
