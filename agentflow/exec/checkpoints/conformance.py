"""The checkpoint store conformance suite: plain async checks any store can run.

Each ``check_*`` function takes a store, exercises one rule of `CheckpointStore` on runs
and flows of its own (fresh uuid4 ids, so checks can share a store) and raises
`AssertionError` naming the rule when the store breaks it. Nothing here imports pytest:
a new backend proves itself with

```python
failures = {name: why for name, why in (await validate(make_store)).items() if why}
```

Rows are sealed by a real `Sealer`, so the checks also show that a store hands rows back
exactly as written (their signatures still check). Races across processes need process
plumbing and live in the test suite, not here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

from agentflow._errors import CheckpointConflict, CheckpointNotFound, CheckpointStoreCorrupt
from agentflow.exec._durable_seal import Sealer
from agentflow.exec.checkpoints._protocol import CheckpointStore
from agentflow.exec.checkpoints._records import SealedCall, SealedCheckpoint

__all__ = ["CHECKS", "SEALER", "Check", "StoreFactory", "validate"]

#: Signs every row the checks write (a fixed test key: these rows are never trusted).
SEALER: Final = Sealer(b"conformance-key-0123456789abcdef")

#: One check: takes a store, raises `AssertionError` if the store breaks the rule.
Check = Callable[[CheckpointStore], Awaitable[None]]
#: Makes a fresh store (or a coroutine that returns one) for `validate`.
StoreFactory = Callable[[], CheckpointStore | Awaitable[CheckpointStore]]

#: How many coroutines race in the concurrency checks.
RACERS: Final = 20

_last_time = 0.0


# -- helpers ---------------------------------------------------------------------------


def _now() -> float:
    """Return wall-clock time, strictly increasing across calls (so 'newest first' is well defined)."""
    global _last_time
    _last_time = max(time.time(), _last_time + 0.001)
    return _last_time


def _ids() -> tuple[str, str]:
    """Return a fresh (run id, flow name) pair."""
    tag = uuid.uuid4().hex
    return f"conformance-run-{tag}", f"conformance-flow-{tag[:12]}"


def _checkpoint(
    run_id: str, step: int, flow: str, status: str = "running", segment: int = 0, **body: Any
) -> SealedCheckpoint:
    # Non-ASCII text and escapes in every payload: a store must keep bytes, not text it re-encodes.
    return SEALER.seal_checkpoint(
        run_id, step, flow, status, segment, _now(), {"step": step, "note": 'ü ✓ "q" \\n', **body}
    )


def _call(run_id: str, segment: int, seq: int, kind: str = "started", **body: Any) -> SealedCall:
    return SEALER.seal_call(run_id, segment, seq, kind, {"at": f"{segment}.{seq}", "text": "€ ✓\n", **body})


async def _save_steps(store: CheckpointStore, run_id: str, flow: str, *statuses: str) -> list[SealedCheckpoint]:
    """Save steps 0..n-1 of a run with the given statuses; return the rows written."""
    rows = [_checkpoint(run_id, step, flow, status) for step, status in enumerate(statuses)]
    for row in rows:
        await store.save(run_id, row.step, row)
    return rows


async def _save_segment(store: CheckpointStore, run_id: str, flow: str, step: int, segment: int) -> None:
    await store.save(run_id, step, _checkpoint(run_id, step, flow, segment=segment))


def _expect(condition: bool, message: str) -> None:
    # Not `assert`: the checks must still check under `python -O`.
    if not condition:
        raise AssertionError(message)


async def _expect_raises(error: type[Exception], action: Awaitable[object], what: str) -> None:
    """Await `action` and fail unless it raises `error`."""
    try:
        await action
    except error:
        return
    except Exception as exc:
        raise AssertionError(f"{what}: expected {error.__name__}, got {type(exc).__name__}: {exc}") from exc
    raise AssertionError(f"{what}: expected {error.__name__}, but the store accepted it")


async def _expect_latest(store: CheckpointStore, run_id: str, row: SealedCheckpoint, why: str) -> None:
    got = await store.latest(run_id)
    _expect(got == row, f"{why}: latest is step {got.step} {got.payload!r}, expected step {row.step} {row.payload!r}")


# -- the checks ------------------------------------------------------------------------


async def check_implements_protocol(store: CheckpointStore) -> None:
    """The store has every method of `CheckpointStore` and says whether it lives in one process."""
    _expect(isinstance(store, CheckpointStore), f"{type(store).__name__} does not implement CheckpointStore")
    _expect(isinstance(store.in_process, bool), "in_process must be a bool")


async def check_new_run_starts_at_step_zero(store: CheckpointStore) -> None:
    """A run the store does not have takes step 0 only."""
    run_id, flow = _ids()
    await _expect_raises(CheckpointConflict, store.save(run_id, 1, _checkpoint(run_id, 1, flow)), "step 1 of a new run")
    await _expect_raises(CheckpointNotFound, store.latest(run_id), "latest after a refused first save")
    first = _checkpoint(run_id, 0, flow)
    await store.save(run_id, 0, first)
    await _expect_latest(store, run_id, first, "step 0 of a new run")


async def check_second_step_zero_conflicts(store: CheckpointStore) -> None:
    """Step 0 of a run the store already has conflicts (two workers starting one run id)."""
    run_id, flow = _ids()
    first = _checkpoint(run_id, 0, flow, worker="a")
    await store.save(run_id, 0, first)
    await _expect_raises(
        CheckpointConflict, store.save(run_id, 0, _checkpoint(run_id, 0, flow, worker="b")), "a second step 0"
    )
    await _expect_latest(store, run_id, first, "after a refused second step 0")


async def check_save_is_exactly_latest_plus_one(store: CheckpointStore) -> None:
    """Any later step is exactly latest + 1: a taken step and a skipped step both conflict."""
    run_id, flow = _ids()
    rows = await _save_steps(store, run_id, flow, "running", "running")
    await _expect_raises(
        CheckpointConflict, store.save(run_id, 1, _checkpoint(run_id, 1, flow, worker="b")), "step 1 saved twice"
    )
    await _expect_raises(CheckpointConflict, store.save(run_id, 3, _checkpoint(run_id, 3, flow)), "step 3 after 1")
    await _expect_latest(store, run_id, rows[-1], "after refused saves")
    nxt = _checkpoint(run_id, 2, flow)
    await store.save(run_id, 2, nxt)
    await _expect_latest(store, run_id, nxt, "step 2 after 1")
    history = list(await store.history(run_id))
    _expect(history == [*rows, nxt], f"history is steps {[r.step for r in history]}, expected the rows 0, 1, 2")


async def check_ended_run_takes_no_save(store: CheckpointStore) -> None:
    """A run whose latest checkpoint is ``done`` or ``failed`` takes no more saves."""
    for ended in ("done", "failed"):
        run_id, flow = _ids()
        rows = await _save_steps(store, run_id, flow, "running", ended)
        await _expect_raises(
            CheckpointConflict, store.save(run_id, 2, _checkpoint(run_id, 2, flow)), f"a save after {ended!r}"
        )
        await _expect_latest(store, run_id, rows[-1], f"after a refused save of a {ended} run")


async def check_run_never_changes_flow(store: CheckpointStore) -> None:
    """A save for a run that belongs to another flow conflicts."""
    run_id, flow = _ids()
    rows = await _save_steps(store, run_id, flow, "running")
    other = _checkpoint(run_id, 1, flow + "-other")
    await _expect_raises(CheckpointConflict, store.save(run_id, 1, other), "step 1 of the run under another flow")
    await _expect_latest(store, run_id, rows[0], "after a refused save for another flow")


async def check_row_must_match_arguments(store: CheckpointStore) -> None:
    """A checkpoint whose run id or step disagrees with the arguments of `save` is a ValueError."""
    run_id, flow = _ids()
    stranger, _ = _ids()
    await _expect_raises(ValueError, store.save(run_id, 0, _checkpoint(stranger, 0, flow)), "save of another run's row")
    await _expect_raises(ValueError, store.save(run_id, 0, _checkpoint(run_id, 1, flow)), "save(0) of a step-1 row")
    await _expect_raises(CheckpointNotFound, store.latest(run_id), "latest after refused rows")
    await _expect_raises(CheckpointNotFound, store.latest(stranger), "latest of the other run")
    rows = await _save_steps(store, run_id, flow, "running")
    await _expect_raises(ValueError, store.save(run_id, 1, _checkpoint(run_id, 2, flow)), "save(1) of a step-2 row")
    await _expect_latest(store, run_id, rows[0], "after a refused mismatched row")


async def check_latest_and_history_after_many_saves(store: CheckpointStore) -> None:
    """After 50 saves `latest` is the newest and `history` returns all of them oldest first, unchanged."""
    run_id, flow = _ids()
    statuses = ["running" if step % 3 else "paused" for step in range(50)]
    rows = await _save_steps(store, run_id, flow, *statuses)
    await _expect_latest(store, run_id, rows[-1], "after 50 saves")
    history = list(await store.history(run_id))
    _expect(len(history) == len(rows), f"history has {len(history)} rows, expected {len(rows)}")
    for wrote, got in zip(rows, history, strict=True):
        _expect(got == wrote, f"history row {wrote.step} differs from what was written: {got!r}")
    unknown, _ = _ids()
    _expect(list(await store.history(unknown)) == [], "history of an unknown run must be empty")


async def check_latest_of_unknown_run_not_found(store: CheckpointStore) -> None:
    """`latest` of a run the store does not have raises CheckpointNotFound."""
    run_id, _ = _ids()
    await _expect_raises(CheckpointNotFound, store.latest(run_id), "latest of an unknown run")


async def check_list_unfinished(store: CheckpointStore) -> None:
    """`list_unfinished` lists the flow's running and paused runs, not ended ones nor other flows'."""
    _, flow = _ids()
    runs = {name: f"{flow}-{name}" for name in ("running", "paused", "done", "failed", "resumed", "finished")}
    await _save_steps(store, runs["running"], flow, "running")
    await _save_steps(store, runs["paused"], flow, "running", "paused")
    await _save_steps(store, runs["done"], flow, "done")
    await _save_steps(store, runs["failed"], flow, "running", "failed")
    await _save_steps(store, runs["resumed"], flow, "paused", "running")
    await _save_steps(store, runs["finished"], flow, "running", "paused", "done")
    other_run, other_flow = _ids()
    await _save_steps(store, other_run, other_flow, "running")
    listed = list(await store.list_unfinished(flow))
    expected = {runs["running"], runs["paused"], runs["resumed"]}
    _expect(sorted(listed) == sorted(expected), f"list_unfinished gave {sorted(listed)}, expected {sorted(expected)}")
    _expect(list(await store.list_unfinished(other_flow)) == [other_run], "list_unfinished of the other flow")
    _expect(list(await store.list_unfinished(flow + "-none")) == [], "list_unfinished of a flow with no runs")


async def check_list_runs(store: CheckpointStore) -> None:
    """`list_runs` gives each run's latest checkpoint, newest first, filtered by flow and cut at `limit`."""
    _, flow = _ids()
    first, second, third = (f"{flow}-{n}" for n in (1, 2, 3))
    await _save_steps(store, first, flow, "running")
    second_rows = await _save_steps(store, second, flow, "done")
    third_rows = await _save_steps(store, third, flow, "paused")
    # The first run saves again last, so its latest checkpoint is the newest of the flow.
    first_latest = _checkpoint(first, 1, flow, "running")
    await store.save(first, 1, first_latest)
    other_run, other_flow = _ids()
    other_rows = await _save_steps(store, other_run, other_flow, "running")
    expected = [first_latest, third_rows[0], second_rows[0]]
    got = list(await store.list_runs(flow))
    _expect(
        got == expected,
        f"list_runs(flow) gave runs {[r.run_id for r in got]} steps {[r.step for r in got]}, "
        f"expected {[r.run_id for r in expected]} (newest first, latest checkpoints only)",
    )
    got = list(await store.list_runs(flow, limit=2))
    _expect(got == expected[:2], f"list_runs(flow, limit=2) gave {[r.run_id for r in got]}")
    everything = list(await store.list_runs())
    ours = [r for r in everything if r.run_id in {first, second, third, other_run}]
    _expect(ours == [other_rows[0], *expected], f"list_runs() gave {[r.run_id for r in ours]} for this check's runs")
    _expect(len(await store.list_runs(limit=1)) == 1, "list_runs(limit=1) must give one run")
    _expect(list(await store.list_runs(flow + "-none")) == [], "list_runs of a flow with no runs")


async def check_delete(store: CheckpointStore) -> None:
    """`delete` removes a run's checkpoints and call records; for an unknown run it does nothing."""
    run_id, flow = _ids()
    kept, _ = _ids()
    await _save_steps(store, run_id, flow, "running", "paused")
    await store.record_call(run_id, _call(run_id, 0, 0))
    kept_rows = await _save_steps(store, kept, flow, "running")
    kept_call = _call(kept, 0, 0)
    await store.record_call(kept, kept_call)
    await store.delete(run_id)
    await _expect_raises(CheckpointNotFound, store.latest(run_id), "latest of a deleted run")
    _expect(list(await store.history(run_id)) == [], "history of a deleted run must be empty")
    _expect(list(await store.calls(run_id)) == [], "calls of a deleted run must be empty")
    _expect(run_id not in await store.list_unfinished(flow), "a deleted run is still listed as unfinished")
    _expect(all(r.run_id != run_id for r in await store.list_runs(flow)), "a deleted run is still in list_runs")
    await store.delete(run_id)
    await store.delete(_ids()[0])
    await _expect_latest(store, kept, kept_rows[0], "another run after a delete")
    _expect(list(await store.calls(kept)) == [kept_call], "another run's calls after a delete")
    # The store no longer has the run, so the id starts again at step 0 with an empty call log.
    await _save_steps(store, run_id, flow, "running")
    await store.record_call(run_id, _call(run_id, 0, 0))


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
    for ended in ("done", "failed"):
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


async def check_rows_come_back_as_written(store: CheckpointStore) -> None:
    """The store returns rows untouched, so their signatures check; a row changed by hand does not."""
    run_id, flow = _ids()
    rows = await _save_steps(store, run_id, flow, "running", "paused")
    await store.record_call(run_id, _call(run_id, 0, 0, tool="x"))
    read = [await store.latest(run_id), *await store.history(run_id), *await store.list_runs(flow)]
    for row in read:
        try:
            SEALER.open_checkpoint(row, run_id)
        except CheckpointStoreCorrupt as exc:
            raise AssertionError(f"the store changed checkpoint {row.step}: {exc}") from exc
    for call in await store.calls(run_id):
        try:
            body = SEALER.open_call(call, run_id)
        except CheckpointStoreCorrupt as exc:
            raise AssertionError(f"the store changed call record {call.segment}.{call.seq}: {exc}") from exc
        _expect(body.get("tool") == "x", f"call record body came back as {body!r}")
    # The converse, to show the check above has teeth: a genuine row altered by hand is caught.
    moved_run, changed_run = _ids()[0], _ids()[0]
    changed = dataclasses.replace(_checkpoint(changed_run, 0, flow), payload=b'{"step":0}')
    for altered in (changed, dataclasses.replace(rows[0], run_id=moved_run)):
        await store.save(altered.run_id, 0, altered)
        stored = await store.latest(altered.run_id)
        try:
            SEALER.open_checkpoint(stored, altered.run_id)
        except CheckpointStoreCorrupt:
            continue
        raise AssertionError(f"a row changed by hand passed the signature check: {stored!r}")


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


#: Every check, in the order `validate` runs them.
CHECKS: Final[tuple[Check, ...]] = (
    check_implements_protocol,
    check_new_run_starts_at_step_zero,
    check_second_step_zero_conflicts,
    check_save_is_exactly_latest_plus_one,
    check_ended_run_takes_no_save,
    check_run_never_changes_flow,
    check_row_must_match_arguments,
    check_latest_and_history_after_many_saves,
    check_latest_of_unknown_run_not_found,
    check_list_unfinished,
    check_list_runs,
    check_delete,
    check_call_numbering,
    check_calls_ordered_and_unchanged,
    check_started_is_fenced,
    check_started_refused_after_end,
    check_record_call_of_unknown_run,
    check_rows_come_back_as_written,
    check_concurrent_first_saves,
    check_concurrent_next_saves,
    check_concurrent_records,
)


async def validate(store_factory: StoreFactory) -> dict[str, str | None]:
    """Run every check on its own fresh store.

    Args:
        store_factory: returns a new, empty store (or an awaitable of one). Each store is
            closed with `aclose()` after its check.

    Returns:
        Each check's name mapped to None if the store passed it, else why it failed.
    """
    report: dict[str, str | None] = {}
    for check in CHECKS:
        made = store_factory()
        store = await made if inspect.isawaitable(made) else made
        try:
            await check(store)
        except AssertionError as exc:
            report[check.__name__] = str(exc)
        except Exception as exc:
            report[check.__name__] = f"{type(exc).__name__}: {exc}"
        else:
            report[check.__name__] = None
        finally:
            await store.aclose()
    return report
