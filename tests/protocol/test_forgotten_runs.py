"""Runs the listing index forgot are found from their rows: verify reports them, a sweep recovers them.

The listing index (the ``runs`` table, Redis' latest hash and sorted sets) is unsigned;
deleting a run's entry hides it from listings and from `recover_all`. On every store set-up:
`verify --all` (the core's `read_all`) reports such a run, `recover_all(sweep=True)` lists
it again and recovers it, and a forgotten run whose newest row fails its check is reported,
never listed again nor run.
"""

from __future__ import annotations

import dataclasses

import pytest
from _kit.faults import FaultyStore
from _kit.stores import StoreSetup
from _kit.tickets import KEY, ORDER, TICKETS, Crash, Tickets, make_tickets

from agentflow import Executor, FlowRunner
from agentflow._events import Event
from agentflow.exec.checkpoints import CheckpointStoreCorrupt
from agentflow.exec.run.read import read_all
from agentflow.exec.seal import Sealer


async def stranded(setup: StoreSetup, run_id: str = "order-1") -> Tickets:
    """A run stranded in `pay` (charge_card never started), then dropped from the listing index."""
    tickets = make_tickets()
    store = FaultyStore(setup.open())
    store.crash("started", tool="charge_card")
    runner = FlowRunner(Executor(tickets.registry), checkpoints=store, checkpoint_key=KEY)
    with pytest.raises(Crash):
        await runner.run(TICKETS, ORDER, run_id=run_id)
    await setup.rows.drop_listing(run_id)
    return tickets


async def test_verify_all_reports_a_run_missing_from_the_listing_index(store_setup):
    # Given a healthy finished run and a stranded one whose listing entry was deleted
    tickets = make_tickets()
    runner = FlowRunner(Executor(tickets.registry), checkpoints=store_setup.open(), checkpoint_key=KEY)
    await runner.run(TICKETS, ORDER, run_id="order-ok")
    await stranded(store_setup)
    assert "order-1" not in await store_setup.raw.list_unfinished("tickets")
    # When every run is verified
    reports = {rep.run_id: rep for rep in await read_all(store_setup.raw, Sealer(KEY))}
    # Then the forgotten run is reported, and the healthy one is not
    assert set(reports) == {"order-ok", "order-1"}
    assert not reports["order-ok"].corrupt
    assert "missing from the store's listing index" in reports["order-1"].problems[0]
    assert reports["order-1"].calls == [] and reports["order-1"].state is None  # no data of a run with a problem


async def test_recover_all_with_sweep_lists_a_forgotten_run_again_and_recovers_it(store_setup):
    # Given a stranded run whose listing entry was deleted
    await stranded(store_setup)
    tickets = make_tickets()
    seen: list[Event] = []
    runner = FlowRunner(Executor(tickets.registry), checkpoints=store_setup.open(), checkpoint_key=KEY)
    runner.events.subscribe(seen.append)
    # When recover_all runs without the sweep, it does not see the run
    assert await runner.recover_all(TICKETS) == {}
    # When it runs with the sweep
    outcomes = await runner.recover_all(TICKETS, sweep=True)
    # Then the run was found from its rows, listed again and recovered to the end
    assert list(outcomes) == ["order-1"]
    assert not isinstance(outcomes["order-1"], BaseException), outcomes["order-1"]
    assert outcomes["order-1"].status == "done"
    assert [e.data["relisted"] for e in seen if e.name == "run.unlisted"] == [True]
    assert tickets.counts() == {"charge_card": 1, "email_tickets": 1}
    assert [r.run_id for r in await store_setup.raw.list_runs("tickets")] == ["order-1"]


async def test_a_forgotten_run_whose_newest_row_fails_its_check_is_reported_not_run(store_setup):
    # Given a forgotten stranded run whose newest checkpoint was then changed behind the store's back
    await stranded(store_setup)
    newest = (await store_setup.history("order-1"))[-1]
    forged = dataclasses.replace(newest, payload=newest.payload.replace(b'"Hamlet"', b'"Macbeth"'))
    assert forged.payload != newest.payload
    await store_setup.rows.put_checkpoint(newest, forged)
    tickets = make_tickets()
    runner = FlowRunner(Executor(tickets.registry), checkpoints=store_setup.open(), checkpoint_key=KEY)
    # When recover_all sweeps
    outcomes = await runner.recover_all(TICKETS, sweep=True)
    # Then the run is reported as corrupt and nothing ran; it stays out of the listings
    assert isinstance(outcomes["order-1"], CheckpointStoreCorrupt)
    assert "signature" in str(outcomes["order-1"])
    assert tickets.counts() == {}
    assert "order-1" not in await store_setup.raw.list_unfinished("tickets")
