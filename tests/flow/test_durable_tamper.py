"""Tampering with a store: every changed, moved, forged or missing row is CheckpointStoreCorrupt, and nothing runs.

Every test runs on every store set-up (`_kit.stores`), changing its rows directly (a file,
Redis keys, SQL tables). Each test starts from the same crash: the tickets run died after its pay superstep, before
saving step 2. The store then holds checkpoints 0 and 1 and four call records in segment 0:
hold started (0), hold done (1), pay started (2), pay done (3). Recovery would replay pay.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest
from _kit.faults import body
from _kit.tickets import KEY, ORDER, OTHER_KEY, TICKETS, Crash
from _kit.workers import Workers, faulty

from agentflow.exec.checkpoints import CheckpointStoreCorrupt, SealedCall
from agentflow.exec.seal import Sealer, canonical


async def crashed(workers: Workers, run_id: str = "order-1") -> None:
    first = workers.runner()
    faulty(first).crash("save", step=2)
    with pytest.raises(Crash):
        await first.run(TICKETS, ORDER, run_id=run_id)
    assert [r.kind for r in await workers.calls(run_id)] == ["started", "done", "started", "done"]
    assert [c.step for c in await workers.history(run_id)] == [0, 1]


async def refused(workers: Workers, run_id: str = "order-1", *, key: bytes = KEY) -> CheckpointStoreCorrupt:
    """Recover `run_id`: it must fail with CheckpointStoreCorrupt, run no tool, claim and log nothing."""
    before, stored = workers.ran(), await workers.rows.counts(run_id)
    with pytest.raises(CheckpointStoreCorrupt) as caught:
        await workers.runner(key=key).recover(TICKETS, run_id)
    assert workers.ran() == before
    assert await workers.rows.counts(run_id) == stored
    return caught.value


def reencoded(row: SealedCall, change: Callable[[dict[str, Any]], object]) -> bytes:
    decoded = body(row)
    change(decoded)
    return canonical(decoded)


async def test_changed_result_in_a_done_record_is_corrupt(workers):
    # Given a crashed run whose log holds pay's result
    await crashed(workers)
    done = (await workers.calls("order-1"))[3]
    assert body(done)["result"] == "charged 80 for Hamlet"

    # When someone changes that result in the store (signature left as it was)
    forged = reencoded(done, lambda b: b.update(result="charged 0 for Hamlet"))
    await workers.rows.put_call(done, dataclasses.replace(done, payload=forged))

    # Then recovery refuses the log and nothing runs
    await refused(workers)


async def test_changed_state_field_in_a_checkpoint_is_corrupt(workers):
    # Given a crashed run
    await crashed(workers)
    latest = (await workers.history("order-1"))[-1]

    # When someone changes a state field in its latest checkpoint
    forged = reencoded(latest, lambda b: b["state"].update(seats=200))
    await workers.rows.put_checkpoint(latest, dataclasses.replace(latest, payload=forged))

    # Then recovery refuses it and nothing runs
    await refused(workers)


@pytest.mark.parametrize(
    ("column", "value"),
    [("step", 5), ("status", "paused"), ("segment", 7), ("saved_at", 0.5), ("flow", "other")],
)
async def test_changed_column_of_a_checkpoint_row_is_corrupt(workers, column, value):
    # Given a crashed run
    await crashed(workers)
    latest = (await workers.history("order-1"))[-1]

    # When someone changes a column kept in clear (step, status, segment, ...) of its latest checkpoint
    await workers.rows.put_checkpoint(latest, dataclasses.replace(latest, **{column: value}))

    # Then recovery refuses it and nothing runs
    await refused(workers)


async def test_swapped_call_records_are_corrupt(workers):
    # Given a crashed run
    await crashed(workers)
    records = await workers.calls("order-1")
    started, done = records[2], records[3]

    # When someone swaps two records' contents (each keeps its place in the numbering)
    await workers.rows.put_call(started, dataclasses.replace(done, seq=started.seq))
    await workers.rows.put_call(done, dataclasses.replace(started, seq=done.seq))

    # Then recovery refuses the log and nothing runs
    await refused(workers)


async def test_call_record_moved_from_another_run_is_corrupt(workers):
    # Given two runs that crashed at the same point, so their pay results are byte-identical
    await crashed(workers, "order-1")
    await crashed(workers, "order-2")
    mine, theirs = (await workers.calls("order-1"))[3], (await workers.calls("order-2"))[3]
    assert mine.payload == theirs.payload and mine.sig != theirs.sig

    # When someone copies the other run's genuine record over this run's
    await workers.rows.put_call(mine, dataclasses.replace(theirs, run_id="order-1"))

    # Then recovery refuses the log and nothing runs
    await refused(workers, "order-1")


async def test_checkpoint_moved_from_another_run_is_corrupt(workers):
    # Given two runs that crashed at the same point
    await crashed(workers, "order-1")
    await crashed(workers, "order-2")
    mine, theirs = (await workers.history("order-1"))[-1], (await workers.history("order-2"))[-1]

    # When someone copies the other run's genuine latest checkpoint over this run's
    await workers.rows.put_checkpoint(mine, dataclasses.replace(theirs, run_id="order-1"))

    # Then recovery refuses it and nothing runs
    await refused(workers, "order-1")


async def test_checkpoint_copied_to_another_step_is_corrupt(workers):
    # Given a crashed run
    await crashed(workers)
    step0, step1 = await workers.history("order-1")

    # When someone puts the run's genuine step 0 in place of step 1 (rolling the run back)
    await workers.rows.put_checkpoint(step1, dataclasses.replace(step0, step=1))

    # Then recovery refuses it and nothing runs (hold_seats would otherwise run again)
    await refused(workers)


async def test_missing_record_in_the_middle_of_a_segment_is_corrupt(workers):
    # Given a crashed run
    await crashed(workers)
    records = await workers.calls("order-1")

    # When someone deletes a record in the middle of the segment (a gap in the numbers)
    await workers.rows.drop_call(records[1])

    # Then recovery refuses the log and nothing runs
    error = await refused(workers)
    assert "missing" in str(error)


async def test_records_cut_from_before_the_latest_checkpoint_are_corrupt(workers):
    # Given a crashed run whose latest checkpoint saw two records of its segment
    await crashed(workers)
    records = await workers.calls("order-1")

    # When someone deletes the tail of the log, back past what that checkpoint saw (no gap left)
    for record in reversed(records[1:]):
        await workers.rows.drop_call(record)
    assert [(r.segment, r.seq) for r in await workers.calls("order-1")] == [(0, 0)]

    # Then recovery refuses the log and nothing runs
    await refused(workers)


async def test_record_forged_with_another_key_is_corrupt(workers):
    # Given a crashed run
    await crashed(workers)

    # When someone appends a well-formed record in the right place, signed with a key of their own
    forger = Sealer(OTHER_KEY)
    extra = forger.seal_call("order-1", 0, 4, "done", {"call_id": "1/pay/0/x", "superstep": 1, "result": "x"})
    await workers.setup.raw.record_call("order-1", extra)

    # Then recovery refuses the log and nothing runs
    await refused(workers)


async def test_rows_read_with_another_key_are_corrupt(workers):
    # Given a crashed run signed with KEY
    await crashed(workers)

    # When a worker configured with another key recovers it
    # Then it refuses every row and nothing runs
    await refused(workers, key=OTHER_KEY)


@pytest.mark.parametrize("where", ["checkpoint", "call record"])
async def test_tampered_row_is_rejected_before_its_payload_is_decoded(workers, where):
    # Given a crashed run
    await crashed(workers)

    # When someone replaces a payload with bytes that are not even JSON (signature left as it was)
    garbage = b"\xff\xfe{not json"
    with pytest.raises(ValueError):
        json.loads(garbage)
    if where == "checkpoint":
        latest = (await workers.history("order-1"))[-1]
        await workers.rows.put_checkpoint(latest, dataclasses.replace(latest, payload=garbage))
    else:
        done = (await workers.calls("order-1"))[3]
        await workers.rows.put_call(done, dataclasses.replace(done, payload=garbage))

    # Then the error is about the signature, not about JSON: the payload was never parsed
    error = await refused(workers)
    assert "signature" in str(error)
    assert "JSON" not in str(error)


async def test_latest_checkpoint_deleted_is_corrupt(workers):
    # Given a run whose worker died after the send superstep: checkpoints 0..2, send's records in the log
    first = workers.runner()
    faulty(first).crash("save", step=3)
    with pytest.raises(Crash):
        await first.run(TICKETS, ORDER, run_id="order-1")
    assert workers.ran() == {"hold_seats": 1, "charge_card": 1, "email_tickets": 1}

    # When someone deletes the latest checkpoint (the run now looks as if pay were its last superstep),
    # while the signed log still holds email_tickets' `done` record of the superstep after it
    latest = (await workers.history("order-1"))[-1]
    await workers.rows.drop_checkpoint(latest)
    assert [body(r)["superstep"] for r in await workers.calls("order-1")][-1] == 2

    # Then recovery refuses the store, and email_tickets (already done) does not run again
    await refused(workers)
