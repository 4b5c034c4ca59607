"""Conformance checks of the checkpoint rules: compare-and-set, history, listing, delete, relist, rows kept as written.

Each check takes a store and raises `AssertionError` naming the rule the store breaks;
`conformance` collects them into `CHECKS`.
"""

from __future__ import annotations

import dataclasses

from agentflow._errors import CheckpointConflict, CheckpointNotFound, CheckpointStoreCorrupt
from agentflow.exec.checkpoints._conformance.base import (
    SEALER,
    _call,
    _checkpoint,
    _expect,
    _expect_latest,
    _expect_raises,
    _ids,
    _save_steps,
)
from agentflow.exec.checkpoints.protocol import CheckpointStore


async def check_implements_protocol(store: CheckpointStore) -> None:
    """The store has every member of `CheckpointStore` and `MarkerStore`; only an in-process store has a key."""
    defaulted = ("local_key", "save_after_calls", "head")  # `StoreDefaults` has these
    own = (
        *("in_process", "stored_runs", "relist", "take_lease", "renew_lease", "release_lease", "leases"),
        *("put_marker", "peek_markers", "take_marker"),
    )
    missing = [name for name in (*own[:1], *defaulted, *own[1:]) if not hasattr(store, name)]
    hint = " (StoreDefaults gives defaults)" if set(missing) & set(defaulted) else ""
    _expect(not missing, f"{type(store).__name__} lacks {', '.join(missing)}{hint}")
    _expect(isinstance(store, CheckpointStore), f"{type(store).__name__} does not implement CheckpointStore")
    _expect(isinstance(store.in_process, bool), "in_process must be a bool")
    key = store.local_key
    _expect(key is None or isinstance(key, bytes), f"local_key must be bytes or None, not {type(key).__name__}")
    _expect(
        store.in_process or key is None,
        "a store shared with other processes must have local_key None (runners sign with checkpoint_key)",
    )


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
    """A run whose latest checkpoint is ``done`` or ``cancelled`` takes no more saves."""
    for ended in ("done", "cancelled"):
        run_id, flow = _ids()
        rows = await _save_steps(store, run_id, flow, "running", ended)
        await _expect_raises(
            CheckpointConflict, store.save(run_id, 2, _checkpoint(run_id, 2, flow)), f"a save after {ended!r}"
        )
        await _expect_latest(store, run_id, rows[-1], f"after a refused save of a {ended} run")


async def check_failed_run_takes_only_the_next_step(store: CheckpointStore) -> None:
    """A ``failed`` run takes a save of exactly the next step (a retry's claim), and no other."""
    run_id, flow = _ids()
    rows = await _save_steps(store, run_id, flow, "running", "failed")
    await _expect_raises(
        CheckpointConflict, store.save(run_id, 3, _checkpoint(run_id, 3, flow)), "a save past a failed run's next step"
    )
    await _expect_latest(store, run_id, rows[-1], "after a refused skip over a failed step")
    retry = _checkpoint(run_id, 2, flow, segment=2)
    await store.save(run_id, 2, retry)
    await _expect_latest(store, run_id, retry, "after a retry's claim of a failed run")


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


async def check_stored_runs(store: CheckpointStore) -> None:
    """`stored_runs` lists every run with a checkpoint row, sorted, and drops a deleted one."""
    _, flow = _ids()
    names = [f"{flow}-{n}" for n in ("b", "a", "c")]
    for run_id in names:  # saved out of order: the listing sorts
        await _save_steps(store, run_id, flow, "running")
    saved = sorted(names)
    await store.save(saved[1], 1, _checkpoint(saved[1], 1, flow, "done"))  # an ended run is listed too
    other_run, other_flow = _ids()
    await _save_steps(store, other_run, other_flow, "paused")
    never, _ = _ids()
    got = list(await store.stored_runs())
    _expect(got == sorted(got), f"stored_runs is not sorted: {got[:10]}")
    _expect(len(got) == len(set(got)), "stored_runs names a run more than once")
    for run_id in (*saved, other_run):
        _expect(run_id in got, f"stored_runs misses run {run_id!r}")
    _expect(never not in got, "stored_runs names a run that was never saved")
    await store.delete(saved[0])
    got = list(await store.stored_runs())
    _expect(saved[0] not in got, "stored_runs still names a deleted run")
    _expect(all(run_id in got for run_id in saved[1:]), "stored_runs lost a run after another was deleted")


async def check_relist_of_unknown_run(store: CheckpointStore) -> None:
    """`relist` of a run with no checkpoint row (never saved, or deleted) returns None and lists nothing."""
    run_id, flow = _ids()
    _expect(await store.relist(run_id) is None, "relist of a run never saved must return None")
    await _expect_raises(CheckpointNotFound, store.latest(run_id), "latest after relisting a run never saved")
    _expect(all(r.run_id != run_id for r in await store.list_runs()), "relist listed a run never saved")
    _expect(run_id not in await store.stored_runs(), "relist made stored_runs name a run never saved")
    await _save_steps(store, run_id, flow, "running")
    await store.delete(run_id)
    _expect(await store.relist(run_id) is None, "relist of a deleted run must return None")
    _expect(run_id not in await store.list_unfinished(flow), "relist listed a deleted run as unfinished")
    _expect(all(r.run_id != run_id for r in await store.list_runs(flow)), "relist listed a deleted run")
    # Nothing was left behind: the id starts afresh at step 0.
    await _save_steps(store, run_id, flow, "running")


async def _seen(store: CheckpointStore, flow: str, runs: tuple[str, ...]) -> dict[str, object]:
    """Everything the protocol shows of `runs`: each one's latest, history and head, and the listings."""
    ours = set(runs)
    return {
        "latest": [await store.latest(run_id) for run_id in runs],
        "history": [list(await store.history(run_id)) for run_id in runs],
        "head": [(cp, dict(counts)) for cp, counts in [await store.head(run_id) for run_id in runs]],
        "list_runs(flow)": list(await store.list_runs(flow)),
        "list_runs()": [cp for cp in await store.list_runs() if cp.run_id in ours],
        "list_unfinished": sorted(await store.list_unfinished(flow)),
        "stored_runs": [run_id for run_id in await store.stored_runs() if run_id in ours],
    }


async def check_relist_of_a_listed_run_changes_nothing(store: CheckpointStore) -> None:
    """`relist` of a healthy run returns its newest row as written and changes nothing; the run carries on."""
    _, flow = _ids()
    running, paused, done = (f"{flow}-{name}" for name in ("running", "paused", "done"))
    await _save_steps(store, running, flow, "running")
    await store.save(running, 1, _checkpoint(running, 1, flow, segment=1))  # claimed by another worker
    await store.record_call(running, _call(running, 1, 0))
    await _save_steps(store, paused, flow, "running", "paused")
    await _save_steps(store, done, flow, "running", "done")
    runs = (running, paused, done)
    before = await _seen(store, flow, runs)
    newest = [await store.latest(run_id) for run_id in runs]
    for _ in range(2):  # twice: a relist of a relisted run changes nothing either
        for run_id, latest in zip(runs, newest, strict=True):
            got = await store.relist(run_id)
            _expect(got == latest, f"relist({run_id!r}) returned {got!r}, not the newest row {latest!r}")
    for row in newest:
        try:
            SEALER.open_checkpoint(row, row.run_id)
        except CheckpointStoreCorrupt as exc:
            raise AssertionError(f"relist returned a changed row: {exc}") from exc
    after = await _seen(store, flow, runs)
    for what, seen in before.items():
        _expect(after[what] == seen, f"relist of healthy runs changed {what}: {seen!r} became {after[what]!r}")
    # And the runs carry on as before: the log, the fencing of an older segment, the next step.
    await store.record_call(running, _call(running, 1, 1, "done"))
    fenced = store.record_call(running, _call(running, 0, 0))
    await _expect_raises(CheckpointConflict, fenced, "a started record of segment 0 after relist")
    await store.save(running, 2, _checkpoint(running, 2, flow, segment=1))
    await store.save(paused, 2, _checkpoint(paused, 2, flow))
