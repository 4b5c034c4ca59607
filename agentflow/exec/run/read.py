"""Read a stored run into the read model (`agentflow.exec.run.view`), checking every row first.

Two stages:
1. `_check_rows`: every checkpoint is opened with `Sealer.open_checkpoint` (signature,
   numbering, segment) and the call log with `read_log` (signatures, numbering); then the
   log is held against the latest checkpoint with the same checks recovery makes
   (`agentflow.exec.run.checks`), and against what every older checkpoint saw and pinned.
   No row is decoded before its signature checks.
2. The views (segments, calls and their states, recoveries, identity, state) are built
   only when stage 1 found nothing wrong (`agentflow.exec.run._fill`).

Who did what comes from the checked bodies only (`run.control.control_of`: who saved each
checkpoint, who decided each claim); whether a worker holds the run now comes from the
store's lease, read before and after the rows (a run held at either read is shown as
held: a call it logs as started is running there, not in doubt). Of a held run, the calls
waiting for a shared limit come from its event stream (`run.waits`): such a call has no
record in the log yet. Of a running run, a wait for the store's durability comes from the
marker its worker left when the store could not confirm a write (`run.store_waits`).

A run that retention trimmed (`agentflow.exec.run.trim`) has a history that starts at
the ended checkpoint the trim kept: its rows are checked from there, and the report says
where it starts (`RunReport.kept_from`) instead of reporting the older checkpoints missing.

Problems are collected, not raised, so a listing can show a corrupt run next to healthy
ones; the `RunReport` of a corrupt run then carries no data read from that run at all. A
run deleted (pruned) while it was read is reported gone, not corrupt: a reader sees a run
whole or not at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from agentflow._errors import CheckpointNotFound, CheckpointStoreCorrupt
from agentflow._run_types import RunKind
from agentflow.exec.calls.read import LoggedRecord, read_log
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.checkpoints.records import UNREADABLE, Lease, SealedCheckpoint, is_unreadable
from agentflow.exec.run import view as v
from agentflow.exec.run._fill import Body, fill, superstep_of
from agentflow.exec.run.checks import AheadOfCheckpoint, check_held, check_records, counts_of
from agentflow.exec.run.control import parked
from agentflow.exec.run.lease import held_by
from agentflow.exec.run.store_waits import read_store_wait
from agentflow.exec.run.sweep import forgotten
from agentflow.exec.run.trim import kept_from
from agentflow.exec.run.view import RunHead
from agentflow.exec.run.waits import read_limit_waits
from agentflow.exec.seal import Sealer

#: How many runs ``verify --all`` and a full listing read at most.
ALL_RUNS: Final = 1_000_000
#: How `Sealer` says that a row names a key id the ring does not hold.
UNKNOWN_KEY: Final = "which this worker does not have"
#: How often a run that moves on while it is read is read again.
_READS: Final = 3

# --- stage 1: the row checks -------------------------------------------------------------


async def _check_rows(
    store: CheckpointStore, sealer: Sealer, run_id: str, rows: Sequence[SealedCheckpoint]
) -> tuple[list[Body | None], list[LoggedRecord], list[str], bool]:
    """Check every row of a run: its checkpoints, then its call log against them.

    Returns:
        The opened body of each checkpoint (None where it failed), the checked call
        records, every problem found (each naming its row), and whether the log holds
        records past the latest checkpoint (removed checkpoints, or a run that moved on).

    Raises:
        CheckpointError: the store failed while reading the log.
    """
    problems: list[str] = []
    bodies = _open_history(sealer, run_id, rows, problems)
    records, ahead = await _open_log(store, sealer, run_id, bodies, problems, kept_from(rows))
    return bodies, records, problems, ahead


def _open_history(
    sealer: Sealer, run_id: str, rows: Sequence[SealedCheckpoint], problems: list[str]
) -> list[Body | None]:
    """Check each checkpoint row, its place in the numbering and its segment."""
    bodies: list[Body | None] = []
    expected = kept_from(rows)  # 0, or where a retention trim cut (an ended checkpoint)
    segment = rows[0].segment if expected else 0
    for row in rows:
        if row.step != expected:
            problems.append(f"checkpoint {expected} of run {run_id!r} is missing (the next one stored is {row.step})")
        expected = row.step + 1
        try:
            body: Body | None = sealer.open_checkpoint(row, run_id)
        except CheckpointStoreCorrupt as exc:
            problems.append(str(exc))
            body = None
        if body is not None and row.segment not in (segment, row.step):
            problems.append(
                f"checkpoint {row.step} of run {run_id!r}: segment {row.segment} is neither the previous "
                f"segment ({segment}) nor a claim at this step"
            )
        segment = row.segment
        bodies.append(body)
    return bodies


async def _open_log(
    store: CheckpointStore, sealer: Sealer, run_id: str, bodies: list[Body | None], problems: list[str], first: int
) -> tuple[list[LoggedRecord], bool]:
    """Read and check the call log: the checks every reader makes of the latest checkpoint, and more.

    The latest checkpoint gets exactly the checks recovery, resume and a handoff make
    (`check_records`: its marker, its pins, nothing past it); every older one, what it saw
    and pinned of the log (`check_held`). A run's rows are checked only when every
    checkpoint opened, so a body here is a checked one.
    """
    try:
        records = await read_log(store, sealer, run_id)
    except CheckpointStoreCorrupt as exc:
        problems.append(str(exc))
        return [], False
    if not bodies or any(b is None for b in bodies):
        return records, False
    counts = counts_of(records)
    ahead = False
    last = first + len(bodies) - 1  # `first`: the step the stored history starts at (0 unless trimmed)
    for step, body in enumerate(bodies, first):
        assert body is not None
        try:
            if step < last:
                check_held(run_id, step, body, counts)
                continue
            at = superstep_of(body)
            lead = RunKind.of_body(body).model_ahead
            check_records(run_id, step, body, records, at if at is not None else 0, model_ahead=lead)
        except CheckpointStoreCorrupt as exc:
            problems.append(str(exc))
            ahead = ahead or isinstance(exc, AheadOfCheckpoint)
    return records, ahead


def _unknown(row: SealedCheckpoint, problem: str) -> bool:
    """Whether `problem` says that no key of the ring has the key id `row` names."""
    return problem.startswith(f"checkpoint {row.step} ") and f"key id {row.kid!r}, {UNKNOWN_KEY}" in problem


def _bare(row: SealedCheckpoint, problems: list[str]) -> v.CheckpointView:
    """A row of a corrupt run: its position and its own problem, none of its fields (they are unproven)."""
    own = next((p for p in problems if p.startswith(f"checkpoint {row.step} ")), None)
    return v.CheckpointView(row.step, 0.0, "", -1, None, "", own)


# --- the entry points ---------------------------------------------------------------------


async def read_run(store: CheckpointStore, sealer: Sealer, run_id: str) -> v.RunReport:
    """Read and check one run, whether a live worker holds it, and if one does, which calls wait for a limit.

    Raises:
        CheckpointNotFound: nothing is stored for `run_id`.
        CheckpointError: the store failed (unreachable, or a row it cannot even read).
    """
    before = await store.leases([run_id])
    report = await _read_rows(store, sealer, run_id)
    _held(report, before, await store.leases([run_id]))
    if report.lease is not None and report.status == "running" and not report.corrupt:
        report.waiting_for_limit = await read_limit_waits(store, sealer, run_id)
    if report.status == "running" and not report.corrupt:
        report.waiting_for_store = await read_store_wait(store, sealer, run_id, report.step)
    return report


def _held(report: v.RunReport, before: Mapping[str, Lease], after: Mapping[str, Lease]) -> None:
    """Set the run's lease: the one live after its rows were read, else the one live before."""
    report.lease = after.get(report.run_id) or before.get(report.run_id)


async def _read_rows(store: CheckpointStore, sealer: Sealer, run_id: str) -> v.RunReport:
    """Read and check one run's rows (`read_run` without the lease)."""
    for _ in range(_READS):
        rows = list(await store.history(run_id))
        if not rows:
            raise CheckpointNotFound(f"no run {run_id!r} in this store")
        last = rows[-1]
        report = v.RunReport(run_id, last.flow, RunKind.of(last.flow), last.status, last.step, last.saved_at)
        report.kept_from = kept_from(rows)
        bodies, records, report.problems, ahead = await _check_rows(store, sealer, run_id, rows)
        # Records past the latest checkpoint read: removed checkpoints, or a live run that moved
        # on between the two reads. Read it again; only what persists is reported.
        if not ahead or (await store.latest(run_id)).step == last.step:
            break
    if report.problems:
        await _still_stored(store, run_id)
        report.checkpoints = [_bare(row, report.problems) for row in rows]
        report.other_keys = sorted({row.kid for row in rows if any(_unknown(row, p) for p in report.problems)})
        return report
    checked = [b for b in bodies if b is not None]
    try:
        fill(report, rows, checked, records)
    except CheckpointStoreCorrupt as exc:  # the log folds into something no worker writes
        report.problems.append(str(exc))
        report.checkpoints = [_bare(row, report.problems) for row in rows]
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        # Signed with our key, but not shaped like any body agentflow writes.
        report.problems.append(f"run {run_id!r}: a checked row does not have the expected fields ({exc!r})")
        report.checkpoints = [_bare(row, report.problems) for row in rows]
    return report


async def _still_stored(store: CheckpointStore, run_id: str) -> None:
    """Raise `CheckpointNotFound` if the run is gone now: it was deleted (pruned) while it was read.

    The checkpoints and the call log are two reads; a run deleted between them reads as
    checkpoints without their log. Such a run is reported gone, not corrupt: a reader sees
    a run whole or not at all.
    """
    try:
        await store.latest(run_id)
    except CheckpointNotFound:
        raise CheckpointNotFound(f"no run {run_id!r} in this store (deleted while it was read)") from None


async def read_runs(
    store: CheckpointStore, sealer: Sealer, flow: str | None = None, limit: int = ALL_RUNS
) -> list[v.RunReport]:
    """Read and check the latest `limit` runs (of one ``flow`` column, or all), newest first, with their leases."""
    listed = list(await store.list_runs(flow, limit))
    before = await held_by(store, [row.run_id for row in listed])
    reports = []
    for row in listed:
        try:
            reports.append(await _read_rows(store, sealer, row.run_id))
        except CheckpointNotFound:
            continue  # deleted since it was listed
        except CheckpointStoreCorrupt as exc:  # a row the store cannot decode: this run is bad, the next may not be
            reports.append(unreadable_report(row.run_id, str(exc)))
    after = await held_by(store, [rep.run_id for rep in reports])
    for report in reports:
        _held(report, before, after)
    return reports


def unreadable_report(run_id: str, why: str) -> v.RunReport:
    """The report of a run one of whose rows the store cannot decode at all: its problem, and nothing else."""
    return v.RunReport(run_id, "", RunKind.FLOW, UNREADABLE, 0, 0.0, problems=[why])


def signed_with_other_keys(reports: Sequence[v.RunReport]) -> bool:
    """Whether some runs failed, and only because no key of the ring signed their rows (a wrong key)."""
    problems = [p for rep in reports for p in rep.problems]
    return bool(problems) and all(UNKNOWN_KEY in p for p in problems)


async def read_all(store: CheckpointStore, sealer: Sealer) -> list[v.RunReport]:
    """Every run of the store, checked: the listed ones, then the ones the listing index forgot.

    The listing index is unsigned, so it is held against the stored rows themselves
    (`CheckpointStore.stored_runs`): a run with rows and no listing entry was hidden from
    listings and from `recover_all`, and is reported as a problem of its own (with no data
    shown, like any run with a problem).
    """
    reports = await read_runs(store, sealer, None, ALL_RUNS)
    for run_id in await forgotten(store):
        try:
            found = await read_run(store, sealer, run_id)
        except CheckpointNotFound:
            continue  # deleted since the scan
        except CheckpointStoreCorrupt as exc:
            found = unreadable_report(run_id, str(exc))
        problem = (
            f"run {run_id!r} has stored rows but is missing from the store's listing index (deleted behind "
            "the store's back?): listings and recover_all do not see it; recover_all(sweep=True) lists it again"
        )
        rows = [v.CheckpointView(c.step, 0.0, "", -1, None, "", c.problem) for c in found.checkpoints]
        reports.append(
            v.RunReport(
                run_id,
                found.flow,
                found.kind,
                found.status,
                found.step,
                found.saved_at,
                problems=[problem, *found.problems],
                checkpoints=rows,
                other_keys=found.other_keys,
            )  # fmt: skip
        )
    return reports


# --- heads: what a listing needs, from the latest checkpoint alone --------------------------


async def read_heads(
    store: CheckpointStore, sealer: Sealer, flow: str | None = None, limit: int = 50, offset: int = 0
) -> list[RunHead]:
    """Read and check the latest checkpoint of up to `limit` runs, newest first, after skipping `offset`.

    One listing of the store (`CheckpointStore.list_runs`), one signature check per run:
    no history and no call log is read, so a page of a listing costs the same however long
    its runs are. (The store still hands over the `offset` runs skipped.)
    """
    heads: list[RunHead] = []
    rows = list(await store.list_runs(flow, offset + limit))[offset:]
    live = await held_by(store, [row.run_id for row in rows])
    for row in rows:
        if is_unreadable(row):  # the store could not decode its newest row (`records.unreadable`)
            heads.append(RunHead(row.run_id, "", "", 0, 0.0, -1, row.payload.decode(errors="replace")))
            continue
        try:
            body = sealer.open_checkpoint(row, row.run_id)
        except CheckpointStoreCorrupt as exc:
            other = row.kid if _unknown(row, str(exc)) else None
            heads.append(RunHead(row.run_id, "", "", row.step, 0.0, -1, str(exc), other_key=other))
            continue
        lease = live.get(row.run_id)
        waiting = row.status == "running" and parked(body)
        heads.append(
            RunHead(row.run_id, row.flow, row.status, row.step, row.saved_at, row.segment, lease=lease, waiting=waiting)
        )
    return heads
