"""The kit itself: raw row access really changes what each store returns, and the ledger counts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from _kit.stores import StoreSetup
from _kit.tickets import KEY, ORDER, TICKETS, Crash, Ledger, make_tickets
from agentflow import Executor, FlowRunner


async def finished_run(store_setup: StoreSetup, run_id: str = "order-1") -> None:
    tickets = make_tickets()
    runner = FlowRunner(Executor(tickets.registry), checkpoints=store_setup.open(), checkpoint_key=KEY)
    await runner.run(TICKETS, ORDER, run_id=run_id)


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


async def test_stored_bytes_holds_what_was_stored(store_setup: StoreSetup) -> None:
    # Given a finished run
    await finished_run(store_setup)

    # When every stored byte is read
    # Then the order's show is among them
    assert b"Hamlet" in await store_setup.rows.stored_bytes()


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

    # When the flow runs
    try:
        await runner.run(TICKETS, ORDER, run_id="order-1")
    except Crash:
        pass
    else:
        raise AssertionError("charge_card should have died")

    # Then its effect was recorded before it died, and nothing after it ran
    assert tickets.counts() == {"hold_seats": 1, "charge_card": 1}
