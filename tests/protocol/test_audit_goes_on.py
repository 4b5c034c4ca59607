"""One bad row never hides another run: the audit reports each bad run and goes on to the next.

A row broken so badly that the store cannot even decode it (not a row at all, or a value of
the wrong type in a SQLite column) used to make the store raise out of the whole listing or
read: `verify --all` and `runs list` stopped at the decoy and never reported a run tampered
with in another way. Each read path now reports the undecodable run as a problem and reads
on: `read_all` (``verify --all``), `read_runs` (``runs list``) and `read_heads` (the viewer).
PostgreSQL's typed columns take no value of another type, so the finding does not apply there.
"""

from __future__ import annotations

import dataclasses

import pytest
from _kit.stores import StoreSetup, setups
from _kit.tickets import KEY, ORDER, TICKETS, make_tickets

from agentflow import Executor, FlowRunner
from agentflow.exec.run.read import read_all, read_heads, read_runs
from agentflow.exec.seal import Sealer

SHARED = setups("sqlite", "sql-sqlite", "fakeredis", "redis")


async def _three_runs(store_setup: StoreSetup) -> None:
    runner = FlowRunner(Executor(make_tickets().registry), checkpoints=store_setup.open(), checkpoint_key=KEY)
    for run_id in ("decoy", "tampered", "fine"):
        await runner.run(TICKETS, ORDER, run_id=run_id)


async def _tamper(store_setup: StoreSetup, step: int) -> None:
    """Break the decoy's row `step` so it cannot be decoded, and change the tampered run's newest payload."""
    store = store_setup.open()
    decoy = await store.history("decoy")
    await store_setup.rows.break_checkpoint(decoy[step])
    newest = await store.latest("tampered")
    await store_setup.rows.put_checkpoint(newest, dataclasses.replace(newest, payload=newest.payload + b" "))


@pytest.mark.parametrize("store_setup", SHARED, indirect=True)
@pytest.mark.parametrize("step", [0, -1], ids=["an old row", "the newest row"])
async def test_an_undecodable_row_is_one_bad_run_and_the_audit_goes_on(store_setup: StoreSetup, step: int) -> None:
    # Given three runs: a decoy with a row that is not a row, one with a changed payload, one untouched
    await _three_runs(store_setup)
    await _tamper(store_setup, step)
    store, sealer = store_setup.open(), Sealer(KEY)
    # When the whole store is audited (verify --all), listed (runs list) and paged (the viewer)
    audited = {r.run_id: r.problems for r in await read_all(store, sealer)}
    listed = {r.run_id: r.problems for r in await read_runs(store, sealer)}
    heads = {h.run_id: h.problem for h in await read_heads(store, sealer)}
    # Then each reports the decoy as bad, the tampered run as bad too, and the untouched run as clean
    for found in (audited, listed):
        assert set(found) == {"decoy", "tampered", "fine"}
        assert found["decoy"] and found["tampered"] and not found["fine"]
    assert "'decoy'" in " ".join(audited["decoy"])  # the store's own words, naming the run
    assert "signature does not match" in " ".join(audited["tampered"])
    assert set(heads) == {"decoy", "tampered", "fine"} and heads["fine"] is None
    assert heads["tampered"] is not None
    if step == -1:  # the listing reads the newest row of each run: the decoy is a bad head, not a failed page
        assert heads["decoy"] is not None
