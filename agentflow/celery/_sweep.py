"""The body of recover_all's sweep: read every unfinished run once and sort it (see `Worker.stranded`).

For each unfinished run of the app's flows and tool loops, its latest checkpoint is read
and checked, and the run goes into one of:
- held by a live worker: left alone (on a worker's start, its own recheck is due when the lease ends);
- paused with a signed timer that is due (a `Wait`, or an approval's deadline): to be woken;
- paused for an approval, or parked on calls in doubt: waits for a person (counted), unless
  none of its calls is in doubt any more (a late ``done``): then it is stranded;
- on a flow version this worker's app lacks: needs migration (listed and counted, never
  enqueued: no worker here could move it, and a message per sweep would pile up in a
  queue nobody reads);
- running, idle longer than `stale_after_s`: stranded, to be recovered (unless a recovery went
  out for the same step less than a back-off ago: held back, `_resends`; never on a worker's
  start, which trusts no marker that says a message is on its way: the worker that took that
  message may be the one that died);
- running, nobody holding it, saved less than `stale_after_s` ago: a handoff in flight, left
  alone; on a worker's start, a recovery is sent for the moment it counts as stranded
  (`Stranded.later`): its next message may be one a worker that died had taken and not
  started, which the broker keeps from everyone for its visibility timeout;
- failing its check: quarantined (reported once).
The caller holds the recover_all lease.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from agentflow._errors import CheckpointNotFound, CheckpointStoreCorrupt
from agentflow._run_types import RunKind, version_of
from agentflow.celery._stranded import Stranded, Waiting
from agentflow.exec.calls.read import fold, read_log
from agentflow.exec.checkpoints.records import Lease, SealedCheckpoint
from agentflow.exec.run.control import parked
from agentflow.exec.run.lease import held_by
from agentflow.exec.run.quarantine import Reporter
from agentflow.exec.run.steps import started_of
from agentflow.exec.run.sweep import relist_forgotten
from agentflow.exec.run.timers import a_child_ended, due_at, wake_of

if TYPE_CHECKING:
    from agentflow.celery.worker import Worker

log = logging.getLogger("agentflow.celery.worker")


async def relisted(worker: Worker, columns: list[str]) -> list[str]:
    """Relist the runs the listing index forgot; return those of flows the app does not know."""
    others: list[str] = []
    for lost in await relist_forgotten(worker.store, worker.sealer, columns):
        log.warning(
            "run %s was missing from the store's listing index: %s",
            lost.run_id,
            lost.why,
            extra={"run_id": lost.run_id},
        )
        others += [] if lost.relisted or lost.flow in columns else [lost.run_id]
    return others


async def sweep(worker: Worker, startup: bool) -> Stranded:
    """Sort every unfinished run of the worker's flows and loops (see the module docstring)."""
    store, settings = worker.store, worker.settings
    sorter = _Sorter(worker, startup)
    columns = [*worker.flow_app.flows, *(RunKind.LOOP.column(n) for n in worker.loops)]
    others = await relisted(worker, columns) if settings.sweep_forgotten else []
    for name in columns:
        run_ids = list(await store.list_unfinished(name))
        held = await held_by(store, run_ids)
        for run_id in run_ids:
            await sorter.one(name, run_id, held.get(run_id))
    found, reports = sorter.found, sorter.reports
    await reports.moving([run_id for _, run_id, _, _ in found.recover])
    await worker.resends.hold_back(found, sorter.now, startup)
    await reports.unknown_flows(columns, others, sorter.now - settings.stale_after_s)
    found.quarantined, found.unknown = reports.quarantined, reports.unknown
    if found.migrate:
        log.warning(
            "%d unfinished run(s) are on flow versions this worker does not have and need migration "
            "(or a worker with their version): %s",
            len(found.migrate),
            ", ".join(sorted({f"{flow} version {version}" for flow, _, version in found.migrate})),
        )
    waiting = sorter.waiting
    worker.events.emit("runs.swept", None, waiting=waiting.report(columns), unfinished=waiting.ages(columns))
    return found


class _Sorter:
    """One sweep's findings, one run at a time."""

    def __init__(self, worker: Worker, startup: bool) -> None:
        self.worker, self.startup = worker, startup
        self.now = time.time()
        self.found = Stranded()
        self.waiting = Waiting(self.now)
        self.reports = Reporter(worker.store, worker.sealer, worker.runner.events, worker.owner, log)

    async def _due(self, body: dict[str, Any]) -> bool:
        """Whether a paused run's timer is due now (a parent waiting for children: once one of them ended)."""
        wake = wake_of(body)
        if wake is None or wake["for"] != "child":
            return True
        try:
            return await a_child_ended(self.worker.store, self.worker.sealer, wake)
        except CheckpointStoreCorrupt:
            return False  # a child's row fails its check: the child is reported on its own

    async def _still_in_doubt(self, run_id: str) -> bool:
        """Whether a parked run still has a call in doubt (its log is read: parked runs are few).

        A worker stalled past its lease can log a call's ``done`` after another worker parked
        the run on that call (fencing stops new calls, not the end of one in flight): the
        run then waits for nobody, and is recovered like any stranded run. A log that fails
        its check keeps the run waiting for a person.
        """
        try:
            records = await read_log(self.worker.store, self.worker.sealer, run_id)
        except CheckpointStoreCorrupt:
            return True
        return any(state.in_doubt for state in fold(records).values())

    async def one(self, name: str, run_id: str, lease: Lease | None) -> None:
        """Sort one unfinished run of flow (or loop column) `name`; `lease` is its live lease, if any."""
        worker, found, waiting = self.worker, self.found, self.waiting
        try:
            row = await worker.store.latest(run_id)
        except CheckpointNotFound:
            return  # deleted meanwhile
        try:
            body: dict[str, Any] | None = worker.sealer.open_checkpoint(row, run_id)
            problem = ""
        except CheckpointStoreCorrupt as exc:
            body, problem = None, str(exc)
        if body is not None:
            waiting.unfinished(name, started_of(body))
        if lease is not None:
            if self.startup:
                # A worker's start sends its own recheck, whoever set the marker: the marker's setter
                # may have died with its delayed message unacked (held for an hour), and a start is
                # rare enough that its one message per held run costs nothing. It still sets the
                # marker when free, so the duplicates of this lease send no more.
                ends = worker.lease_ends(lease.expires_at)
                await worker.watch(run_id, ends)
                found.recheck.append((name, run_id, row.step, ends))
            return
        app = worker.flow_app
        if body is not None and name in app.versions and not app.has_version(name, version_of(body)):
            found.migrate.append((name, run_id, version_of(body)))
            waiting.add(name, "migration", row.saved_at)
            return
        wake = due_at(row, body) if body is not None else None
        if wake is not None and wake <= self.now and await self._due(body or {}):
            found.wake.append((name, run_id, row.step, version_of(body or {})))
            return
        if row.status == "paused" and (body is None or (body.get("wake") or {}).get("for") in (None, "approval")):
            waiting.add(name, "approval", row.saved_at)  # a `Wait` or a parent waiting for its child waits for no one
        if row.status == "running":
            await self._running(name, row, body, problem)

    async def _running(self, name: str, row: SealedCheckpoint, body: dict[str, Any] | None, problem: str) -> None:
        """Sort a running run nobody holds: stranded, waiting for a person, in flight, or (on a start) due later.

        `body` is its latest checkpoint opened (None: it fails its check, for `problem`).
        """
        stale_at = row.saved_at + self.worker.settings.stale_after_s
        stale = self.now >= stale_at
        if not stale and not self.startup:
            return  # a handoff in flight
        if body is None:
            if stale:  # reported once it is stale, as before
                await self.reports.failed(row, problem)
        elif parked(body) and await self._still_in_doubt(row.run_id):
            if stale:
                self.waiting.add(name, "in_doubt", row.saved_at)
        elif not stale:  # on a worker's start: its next message may have died with a worker that had taken it
            self.found.later.append((name, row.run_id, row.step, version_of(body), stale_at))
        else:
            self.found.recover.append((name, row.run_id, row.step, version_of(body)))
