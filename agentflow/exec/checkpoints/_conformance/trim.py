"""Conformance checks of trimming: old finished runs keep their newest checkpoint, call log and listing; nothing else.

Each check takes a store and raises `AssertionError` naming the rule the store breaks;
`conformance` collects them into `CHECKS`. They go through `retention` (the store's own
`trimmable` and `trim`). A store without `TrimStore` cannot trim: each check then holds it
to the refusal instead (a `NotImplementedError` that says so, and nothing deleted), which
is the whole of its contract; every store agentflow ships trims (tests/checkpoints pins it).

As in `_conformance.retention`, the runs a check trims were saved in 1970 and the cut-off
is in 1970 too, so other checks' runs on a shared store are never taken.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from agentflow.exec.checkpoints import retention
from agentflow.exec.checkpoints._conformance.base import SEALER, _call, _expect, _expect_raises, _ids
from agentflow.exec.checkpoints._conformance.retention import CUT_OFF, _old
from agentflow.exec.checkpoints.protocol import CheckpointStore, EventStore, TrimStore
from agentflow.exec.checkpoints.records import ENDED, SealedCheckpoint, judged_row
from agentflow.exec.checkpoints.rules import UNTRIMMED_PREFIX

#: Checkpoints of the runs the checks trim: a trim deletes all but the last.
STEPS = 3


async def _long_run(store: CheckpointStore, flow: str, status: str, at: float, steps: int = STEPS) -> str:
    """Store a run of `steps` checkpoints in segment 0 (the last `status`, saved at `at`) and two call records."""
    run_id = f"{_ids()[0]}-{status}"
    await store.save(run_id, 0, _old(run_id, 0, flow, "running" if steps > 1 else status, at - steps))
    records = [_call(run_id, 0, 0, "started"), _call(run_id, 0, 1, "done")]
    for step in range(1, steps):
        row = _old(run_id, step, flow, status if step == steps - 1 else "running", at - steps + step + 1)
        await store.save_after_calls(run_id, step, row, records if step == 1 else [])
    return run_id


async def _trimming(store: CheckpointStore, flow: str) -> bool:
    """Whether the store trims; a store that cannot must refuse clearly and delete nothing."""
    if isinstance(store, TrimStore):
        return True
    run_id = await _long_run(store, flow, "done", 100.0)
    for action in (
        retention.trimmable(store, CUT_OFF, ENDED, 10),
        retention.trim(store, [run_id], CUT_OFF, ENDED),
    ):
        try:
            await action
        except NotImplementedError as exc:
            _expect("cannot trim" in str(exc), f"a store without trim refused with an unclear message: {exc}")
        else:
            raise AssertionError("a store without TrimStore was asked to trim and did not refuse")
    kept = [cp.step for cp in await store.history(run_id)]
    _expect(kept == list(range(STEPS)), f"a refused trim left steps {kept}")
    return False


def _mine(found: Sequence[tuple[str, float]], mine: Sequence[str]) -> list[tuple[str, float]]:
    return [(run_id, at) for run_id, at in found if run_id in mine]


async def _expect_trimmed(store: CheckpointStore, run_id: str, newest: SealedCheckpoint, calls: int) -> None:
    history, records = list(await store.history(run_id)), await store.calls(run_id)
    _expect(history == [newest], f"trimmed run {run_id} holds steps {[cp.step for cp in history]}, expected only "
            f"its newest step {newest.step} as it was written")  # fmt: skip
    _expect(await store.latest(run_id) == newest, f"trimmed run {run_id}: latest changed")
    _expect(len(records) == calls, f"trimmed run {run_id} holds {len(records)} call records, expected {calls}")
    head, counts = await store.head(run_id)
    _expect(head == newest and dict(counts) == {0: 2}, f"trimmed run {run_id}: head is {head.step}, {dict(counts)}")
    _expect(run_id in await store.stored_runs(), f"stored_runs lost trimmed run {run_id}")
    listed = {cp.run_id: cp.step for cp in await store.list_runs(None, 100_000)}
    _expect(listed.get(run_id) == newest.step, f"list_runs shows trimmed run {run_id} as {listed.get(run_id)}")


async def check_trim_keeps_only_the_newest_checkpoint(store: CheckpointStore) -> None:
    """Old finished flow runs keep their newest checkpoint, call log and listing; nothing else is touched."""
    _, flow = _ids()
    if not await _trimming(store, flow):
        return
    ended = [await _long_run(store, flow, s, 100.0 + i) for i, s in enumerate(("cancelled", "done", "failed"))]
    unfinished = [await _long_run(store, flow, status, 50.0) for status in ("running", "paused")]
    recent = await _long_run(store, flow, "done", CUT_OFF + 10)
    single = await _long_run(store, flow, "done", 60.0, steps=1)
    loop = await _long_run(store, f"{UNTRIMMED_PREFIX}{flow}", "done", 70.0)
    mine = [*ended, *unfinished, recent, single, loop]
    newest = {run_id: await store.latest(run_id) for run_id in ended}
    if isinstance(store, EventStore):
        await store.append_events(ended[0], [SEALER.seal_event(ended[0], {"name": "run.done", "at": 1.0, "data": {}})])
    listed = _mine(await retention.trimmable(store, CUT_OFF, ENDED, 100_000), mine)
    expected = [(run_id, 100.0 + i) for i, run_id in enumerate(ended)]
    _expect(listed == expected, f"trimmable listed {listed}, expected the old finished flow runs {expected}")
    since = _mine(await retention.trimmable(store, CUT_OFF, ENDED, 100_000, since=101.0), mine)
    _expect(since == expected[1:], f"trimmable since 101 s listed {since}, expected {expected[1:]}")
    first = _mine(await retention.trimmable(store, CUT_OFF, {"failed", "cancelled"}, 1), mine)
    _expect(first == expected[:1], f"trimmable of one failed or cancelled run listed {first}, expected {expected[:1]}")
    trimmed = await retention.trim(store, list(reversed(mine)), CUT_OFF, ENDED)
    _expect(trimmed.run_ids == tuple(reversed(ended)), f"trim took {list(trimmed.run_ids)}, expected {ended[::-1]}")
    _expect(trimmed.rows == 3 * (STEPS - 1), f"trim counted {trimmed.rows} rows, expected {3 * (STEPS - 1)}")
    for run_id in ended:
        await _expect_trimmed(store, run_id, newest[run_id], 2)
    for run_id, steps in [(r, STEPS) for r in [*unfinished, recent, loop]] + [(single, 1)]:
        kept = [cp.step for cp in await store.history(run_id)]
        _expect(kept == list(range(steps)), f"trim touched run {run_id} (a recent, unfinished, single or loop run)")
    if isinstance(store, EventStore):
        kept_events = await store.read_events(ended[0])
        _expect(len(kept_events) == 1, f"a trim took the events of run {ended[0]}: {len(kept_events)} left")
    again = _mine(await retention.trimmable(store, CUT_OFF, ENDED, 100_000), mine)
    _expect(not again, f"trimmable listed runs already trimmed: {again}")
    twice = await retention.trim(store, ended, CUT_OFF, ENDED)
    _expect(not twice.run_ids and twice.rows == 0, f"a second trim of the same runs returned {twice}")


async def check_trim_refuses_runs_that_have_not_ended(store: CheckpointStore) -> None:
    """A trim asked to take running or paused runs refuses (ValueError), and deletes nothing."""
    _, flow = _ids()
    if not await _trimming(store, flow):
        return
    run_id = await _long_run(store, flow, "paused", 100.0)
    for statuses in ({"running"}, {"done", "paused"}, set()):
        await _expect_raises(
            ValueError, retention.trimmable(store, CUT_OFF, statuses, 10), f"trimmable of statuses {statuses}"
        )
        await _expect_raises(
            ValueError, retention.trim(store, [run_id], CUT_OFF, statuses), f"trim of statuses {statuses}"
        )
    kept = [cp.step for cp in await store.history(run_id)]
    _expect(kept == list(range(STEPS)), f"refused trims left steps {kept}")


async def check_trim_leaves_a_held_run(store: CheckpointStore) -> None:
    """A run a live lease holds is neither listed nor trimmed, and keeps its lease; once given up, it is trimmed."""
    _, flow = _ids()
    if not await _trimming(store, flow):
        return
    run_id = await _long_run(store, flow, "failed", 100.0)
    token = f"token-{uuid.uuid4().hex}"
    await store.take_lease(run_id, "a worker retrying it", token, 60.0)
    listed = _mine(await retention.trimmable(store, CUT_OFF, ENDED, 100_000), [run_id])
    _expect(not listed, "trimmable listed a run a live lease holds")
    trimmed = await retention.trim(store, [run_id], CUT_OFF, ENDED)
    _expect(not trimmed.run_ids, "trim took a run a live lease holds")
    _expect(len(await store.history(run_id)) == STEPS, "a held run lost checkpoints to a trim")
    _expect(run_id in await store.leases([run_id]), "a trim took away the lease of the run it left alone")
    await store.release_lease(run_id, token)
    trimmed = await retention.trim(store, [run_id], CUT_OFF, ENDED)
    _expect(trimmed.run_ids == (run_id,), "trim did not take the run once its lease was given up")


async def check_trim_judges_each_run_again(store: CheckpointStore) -> None:
    """A run that moved on after it was listed (a retry's claim saved) is left; unknown ids are skipped."""
    _, flow = _ids()
    if not await _trimming(store, flow):
        return
    run_id = await _long_run(store, flow, "failed", 100.0)
    listed = _mine(await retention.trimmable(store, CUT_OFF, ENDED, 100_000), [run_id])
    _expect([r for r, _ in listed] == [run_id], f"trimmable listed {listed}, expected the failed run")
    await store.save(run_id, STEPS, _old(run_id, STEPS, flow, "running", 200.0))  # a retry's claim
    trimmed = await retention.trim(store, [run_id, f"{run_id}-unknown"], CUT_OFF, ENDED)
    _expect(not trimmed.run_ids, f"trim took {list(trimmed.run_ids)}: the run was retried after it was listed")
    kept = [cp.step for cp in await store.history(run_id)]
    _expect(kept == list(range(STEPS + 1)), f"a retried run holds steps {kept} after a trim")


async def check_trimmed_run_is_retried_and_trimmed_again(store: CheckpointStore) -> None:
    """A trimmed failed run takes a retry's claim, records and saves as before; once ended again, it trims again."""
    _, flow = _ids()
    if not await _trimming(store, flow):
        return
    run_id = await _long_run(store, flow, "failed", 100.0)
    await retention.trim(store, [run_id], CUT_OFF, ENDED)
    # The retry: a claim opening segment STEPS, a started record in it, then its done record with the end.
    await store.save(run_id, STEPS, _claim(run_id, flow))
    await store.record_call(run_id, _call(run_id, STEPS, 0, "started"))
    done = SEALER.seal_checkpoint(run_id, STEPS + 1, flow, "done", STEPS, 201.0, {"step": STEPS + 1})
    await store.save_after_calls(run_id, STEPS + 1, done, [_call(run_id, STEPS, 1, "done")])
    kept = [cp.step for cp in await store.history(run_id)]
    _expect(kept == [STEPS - 1, STEPS, STEPS + 1], f"a trimmed run retried to its end holds steps {kept}")
    _, counts = await store.head(run_id)
    _expect(dict(counts) == {0: 2, STEPS: 2}, f"a trimmed run retried counts records {dict(counts)}")
    relisted = await store.relist(run_id)
    _expect(relisted == done, "relist of a trimmed, retried run did not return its newest row")
    listed = _mine(await retention.trimmable(store, CUT_OFF, ENDED, 100_000), [run_id])
    _expect(listed == [(run_id, 201.0)], f"trimmable listed {listed}: a retried run that ended again qualifies")
    trimmed = await retention.trim(store, [run_id], CUT_OFF, ENDED)
    _expect(trimmed.rows == 2, f"the second trim counted {trimmed.rows} rows, expected the 2 the retry added")
    _expect(list(await store.history(run_id)) == [done], "the second trim did not keep only the newest checkpoint")
    _expect(len(await store.calls(run_id)) == 4, "a trim took call records")


def _claim(run_id: str, flow: str) -> SealedCheckpoint:
    """A retry's claim: a running checkpoint that opens segment `STEPS` at step `STEPS`."""
    return SEALER.seal_checkpoint(run_id, STEPS, flow, "running", STEPS, 200.0, {"step": STEPS, "claim": "retry"})


async def check_trim_takes_only_the_judged_row(store: CheckpointStore) -> None:
    """Given the rows judged, a trim takes a run only while its newest row is the judged one (step and signature).

    As for a prune: the run was retried and failed again after it was judged, all in 1970,
    so only its newest row tells it apart. It is left whole; a run judged at its newest row,
    in the same batch, is trimmed, and so is the retried one once its new row is judged.
    """
    _, flow = _ids()
    if not await _trimming(store, flow):
        return
    moved, still = await _long_run(store, flow, "failed", 100.0), await _long_run(store, flow, "done", 101.0)
    then = {run_id: judged_row(await store.latest(run_id)) for run_id in (moved, still)}
    await store.save(moved, STEPS, _claim(moved, flow))  # a retry's claim
    failed = SEALER.seal_checkpoint(moved, STEPS + 1, flow, "failed", STEPS, 160.0, {"step": STEPS + 1})
    await store.save(moved, STEPS + 1, failed)  # and it failed again, long ago too
    trimmed = await retention.trim(store, [moved, still], CUT_OFF, ENDED, judged=then)
    _expect(
        trimmed.run_ids == (still,),
        f"trim given the rows judged took {list(trimmed.run_ids)}, expected only {still}: run {moved} saved "
        f"steps {STEPS} and {STEPS + 1} after its step {STEPS - 1} was judged",
    )
    kept = [cp.step for cp in await store.history(moved)]
    _expect(kept == list(range(STEPS + 2)), f"a run saved again after it was judged holds steps {kept} after a trim")
    _expect([cp.step for cp in await store.history(still)] == [STEPS - 1], f"run {still} was not trimmed")
    for wrong, what in (({}, "no row judged for it"), ({moved: (STEPS + 1, "0" * 64)}, "its newest step, another sig")):
        trimmed = await retention.trim(store, [moved], CUT_OFF, ENDED, judged=wrong)
        _expect(not trimmed.run_ids, f"trim took run {moved} with {what}")
    trimmed = await retention.trim(store, [moved], CUT_OFF, ENDED, judged={moved: judged_row(failed)})
    _expect(trimmed.run_ids == (moved,), f"trim did not take run {moved} once its newest row was the one judged")
    _expect(list(await store.history(moved)) == [failed], f"run {moved} trimmed at the row judged kept other rows")


async def check_trim_leaves_a_run_that_went_on(store: CheckpointStore) -> None:
    """A trim takes a run only while its call log holds nothing beyond the row judged; a run left is reported.

    As for a prune: after the judgement one run gains a record of a newer segment, another
    a record of its own segment past what its row accounts for (two). Both keep every
    checkpoint and are named in `refused`; the untouched run in the same batch is trimmed.
    """
    _, flow = _ids()
    if not await _trimming(store, flow):
        return
    ahead, more, still = [await _long_run(store, flow, "done", 100.0 + i) for i in range(3)]
    then = {run_id: judged_row(await store.latest(run_id), {0: 2}) for run_id in (ahead, more, still)}
    await store.record_call(ahead, _call(ahead, 9, 0, "done"))
    await store.record_call(more, _call(more, 0, 2, "done"))
    trimmed = await retention.trim(store, [ahead, more, still], CUT_OFF, ENDED, judged=then)
    _expect(trimmed.run_ids == (still,), f"trim took {list(trimmed.run_ids)}, expected only {still}")
    _expect(
        set(dict(trimmed.refused)) == {ahead, more},
        f"trim did not report the runs whose log went on past the row judged ({ahead}, {more}): {trimmed.refused}",
    )
    for run_id in (ahead, more):
        kept = [cp.step for cp in await store.history(run_id)]
        _expect(kept == list(range(STEPS)), f"run {run_id}, whose log went on past its judged row, holds {kept}")


async def check_trim_leaves_a_run_with_a_live_cancel_request(store: CheckpointStore) -> None:
    """A trim leaves a run while a cancel request for it is live (a marker ``cancel/<run>``), and takes it after."""
    _, flow = _ids()
    if not await _trimming(store, flow):
        return
    run_id = await _long_run(store, flow, "done", 100.0)
    judged = {run_id: judged_row(await store.latest(run_id))}
    await store.put_marker(f"cancel/{run_id}", "a request", "t-cancel", 60.0)
    trimmed = await retention.trim(store, [run_id], CUT_OFF, ENDED, judged=judged)
    _expect(not trimmed.run_ids, f"trim took run {run_id} while a cancel request for it was live")
    await store.take_marker(f"cancel/{run_id}", "t-cancel")
    trimmed = await retention.trim(store, [run_id], CUT_OFF, ENDED, judged=judged)
    _expect(trimmed.run_ids == (run_id,), f"trim did not take run {run_id} once its cancel request was gone")
