"""A distributed superstep reads only what it uses: after a clean handoff, the run's head.

`FlowRunner.advance` on a store that counts records per segment (Redis, SQLAlchemy) reads the
latest checkpoint and those counts. When they show that nothing was logged since the
checkpoint, the call log is not read at all; otherwise it is read and checked in full, as in
any recovery.
"""

from __future__ import annotations

import pytest
from _kit.stores import setups
from _kit.tickets import ORDER, TICKETS, Crash
from _kit.workers import faulty

#: The set-ups whose store has a ``head`` of its own (memory and SQLite read the log to count).
COUNTING = setups("fakeredis", "redis", "sql-sqlite", "sql-postgres")


@pytest.mark.parametrize("store_setup", COUNTING, indirect=True)
async def test_a_clean_handoff_continues_without_reading_the_call_log(workers):
    # Given a run whose step 0 is saved, advanced one superstep at a time
    await workers.runner().run(TICKETS, ORDER, run_id="r1", max_supersteps=0)

    # When three workers in turn take clean handoffs
    stores = []
    for step in range(3):
        runner = workers.runner()
        stores.append(faulty(runner))
        result = await runner.advance(TICKETS, "r1", expected_step=step, handoff=True)

    # Then the run is done in one segment, and no worker read the call log
    assert (result.status, result.state.sent) == ("done", "mailed Hamlet")
    assert [(c.step, c.segment) for c in await workers.history("r1")] == [(0, 0), (1, 0), (2, 0), (3, 0)]
    assert [s.reads["calls"] for s in stores] == [0, 0, 0]


@pytest.mark.parametrize("store_setup", COUNTING, indirect=True)
async def test_a_handoff_after_a_record_was_logged_reads_the_log_and_claims(workers):
    # Given a run at step 0, whose next worker logged `started` for hold_seats (idempotent) and died
    await workers.runner().run(TICKETS, ORDER, run_id="r1", max_supersteps=0)
    cut_off = workers.runner()
    faulty(cut_off).crash("started", when="after", tool="hold_seats")
    with pytest.raises(Crash):
        await cut_off.advance(TICKETS, "r1", expected_step=0, handoff=True)

    # When a worker takes the handoff message for step 0
    runner = workers.runner()
    result = await runner.advance(TICKETS, "r1", expected_step=0, handoff=True)

    # Then the counts gave it away: the log was read and checked, and the run claimed anew
    assert faulty(runner).reads["calls"] == 1
    assert [(c.step, c.segment) for c in await workers.history("r1")] == [(0, 0), (1, 1), (2, 1)]
    assert result.status == "running" and result.state.held == "held 2 for Hamlet"
    assert workers.ran() == {"hold_seats": 1}
