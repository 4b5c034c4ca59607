"""Conformance checks of the call log and of races: numbering, order, fencing, concurrent writers.

Each check takes a store and raises `AssertionError` naming the rule the store breaks;
`conformance` collects them into `CHECKS`. The races here are coroutines in one process;
races across processes need process plumbing and live in the test suite.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Final

from agentflow._errors import CheckpointConflict, CheckpointNotFound
from agentflow.exec.checkpoints._conformance.base import (
    _call,
    _checkpoint,
    _expect,
    _expect_latest,
    _expect_raises,
    _ids,
    _save_segment,
    _save_steps,
)
from agentflow.exec.checkpoints.protocol import CheckpointStore
from agentflow.exec.checkpoints.records import SealedCall

#: How many coroutines race in the concurrency checks.
RACERS: Final = 20


async def check_call_numbering(store: CheckpointStore) -> None:
    """Call records are numbered per segment from 0 with no gaps; a gap or a taken number conflicts."""
    run_id, flow = _ids()
    await _save_steps(store, run_id, flow, "running")
    await _expect_raises(CheckpointConflict, store.record_call(run_id, _call(run_id, 0, 1)), "first record as seq 1")
    await store.record_call(run_id, _call(run_id, 0, 0))
    await store.record_call(run_id, _call(run_id, 0, 1, "done"))
    await _expect_raises(
        CheckpointConflict, store.record_call(run_id, _call(run_id, 0, 1, "done", again=True)), "seq 1 twice"
    )
    await _expect_raises(CheckpointConflict, store.record_call(run_id, _call(run_id, 0, 3)), "seq 3 after seq 1")
    await store.record_call(run_id, _call(run_id, 0, 2))
    # A new segment (the run claimed at step 1) numbers from 0 again.
    await store.save(run_id, 1, _checkpoint(run_id, 1, flow, segment=1))
    await _expect_raises(CheckpointConflict, store.record_call(run_id, _call(run_id, 1, 1)), "segment 1 from seq 1")
    await store.record_call(run_id, _call(run_id, 1, 0))
    got = [(c.segment, c.seq) for c in await store.calls(run_id)]
    _expect(got == [(0, 0), (0, 1), (0, 2), (1, 0)], f"calls are {got}, expected 0.0 0.1 0.2 1.0")


async def check_calls_ordered_and_unchanged(store: CheckpointStore) -> None:
    """`calls` orders records by (segment, seq) as numbers and returns each exactly as written."""
    run_id, flow = _ids()
    wrote: list[SealedCall] = []

    async def record(segment: int, seq: int, kind: str) -> None:
        wrote.append(_call(run_id, segment, seq, kind))
        await store.record_call(run_id, wrote[-1])

    # Segment 0 holds 13 records (so seq 10 must sort after 9, not after 1), segments 2 and
    # 10 follow (10 after 2). Older segments are closed late, as a fenced worker finishing
    # its calls would, so the write order differs from the read order.
    await _save_steps(store, run_id, flow, "running")
    for seq in range(12):
        await record(0, seq, "started" if seq % 2 == 0 else "done")
    await _save_segment(store, run_id, flow, step=1, segment=0)
    await _save_segment(store, run_id, flow, step=2, segment=2)
    await record(2, 0, "started")
    await record(2, 1, "pending")
    await record(0, 12, "unrecordable")
    for step in range(3, 10):
        await _save_segment(store, run_id, flow, step=step, segment=2)
    await _save_segment(store, run_id, flow, step=10, segment=10)
    await record(10, 0, "started")
    await record(2, 2, "denied")
    await record(10, 1, "failed")
    await record(2, 3, "done")
    expected = sorted(wrote, key=lambda c: (c.segment, c.seq))
    got = list(await store.calls(run_id))
    order = [f"{c.segment}.{c.seq}" for c in got]
    _expect(len(got) == len(expected), f"calls gave {len(got)} records, expected {len(expected)}: {order}")
    for want, have in zip(expected, got, strict=True):
        _expect(
            have == want,
            f"call {want.segment}.{want.seq} came back as {have.segment}.{have.seq} {have!r} (order {order})",
        )
    _expect(list(await store.calls(_ids()[0])) == [], "calls of an unknown run must be empty")


async def check_started_is_fenced(store: CheckpointStore) -> None:
    """Only ``started`` is fenced: refused outside the latest checkpoint's segment; closing an old call is not."""
    run_id, flow = _ids()
    await _save_steps(store, run_id, flow, "running")
    await store.record_call(run_id, _call(run_id, 0, 0))
    # Another worker claims the run at step 1: the latest segment is now 1.
    await store.save(run_id, 1, _checkpoint(run_id, 1, flow, segment=1))
    await _expect_raises(
        CheckpointConflict, store.record_call(run_id, _call(run_id, 0, 1)), "started by the fenced segment 0"
    )
    await _expect_raises(
        CheckpointConflict, store.record_call(run_id, _call(run_id, 5, 0)), "started in segment 5 the run never had"
    )
    done = _call(run_id, 0, 1, "done")
    await store.record_call(run_id, done)
    await store.record_call(run_id, _call(run_id, 1, 0))
    got = [(c.segment, c.seq, c.kind) for c in await store.calls(run_id)]
    _expect(got == [(0, 0, "started"), (0, 1, "done"), (1, 0, "started")], f"calls are {got}")


async def check_started_refused_after_end(store: CheckpointStore) -> None:
    """A ``started`` record for a run that ended is refused."""
    for ended in ("done", "failed", "cancelled"):
        run_id, flow = _ids()
        await _save_steps(store, run_id, flow, "running", ended)
        await _expect_raises(
            CheckpointConflict, store.record_call(run_id, _call(run_id, 0, 0)), f"started after {ended!r}"
        )
        _expect(list(await store.calls(run_id)) == [], f"a refused record was kept ({ended} run)")


async def check_record_call_of_unknown_run(store: CheckpointStore) -> None:
    """`record_call` for a run with no checkpoint raises CheckpointNotFound and keeps nothing."""
    run_id, _ = _ids()
    await _expect_raises(CheckpointNotFound, store.record_call(run_id, _call(run_id, 0, 0)), "record of an unknown run")
    _expect(list(await store.calls(run_id)) == [], "a refused record was kept")


async def _race(attempts: Sequence[Awaitable[None]], what: str) -> int:
    """Run attempts together; return the index of the only winner, or fail."""
    results = await asyncio.gather(*attempts, return_exceptions=True)
    unexpected = [r for r in results if isinstance(r, BaseException) and not isinstance(r, CheckpointConflict)]
    if unexpected:
        raise AssertionError(f"{what}: a racer failed with {type(unexpected[0]).__name__}: {unexpected[0]}")
    winners = [i for i, r in enumerate(results) if r is None]
    _expect(len(winners) == 1, f"{what}: {len(winners)} of {len(results)} racers won, expected exactly one")
    return winners[0]


async def check_concurrent_first_saves(store: CheckpointStore) -> None:
    """Of 20 coroutines saving step 0 of one new run together, exactly one succeeds."""
    run_id, flow = _ids()
    rows = [_checkpoint(run_id, 0, flow, worker=i) for i in range(RACERS)]
    winner = await _race([store.save(run_id, 0, row) for row in rows], "racing step 0")
    await _expect_latest(store, run_id, rows[winner], "after racing step 0")


async def check_concurrent_next_saves(store: CheckpointStore) -> None:
    """Of 20 coroutines saving step 1 of one run together, exactly one succeeds."""
    run_id, flow = _ids()
    first = await _save_steps(store, run_id, flow, "running")
    rows = [_checkpoint(run_id, 1, flow, segment=1, worker=i) for i in range(RACERS)]
    winner = await _race([store.save(run_id, 1, row) for row in rows], "racing step 1")
    _expect(list(await store.history(run_id)) == [*first, rows[winner]], "history after racing step 1")


async def check_concurrent_records(store: CheckpointStore) -> None:
    """Of 20 coroutines writing record 0 of one segment together, exactly one succeeds."""
    run_id, flow = _ids()
    await _save_steps(store, run_id, flow, "running")
    rows = [_call(run_id, 0, 0, worker=i) for i in range(RACERS)]
    winner = await _race([store.record_call(run_id, row) for row in rows], "racing call record 0.0")
    _expect(list(await store.calls(run_id)) == [rows[winner]], "calls after racing record 0.0")


async def check_save_after_calls_is_all_or_nothing(store: CheckpointStore) -> None:
    """`save_after_calls` stores the records and the checkpoint together, or nothing."""
    combined = store.save_after_calls
    run_id, flow = _ids()
    await _save_steps(store, run_id, flow, "running")
    # Both records and the checkpoint land together.
    await combined(run_id, 1, _checkpoint(run_id, 1, flow), [_call(run_id, 0, 0), _call(run_id, 0, 1, "done")])
    got = [(c.segment, c.seq) for c in await store.calls(run_id)]
    _expect(got == [(0, 0), (0, 1)], f"after save_after_calls the log is {got}, expected 0.0 0.1")
    _expect((await store.latest(run_id)).step == 1, "save_after_calls did not store its checkpoint")
    # A refused checkpoint (a skipped step) writes none of the records.
    await _expect_raises(
        CheckpointConflict,
        combined(run_id, 3, _checkpoint(run_id, 3, flow), [_call(run_id, 0, 2)]),
        "save_after_calls with step 3 after step 1",
    )
    # A refused record (a gap in the numbering) writes neither the others nor the checkpoint.
    await _expect_raises(
        CheckpointConflict,
        combined(run_id, 2, _checkpoint(run_id, 2, flow), [_call(run_id, 0, 2), _call(run_id, 0, 4)]),
        "save_after_calls with records 0.2 then 0.4",
    )
    # A single refused record (``started`` by a fenced segment) keeps a valid checkpoint out too.
    await _expect_raises(
        CheckpointConflict,
        combined(run_id, 2, _checkpoint(run_id, 2, flow), [_call(run_id, 7, 0)]),
        "save_after_calls with a started record of segment 7",
    )
    got = [(c.segment, c.seq) for c in await store.calls(run_id)]
    _expect(got == [(0, 0), (0, 1)], f"a refused save_after_calls left the log as {got}")
    _expect((await store.latest(run_id)).step == 1, "a refused save_after_calls stored its checkpoint")
    # Records for a run with no checkpoint: not found, and nothing stored.
    unknown, _ = _ids()
    await _expect_raises(
        CheckpointNotFound,
        combined(unknown, 0, _checkpoint(unknown, 0, flow), [_call(unknown, 0, 0)]),
        "save_after_calls with records for a run with no checkpoint",
    )
    _expect(list(await store.calls(unknown)) == [], "records of a run with no checkpoint were kept")
    await _expect_raises(CheckpointNotFound, store.latest(unknown), "latest after a refused save_after_calls")
    # Without records it is a plain save.
    await combined(run_id, 2, _checkpoint(run_id, 2, flow), [])
    _expect((await store.latest(run_id)).step == 2, "save_after_calls without records did not save")


async def check_save_after_calls_numbers_each_segment(store: CheckpointStore) -> None:
    """`save_after_calls` numbers each record within its own segment, an old segment's `done` too."""
    combined = store.save_after_calls
    run_id, flow = _ids()
    await _save_steps(store, run_id, flow, "running")
    await store.record_call(run_id, _call(run_id, 0, 0))
    await store.save(run_id, 1, _checkpoint(run_id, 1, flow, segment=1))  # a claim: segment 1 fences 0
    # The old segment's late `done`, then a call of the new segment, then its `done`: each counted on its own.
    records = [_call(run_id, 0, 1, "done"), _call(run_id, 1, 0), _call(run_id, 1, 1, "done")]
    await combined(run_id, 2, _checkpoint(run_id, 2, flow, segment=1), records)
    got = [(c.segment, c.seq) for c in await store.calls(run_id)]
    _expect(got == [(0, 0), (0, 1), (1, 0), (1, 1)], f"after records of two segments the log is {got}")
    # A record numbered as if the batch's record of the other segment were its own is refused, with the rest.
    batch = [_call(run_id, 1, 2), _call(run_id, 0, 3, "done")]
    await _expect_raises(
        CheckpointConflict,
        combined(run_id, 3, _checkpoint(run_id, 3, flow, segment=1), batch),
        "save_after_calls with records 1.2 and 0.3 (segment 0's next is 0.2)",
    )
    got = [(c.segment, c.seq) for c in await store.calls(run_id)]
    _expect(got == [(0, 0), (0, 1), (1, 0), (1, 1)], f"a refused save_after_calls left the log as {got}")
    _expect((await store.latest(run_id)).step == 2, "a refused save_after_calls stored its checkpoint")


async def check_head_counts_records_per_segment(store: CheckpointStore) -> None:
    """`head` gives the latest checkpoint and each segment's record count, read no earlier than it."""
    run_id, flow = _ids()
    await _expect_raises(CheckpointNotFound, store.head(run_id), "head of an unknown run")
    first = await _save_steps(store, run_id, flow, "running")
    latest, counts = await store.head(run_id)
    _expect(latest == first[0], f"head gave step {latest.step}, expected the only checkpoint")
    _expect({s: n for s, n in counts.items() if n} == {}, f"head counts {dict(counts)} for a run with no records")
    await store.record_call(run_id, _call(run_id, 0, 0))
    await store.record_call(run_id, _call(run_id, 0, 1, "done"))
    await store.record_call(run_id, _call(run_id, 0, 2))
    claim = _checkpoint(run_id, 1, flow, segment=1)
    await store.save(run_id, 1, claim)
    await store.record_call(run_id, _call(run_id, 1, 0))
    await store.record_call(run_id, _call(run_id, 0, 3, "done"))  # the old segment closes its call late
    latest, counts = await store.head(run_id)
    _expect(latest == claim, f"head gave step {latest.step} {latest.payload!r}, expected the latest (step 1)")
    got = {s: n for s, n in counts.items() if n}
    _expect(got == {0: 4, 1: 1}, f"head counts records per segment as {got}, expected {{0: 4, 1: 1}}")
