"""Conformance checks of retention: only old finished runs are pruned, each whole, none under a live lease.

None is pruned either once its newest row is not the row the caller judged (a save came after the judgement).

Each check takes a store and raises `AssertionError` naming the rule the store breaks;
`conformance` collects them into `CHECKS`. The checks go through `retention` (the store's
own `prunable` and `prune`, or the generic ones a store without them gets), so every store
is held to the same rules.

The runs a check prunes were saved, by their rows' ``saved_at``, in 1970 and the cut-off
is in 1970 too: other checks' runs (saved now) on a shared store are never taken, and no
check waits for time to pass.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Final

from agentflow._errors import CheckpointNotFound
from agentflow.exec.checkpoints import retention
from agentflow.exec.checkpoints._conformance.base import SEALER, _call, _expect, _expect_raises, _ids
from agentflow.exec.checkpoints.protocol import CheckpointStore
from agentflow.exec.checkpoints.records import ENDED, SealedCheckpoint, judged_row

#: The cut-off of every check: one hour into 1970.
CUT_OFF: Final = 3600.0
#: Who the checks prune as.
OWNER: Final = "conformance-prune@host:1"


def _old(run_id: str, step: int, flow: str, status: str, at: float) -> SealedCheckpoint:
    """A checkpoint saved at `at` seconds into 1970."""
    return SEALER.seal_checkpoint(run_id, step, flow, status, 0, at, {"step": step, "note": "ü ✓"})


async def _run(store: CheckpointStore, flow: str, status: str, at: float, calls: int = 2) -> str:
    """Store a run of two checkpoints (the second `status`, saved at `at`) and `calls` call records."""
    run_id = f"{_ids()[0]}-{status}"
    await store.save(run_id, 0, _old(run_id, 0, flow, "running", at - 1))
    records = [_call(run_id, 0, seq, "started" if seq % 2 == 0 else "done") for seq in range(calls)]
    await store.save_after_calls(run_id, 1, _old(run_id, 1, flow, status, at), records)
    return run_id


async def _expect_whole(store: CheckpointStore, run_id: str, calls: int, what: str) -> None:
    history, records = await store.history(run_id), await store.calls(run_id)
    _expect(
        [cp.step for cp in history] == [0, 1] and len(records) == calls,
        f"{what}: run {run_id} holds steps {[cp.step for cp in history]} and {len(records)} call records, "
        f"expected steps [0, 1] and {calls} records",
    )


async def _expect_gone(store: CheckpointStore, run_id: str, what: str) -> None:
    await _expect_raises(CheckpointNotFound, store.latest(run_id), f"{what}: latest of pruned run {run_id}")
    history, records = await store.history(run_id), await store.calls(run_id)
    _expect(not history and not records, f"{what}: pruned run {run_id} still has {len(history)} checkpoints "
            f"and {len(records)} call records")  # fmt: skip
    _expect(run_id not in await store.stored_runs(), f"{what}: stored_runs still names pruned run {run_id}")
    listed = {cp.run_id for cp in await store.list_runs(None, 100_000)}
    _expect(run_id not in listed, f"{what}: list_runs still names pruned run {run_id}")


def _mine(found: Sequence[str], mine: Sequence[str]) -> list[str]:
    return [run_id for run_id in found if run_id in mine]


async def check_prune_takes_only_old_finished_runs(store: CheckpointStore) -> None:
    """`prunable` lists the finished runs saved before the cut-off, oldest first; `prune` deletes them whole."""
    _, flow = _ids()
    ended = [await _run(store, flow, status, 100.0 + i) for i, status in enumerate(("cancelled", "done", "failed"))]
    unfinished = [await _run(store, flow, status, 50.0) for status in ("running", "paused")]
    recent = await _run(store, flow, "done", CUT_OFF + 10)
    mine = [*ended, *unfinished, recent]
    listed = _mine(await retention.prunable(store, CUT_OFF, ENDED, 100_000), mine)
    _expect(listed == ended, f"prunable listed {listed}, expected the old finished runs oldest first {ended}")
    failed = _mine(await retention.prunable(store, CUT_OFF, {"failed"}, 100_000), mine)
    _expect(failed == ended[2:], f"prunable of failed runs listed {failed}, expected {ended[2:]}")
    pruned = await retention.prune(store, list(reversed(mine)), CUT_OFF, ENDED, OWNER)
    _expect(
        pruned.run_ids == tuple(reversed(ended)),
        f"prune deleted {list(pruned.run_ids)}, expected the old finished runs {ended[::-1]} in the order asked",
    )
    _expect(pruned.rows == 12, f"prune counted {pruned.rows} rows, expected 12 (2 checkpoints, 2 records each)")
    for run_id in ended:
        await _expect_gone(store, run_id, "after a prune")
    for run_id in [*unfinished, recent]:
        await _expect_whole(store, run_id, 2, "a running, paused or recent run after a prune")


async def check_prune_refuses_runs_that_have_not_ended(store: CheckpointStore) -> None:
    """A prune asked to take running or paused runs refuses (ValueError), and deletes nothing."""
    _, flow = _ids()
    run_id = await _run(store, flow, "running", 100.0)
    for statuses in ({"running"}, {"done", "paused"}, set()):
        await _expect_raises(
            ValueError, retention.prunable(store, CUT_OFF, statuses, 10), f"prunable of statuses {statuses}"
        )
        await _expect_raises(
            ValueError, retention.prune(store, [run_id], CUT_OFF, statuses, OWNER), f"prune of statuses {statuses}"
        )
    await _expect_whole(store, run_id, 2, "after refused prunes")


async def check_prune_leaves_a_held_run(store: CheckpointStore) -> None:
    """A run a live lease holds is neither listed nor pruned; once the lease is given up, it is pruned."""
    _, flow = _ids()
    run_id = await _run(store, flow, "failed", 100.0)
    token = f"token-{uuid.uuid4().hex}"
    await store.take_lease(run_id, "a worker retrying it", token, 60.0)
    listed = _mine(await retention.prunable(store, CUT_OFF, ENDED, 100_000), [run_id])
    _expect(not listed, "prunable listed a run a live lease holds")
    pruned = await retention.prune(store, [run_id], CUT_OFF, ENDED, OWNER)
    _expect(not pruned.run_ids, "prune deleted a run a live lease holds")
    await _expect_whole(store, run_id, 2, "a held run after a prune")
    _expect(run_id in await store.leases([run_id]), "a prune took away the lease of the run it left alone")
    await store.release_lease(run_id, token)
    pruned = await retention.prune(store, [run_id], CUT_OFF, ENDED, OWNER)
    _expect(pruned.run_ids == (run_id,), "prune did not delete the run once its lease was given up")
    _expect(not await store.leases([run_id]), "a pruned run still shows a lease")


async def check_prune_judges_each_run_again(store: CheckpointStore) -> None:
    """A run that moved on after it was listed (a retry's claim saved) is kept; unknown ids are skipped."""
    _, flow = _ids()
    run_id = await _run(store, flow, "failed", 100.0)
    listed = _mine(await retention.prunable(store, CUT_OFF, ENDED, 100_000), [run_id])
    _expect(listed == [run_id], f"prunable listed {listed}, expected the failed run")
    await store.save(run_id, 2, _old(run_id, 2, flow, "running", 200.0))  # a retry's claim
    pruned = await retention.prune(store, [run_id, f"{run_id}-unknown"], CUT_OFF, ENDED, OWNER)
    _expect(not pruned.run_ids, f"prune deleted {list(pruned.run_ids)}: the run was retried after it was listed")
    history = [cp.step for cp in await store.history(run_id)]
    _expect(history == [0, 1, 2], f"a retried run holds steps {history} after a prune, expected [0, 1, 2]")


async def check_pruned_run_id_starts_afresh(store: CheckpointStore) -> None:
    """After a prune nothing of the run is left: its id takes a step 0 again, with no old row or lease."""
    _, flow = _ids()
    run_id = await _run(store, flow, "done", 100.0, calls=4)
    pruned = await retention.prune(store, [run_id], CUT_OFF, ENDED, OWNER)
    _expect(pruned.run_ids == (run_id,) and pruned.rows == 6, f"prune of a done run returned {pruned}")
    fresh = _old(run_id, 0, flow, "running", CUT_OFF + 100)
    await store.save(run_id, 0, fresh)
    history, records = list(await store.history(run_id)), list(await store.calls(run_id))
    _expect(history == [fresh] and not records, "a run id started again after a prune sees rows of the pruned run")


async def check_prune_limit_and_cut_off(store: CheckpointStore) -> None:
    """`prunable` returns at most `limit` runs, oldest first, and none saved at or after the cut-off."""
    _, flow = _ids()
    runs = [await _run(store, flow, "done", 100.0 + i, calls=0) for i in range(4)]
    first = _mine(await retention.prunable(store, CUT_OFF, ENDED, 2), runs)
    _expect(first == runs[:2], f"prunable with limit 2 listed {first}, expected the two oldest {runs[:2]}")
    early = _mine(await retention.prunable(store, 101.0, ENDED, 100_000), runs)
    _expect(early == runs[:1], f"prunable with the cut-off at 101 s listed {early}, expected only {runs[:1]}")
    pruned = await retention.prune(store, runs, 102.0, ENDED, OWNER)
    _expect(pruned.run_ids == tuple(runs[:2]), f"prune with the cut-off at 102 s deleted {list(pruned.run_ids)}")


async def check_prune_takes_only_the_judged_row(store: CheckpointStore) -> None:
    """Given the rows judged, a prune deletes a run only while its newest row is the judged one (step and signature).

    The run moved on after it was judged: a retry's claim, then a second failure, both saved
    in 1970, so what the store keeps in clear still says "failed, long before the cut-off";
    only the newest row itself is not the judged one. A run judged at its newest row, in the
    same batch, goes; so does the moved run once its new newest row is the one judged.
    """
    _, flow = _ids()
    moved, still = await _run(store, flow, "failed", 100.0), await _run(store, flow, "done", 101.0)
    then = {run_id: judged_row(await store.latest(run_id)) for run_id in (moved, still)}
    await store.save(moved, 2, _old(moved, 2, flow, "running", 150.0))  # a retry's claim
    await store.save(moved, 3, _old(moved, 3, flow, "failed", 160.0))  # and it failed again, long ago too
    pruned = await retention.prune(store, [moved, still], CUT_OFF, ENDED, OWNER, judged=then)
    _expect(
        pruned.run_ids == (still,),
        f"prune given the rows judged deleted {list(pruned.run_ids)}, expected only {still}: run {moved} saved "
        "steps 2 and 3 after its step 1 was judged",
    )
    history = [cp.step for cp in await store.history(moved)]
    _expect(history == [0, 1, 2, 3], f"a run saved again after it was judged holds steps {history} after a prune")
    await _expect_gone(store, still, "a run whose judged row was still its newest")
    newest = await store.latest(moved)
    for wrong, what in (({}, "no row judged for it"), ({moved: (3, "0" * 64)}, "its step 3 judged with another sig")):
        pruned = await retention.prune(store, [moved], CUT_OFF, ENDED, OWNER, judged=wrong)
        _expect(not pruned.run_ids, f"prune deleted run {moved} with {what}")
    pruned = await retention.prune(store, [moved], CUT_OFF, ENDED, OWNER, judged={moved: judged_row(newest)})
    _expect(pruned.run_ids == (moved,), f"prune did not delete run {moved} once its newest row was the one judged")
    await _expect_gone(store, moved, "a run pruned at the row judged")


async def check_prune_leaves_a_run_that_went_on(store: CheckpointStore) -> None:
    """A prune deletes a run only while its call log holds nothing beyond the row judged; a run left is reported.

    Three runs ended in 1970, each judged at its newest row (segment 0, two records, which
    the row accounts for). Then one gains a record of a newer segment (segment 9: opened by
    a claim the store no longer shows) and one a third record of segment 0 (written after
    the row). Neither goes, with the row judged or with none; each is named in the
    prune's `refused` with why. The untouched run, in the same batch, goes.
    """
    _, flow = _ids()
    ahead, more, still = [await _run(store, flow, "failed", 100.0 + i) for i in range(3)]
    then = {run_id: judged_row(await store.latest(run_id), {0: 2}) for run_id in (ahead, more, still)}
    await store.record_call(ahead, _call(ahead, 9, 0, "done"))
    await store.record_call(more, _call(more, 0, 2, "done"))
    pruned = await retention.prune(store, [ahead, more, still], CUT_OFF, ENDED, OWNER, judged=then)
    _expect(pruned.run_ids == (still,), f"prune deleted {list(pruned.run_ids)}, expected only {still}")
    why = dict(pruned.refused)
    _expect(
        set(why) == {ahead, more} and "segment 9" in why[ahead] and "segment 0" in why[more],
        f"prune did not report the runs whose log went on past the row judged ({ahead}: segment 9, {more}: "
        f"segment 0): it reported {why}",
    )
    await _expect_whole(store, ahead, 3, "a run with a record of a segment newer than its judged row")
    await _expect_whole(store, more, 3, "a run with more records than its judged row accounts for")
    await _expect_gone(store, still, "a run with nothing beyond its judged row")
    alone = await retention.prune(store, [ahead], CUT_OFF, ENDED, OWNER)  # judged by the store alone
    _expect(not alone.run_ids, f"prune with no rows judged deleted run {ahead}, whose log holds a newer segment")
    await _expect_whole(store, ahead, 3, "a run with a record of a newer segment, pruned with no rows judged")


async def check_prune_takes_a_run_with_a_late_earlier_record(store: CheckpointStore) -> None:
    """A late record in a segment older than the judged row's does not keep an ended run from a prune.

    A run's worker logged a call ``started`` in segment 0 and was cut off; a claim (segment 1)
    took the run over and ended it. Then the cut-off worker stored its call's late ``done`` in
    segment 0, as a fenced worker may. The run did not go on past its ended row (after an
    ended row a run goes on only through a claim, which opens a newer segment), so it goes.
    """
    _, flow = _ids()
    run_id = f"{_ids()[0]}-late"
    await store.save(run_id, 0, _old(run_id, 0, flow, "running", 99.0))
    await store.record_call(run_id, _call(run_id, 0, 0, "started"))
    await store.save(run_id, 1, SEALER.seal_checkpoint(run_id, 1, flow, "running", 1, 99.5, {"step": 1}))
    await store.save(run_id, 2, SEALER.seal_checkpoint(run_id, 2, flow, "done", 1, 100.0, {"step": 2}))
    await store.record_call(run_id, _call(run_id, 0, 1, "done"))
    newest = await store.latest(run_id)
    pruned = await retention.prune(store, [run_id], CUT_OFF, ENDED, OWNER, judged={run_id: judged_row(newest, {1: 0})})
    _expect(
        pruned.run_ids == (run_id,),
        f"prune left run {run_id}, whose only record past its pins is a late one of an earlier segment: "
        f"{dict(pruned.refused)}",
    )
    await _expect_gone(store, run_id, "a run with a late record of an earlier segment")


async def check_prune_leaves_a_run_with_a_live_cancel_request(store: CheckpointStore) -> None:
    """A prune leaves a run while a cancel request for it is live (a marker ``cancel/<run>``), and takes it after."""
    _, flow = _ids()
    run_id = await _run(store, flow, "done", 100.0)
    judged = {run_id: judged_row(await store.latest(run_id))}
    await store.put_marker(f"cancel/{run_id}", "a request", "t-cancel", 60.0)
    pruned = await retention.prune(store, [run_id], CUT_OFF, ENDED, OWNER, judged=judged)
    _expect(not pruned.run_ids, f"prune deleted run {run_id} while a cancel request for it was live")
    await _expect_whole(store, run_id, 2, "a run with a live cancel request")
    await store.take_marker(f"cancel/{run_id}", "t-cancel")
    pruned = await retention.prune(store, [run_id], CUT_OFF, ENDED, OWNER, judged=judged)
    _expect(pruned.run_ids == (run_id,), f"prune did not delete run {run_id} once its cancel request was gone")
