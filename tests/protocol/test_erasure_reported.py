"""``agentflow verify`` reports what a store writer erased or rewound, wherever the signed rows let it be seen.

Each test makes the writes someone with the store's write access (and no key) can make,
with the real clients where the set-up has them: Redis ``HDEL``, ``HSET``, ``RPOP`` and
``LTRIM`` (`_kit.stores.RedisRows.send`), SQL ``DELETE`` and ``UPDATE``
(`_kit.stores.SqlRows.execute`), the kit's careful deletes (`Rows.drop_call`) on every
set-up. Then it reads the run as ``verify`` does: the read model's checks, then
`agentflow.exec.run.erasure`. The last tests pin what stays invisible (docs/security.md).
"""

from __future__ import annotations

from typing import Any

import pytest
from _kit.faults import FaultyStore, body
from _kit.stores import RedisRows, SqlRows, StoreSetup, setups
from _kit.tickets import BATCH, KEY, ORDER, TICKETS, Crash, make_tickets

from agentflow import Executor, FlowRunner
from agentflow.exec.run.erasure import report_erasures
from agentflow.exec.run.read import read_run
from agentflow.exec.seal import Sealer

REDIS = setups("fakeredis", "redis")
SQL = setups("sqlite", "sql-sqlite", "sql-postgres")


async def verified(setup: StoreSetup, run_id: str) -> list[str]:
    """What ``agentflow verify RUN_ID`` names of the run: the read model's problems, then what was erased."""
    sealer = Sealer(KEY)
    reports = [await read_run(setup.raw, sealer, run_id)]
    await report_erasures(setup.raw, sealer, reports)
    return reports[0].problems


def worker(setup: StoreSetup, tickets: Any) -> tuple[FlowRunner, FaultyStore]:
    store = FaultyStore(setup.open())
    return FlowRunner(Executor(tickets.registry), checkpoints=store, checkpoint_key=KEY), store


async def finished(setup: StoreSetup) -> str:
    """A ticket order run to the end: checkpoints 0 to 3, six records in segment 0."""
    runner, _ = worker(setup, make_tickets())
    await runner.run(TICKETS, ORDER, run_id="t-1")
    assert len(await setup.history("t-1")) == 4
    return "t-1"


async def cut_in_send(setup: StoreSetup) -> str:
    """A run whose worker died right after logging email_tickets' ``started``: the tail after checkpoint 2."""
    runner, store = worker(setup, make_tickets())
    store.crash("started", when="after", tool="email_tickets")
    with pytest.raises(Crash):
        await runner.run(TICKETS, ORDER, run_id="t-2")
    newest = (await setup.history("t-2"))[-1]
    assert body(newest)["log"] == [0, 4] and len(await setup.calls("t-2")) == 5
    return "t-2"


def redis_rows(setup: StoreSetup) -> RedisRows:
    assert isinstance(setup.rows, RedisRows)
    return setup.rows


def sql_rows(setup: StoreSetup) -> SqlRows:
    assert isinstance(setup.rows, SqlRows)
    return setup.rows


# -- what the signed counts prove, with the calls the erased records were ---------------------


@pytest.mark.parametrize("store_setup", setups(), indirect=True)
async def test_records_a_recovery_replayed_are_named_when_erased(store_setup):
    # Given a batch (hold, lookup, charge in one superstep) cut after charge_card started,
    # recovered with the charge rerun: the claim (step 1) pinned segment 0's five records,
    # and step 2 signed which calls it replayed and which it reran
    tickets = make_tickets()
    first, store = worker(store_setup, tickets)
    store.crash("started", when="after", tool="charge_card")
    with pytest.raises(Crash):
        await first.run(BATCH, ORDER, run_id="b-1")
    second, _ = worker(store_setup, tickets)
    assert (await second.recover(BATCH, "b-1", rerun_in_doubt=True)).status == "done"
    erased = [r for r in await store_setup.calls("b-1") if r.segment == 0]
    ids = {body(r)["tool"]: body(r)["call_id"] for r in erased if r.kind == "started"}
    assert body((await store_setup.history("b-1"))[2])["recovered"]["rerun"] == [ids["charge_card"]]
    # When every record of segment 0 is deleted (Redis: HDEL and the counter set to match; SQL: DELETE)
    for rec in reversed(erased):
        await store_setup.rows.drop_call(rec)
    # Then verify names the count the claim pinned, and each call whose records went
    problems = await verified(store_setup, "b-1")
    assert any("segment 0 has 0 records, checkpoint 1 saw 5" in p for p in problems), problems
    for tool, what in (
        ("hold_seats", "replayed its result"),
        ("slow_lookup", "replayed its result"),
        ("charge_card", "reran it as a call in doubt"),
    ):
        line = f"call {ids[tool]!r} of run 'b-1': checkpoint 2 {what}, but no record of it is stored before segment 1"
        assert any(p.startswith(line) for p in problems), (tool, problems)


# -- the bookkeeping beside the rows: Redis counters and latest hash, the SQL runs row --------


@pytest.mark.parametrize("store_setup", REDIS, indirect=True)
async def test_a_counter_set_back_below_the_records_is_reported(store_setup):
    run_id = await finished(store_setup)
    # When segment 0's record counter is set back (one HSET; every record stays)
    await redis_rows(store_setup).send(run_id, "next", "HSET", "0", 2)
    # Then verify says so, and nothing else is wrong
    assert await verified(store_setup, run_id) == [
        "call log of run 't-1': segment 0's record counter was set back to 2, below the 6 records stored "
        "(nothing is overwritten: records are append-only; a Redis HSET of the counter)"
    ]


@pytest.mark.parametrize("store_setup", REDIS, indirect=True)
async def test_a_tail_record_erased_without_its_counter_is_reported(store_setup):
    # Given a run cut after email_tickets' started (record 0.4, after the newest checkpoint)
    run_id = await cut_in_send(store_setup)
    # When that record is deleted (one HDEL) and its counter left as it is
    assert await redis_rows(store_setup).send(run_id, "calls", "HDEL", "0:4") == 1
    # Then verify reports the erasure (no signed count saw that record: the counter did)
    assert await verified(store_setup, run_id) == [
        "call log of run 't-2': 1 record(s) of segment 0 were erased (its record counter says 5, 4 are stored: "
        "a Redis HDEL, or the counter was raised)"
    ]


#: Writes that leave a run's listing entry and its newest row apart: the Redis command, the SQL statement,
#: and what verify says.
APART = {
    "newest-row-removed": (
        ("cp", "RPOP"),
        "DELETE FROM {cp} WHERE run_id = ? AND step = 3",
        "checkpoint rows of run 't-1' were removed: the store's listing entry of run 't-1' names checkpoint 3 "
        "(done), but the newest stored row is step 2 (running) (a Redis RPOP or LTRIM, a SQL DELETE)",
    ),
    "listing-set-back": (
        ("latest", "HSET", "step", 1, "status", "running"),
        "UPDATE {runs} SET step = 1, status = 'running' WHERE run_id = ?",
        "the store's listing entry of run 't-1' names checkpoint 1 (running), set back from the newest stored "
        "row, step 3 (done)",
    ),
    "listing-rewritten": (
        ("latest", "HSET", "status", "failed"),
        "UPDATE {runs} SET status = 'failed' WHERE run_id = ?",
        "the store's listing entry of run 't-1' names checkpoint 3 (failed) of flow 'tickets', rewritten: the row "
        "says 'done' of flow 'tickets'",
    ),
}


@pytest.mark.parametrize("store_setup", [*REDIS, *SQL], indirect=True)
@pytest.mark.parametrize("write", sorted(APART))
async def test_a_listing_entry_apart_from_the_newest_row_is_reported(store_setup, write):
    run_id = await finished(store_setup)
    command, sql, said = APART[write]
    # When the newest checkpoint row is removed with the listing entry left (Redis RPOP; SQL DELETE),
    # or the entry is set back or rewritten (Redis HSET of the latest hash; SQL UPDATE of the runs row)
    if isinstance(store_setup.rows, RedisRows):
        part, verb, *rest = command
        await store_setup.rows.send(run_id, str(part), str(verb), *rest)
    else:
        assert await sql_rows(store_setup).execute(sql, run_id) == 1
    # Then the rows left check (a crash after step 2 looks the same), and verify names what was done
    assert await verified(store_setup, run_id) == [said]


# -- what stays invisible ------------------------------------------------------------------


@pytest.mark.parametrize("store_setup", setups(), indirect=True)
async def test_a_tail_started_erased_with_its_counter_set_back_is_invisible(store_setup):
    # Given a run cut after email_tickets' started, the one record after the newest checkpoint
    run_id = await cut_in_send(store_setup)
    tail = (await store_setup.calls(run_id))[-1]
    # When it is deleted and, on Redis, its segment's counter set back to match (HDEL, HSET; SQL: DELETE)
    await store_setup.rows.drop_call(tail)
    # Then nothing signed saw it: verify finds the run clean (recovery would start the call again)
    assert await verified(store_setup, run_id) == []


@pytest.mark.parametrize("store_setup", REDIS, indirect=True)
async def test_a_consistent_rollback_of_the_redis_keys_is_invisible(store_setup):
    run_id = await finished(store_setup)
    rows = redis_rows(store_setup)
    # When the newest checkpoint and the send superstep's records go, with every counter set to match
    await rows.send(run_id, "cp", "RPOP")
    await rows.send(run_id, "latest", "HSET", "step", 2, "status", "running")
    await rows.send(run_id, "calls", "HDEL", "0:4", "0:5")
    await rows.send(run_id, "next", "HSET", "0", 4)
    # Then the run reads as one cut after step 2: nothing to report
    assert await verified(store_setup, run_id) == []
