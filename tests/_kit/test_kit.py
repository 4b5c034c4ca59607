"""The kit itself: raw rows really change what each store returns, faults fire where armed, the ledger counts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from _kit.faults import FaultyStore
from _kit.stores import StoreSetup, setups
from _kit.tickets import KEY, ORDER, TICKETS, Crash, Ledger, make_tickets
from agentflow import Executor, FlowRunner
from agentflow.errors import CheckpointError
from agentflow.exec.checkpoints import MemoryCheckpointStore

#: The kit's raw rows are checked on all six set-ups (`store_setup` alone runs four).
EVERY_SETUP = pytest.mark.parametrize("store_setup", setups(), indirect=True)


async def finished_run(store_setup: StoreSetup, run_id: str = "order-1") -> None:
    tickets = make_tickets()
    runner = FlowRunner(Executor(tickets.registry), checkpoints=store_setup.open(), checkpoint_key=KEY)
    await runner.run(TICKETS, ORDER, run_id=run_id)


@EVERY_SETUP
async def test_put_and_drop_of_a_call_record_change_what_the_store_returns(store_setup: StoreSetup) -> None:
    # Given a finished run
    await finished_run(store_setup)
    first, second, *_ = await store_setup.calls("order-1")

    # When a record is overwritten in place, and another one deleted
    await store_setup.rows.put_call(first, dataclasses.replace(first, payload=b"changed"))
    await store_setup.rows.drop_call(second)

    # Then the store returns the changed record and no longer the deleted one
    after = await store_setup.calls("order-1")
    assert after[0].payload == b"changed"
    assert [(r.segment, r.seq) for r in after][:2] == [(0, 0), (0, 2)]


@EVERY_SETUP
async def test_put_and_drop_of_a_checkpoint_change_what_the_store_returns(store_setup: StoreSetup) -> None:
    # Given a finished run (checkpoints 0..3)
    await finished_run(store_setup)
    history = await store_setup.history("order-1")

    # When checkpoint 1 is overwritten in place and the latest one deleted
    await store_setup.rows.put_checkpoint(history[1], dataclasses.replace(history[1], payload=b"changed"))
    await store_setup.rows.drop_checkpoint(history[-1])

    # Then the store returns the changed row, and its latest is now step 2
    after = await store_setup.history("order-1")
    assert [c.step for c in after] == [0, 1, 2]
    assert after[1].payload == b"changed"
    assert (await store_setup.raw.latest("order-1")).step == 2


@EVERY_SETUP
async def test_stored_bytes_holds_what_was_stored(store_setup: StoreSetup) -> None:
    # Given a finished run
    await finished_run(store_setup)

    # When every stored byte is read
    # Then the order's show is among them
    assert b"Hamlet" in await store_setup.rows.stored_bytes()


@EVERY_SETUP
async def test_drop_listing_hides_the_run_from_listings_only(store_setup: StoreSetup) -> None:
    # Given two finished runs, on a store that keeps a listing index
    if not store_setup.rows.has_listing:
        return
    await finished_run(store_setup, "order-1")
    await finished_run(store_setup, "order-2")

    # When one run's listing entry is removed
    await store_setup.rows.drop_listing("order-1")

    # Then the listing no longer names it
    assert [c.run_id for c in await store_setup.raw.list_runs()] == ["order-2"]


def test_ledger_in_a_file_counts_effects_per_tool_and_finds_repeats(tmp_path: Path) -> None:
    # Given a file ledger with one effect recorded twice
    ledger = Ledger(tmp_path / "ledger.jsonl")
    for tool, run_id in [("hold_seats", "r1"), ("charge_card", "r1"), ("charge_card", "r1"), ("charge_card", "r2")]:
        ledger.record(tool, run_id, "k")

    # Then a second reader of the file sees the counts, and the repeat of a non-idempotent effect
    again = Ledger(tmp_path / "ledger.jsonl")
    assert again.counts() == {"hold_seats": 1, "charge_card": 3}
    assert again.counts("r2") == {"charge_card": 1}
    assert again.repeated() == {("charge_card", "r1"): 2}


async def test_a_tool_in_crash_in_dies_after_its_effect() -> None:
    # Given the ticket tools, charge_card set to die
    tickets = make_tickets()
    tickets.crash_in.add("charge_card")
    runner = FlowRunner(Executor(tickets.registry))

    # When the flow runs, charge_card dies
    with pytest.raises(Crash):
        await runner.run(TICKETS, ORDER, run_id="order-1")

    # Then its effect was recorded before it died, and nothing after it ran
    assert tickets.counts() == {"hold_seats": 1, "charge_card": 1}


async def test_a_fault_fires_at_the_nth_write_of_its_kind_and_tool_only() -> None:
    # Given a run of the ticket flow on a store armed to die after the 2nd `started` record of any tool
    tickets = make_tickets()
    store = FaultyStore(MemoryCheckpointStore()).crash("started", nth=2, when="after")
    runner = FlowRunner(Executor(tickets.registry), checkpoints=store)

    # When it runs, it dies
    with pytest.raises(Crash):
        await runner.run(TICKETS, ORDER, run_id="order-1")

    # Then it died right after charge_card's `started` was stored: before the tool ran
    assert store.writes[-1] == "record:started:pay"
    assert tickets.counts() == {"hold_seats": 1}


async def test_a_failure_before_a_combined_write_stores_none_of_it() -> None:
    # Given a store that fails before pay's `done` (written with its checkpoint in one atomic write)
    tickets = make_tickets()
    store = FaultyStore(MemoryCheckpointStore()).fail("done", CheckpointError("the store is down"), tool="charge_card")
    runner = FlowRunner(Executor(tickets.registry), checkpoints=store)

    # When the flow runs, it fails at that write
    with pytest.raises(CheckpointError, match="the store is down"):
        await runner.run(TICKETS, ORDER, run_id="order-1")

    # Then neither the `done` nor the checkpoint it went with was stored
    assert [c.step for c in await store.history("order-1")] == [0, 1]
    assert [r.kind for r in await store.calls("order-1")] == ["started", "done", "started"]
