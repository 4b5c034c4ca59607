"""Runs recover_all reported once and leaves alone: a marker kept in the store's leases.

`recover_all` (`agentflow.celery.worker.Worker.stranded`) finds two kinds of unfinished
runs it cannot move: one whose latest checkpoint fails its check (``quarantined``: a
changed row, or a run signed with a key the workers do not hold) and one whose flow the
workers' app does not know (``unknown-flow``). Each is reported once (a WARNING and an
event), then remembered with a marker so the next ticks, on whichever worker beat sends
them to, neither report it again nor enqueue it.

The marker is the signed marker ``<why>/<run_id>`` (`agentflow.exec.run.markers`), set for
`MARK_TTL_S`:
- every store shares markers between all workers and puts them atomically, so of two
  workers that find the run at once exactly one reports it;
- a marker lapses on its own: one left behind (the run deleted, or finished by someone
  else) is gone after a week, and a run still stuck then is reported again;
- it is signed: a quarantine marker written into the store by hand does not count, so it
  can neither hide a run from recover_all nor make `agentflow verify` say it was reported.

An operator releases a quarantined run by acting on it: once its rows check again (the
signing key added to the workers' ring) `recover_all` recovers it and removes the marker;
a deleted run is never listed again. `agentflow verify` shows the marker of a run it
finds failing. `release` removes a marker by hand.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from agentflow._errors import CheckpointNotFound, CheckpointStoreCorrupt
from agentflow._events import Events
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.checkpoints.records import UNFINISHED, SealedCheckpoint
from agentflow.exec.run.lease import held_by
from agentflow.exec.run.markers import Markers, Note
from agentflow.exec.seal import Sealer

#: The latest checkpoint fails its check: the run is not recovered until it checks again.
QUARANTINED: Final = "quarantined"
#: The run's flow is not in the workers' app: no worker can move it.
UNKNOWN_FLOW: Final = "unknown-flow"
#: How long a marker lasts (then a run still stuck is reported again).
MARK_TTL_S: Final = 7 * 24 * 3600.0
#: The longest each kind of marker here lasts (`Markers`' ``longest``).
LONGEST: Final = {QUARANTINED: MARK_TTL_S, UNKNOWN_FLOW: MARK_TTL_S}
#: How many of the store's newest runs `stranded_elsewhere` looks through.
SCAN: Final = 1000


def _fields(row: SealedCheckpoint) -> dict[str, object]:
    """The structured fields of a log line about the run of `row` (``extra=``)."""
    return {"run_id": row.run_id, "step": row.step, "segment": row.segment}


async def marks(markers: Markers, run_ids: Sequence[str], why: str) -> Mapping[str, Note]:
    """The markers of `why` that count among `run_ids`, by run id."""
    return await markers.peek(why, run_ids)


async def mark(markers: Markers, run_id: str, why: str, owner: str) -> bool:
    """Set the run's marker unless one is live; return whether this call set it (then report the run)."""
    return (await markers.put(why, run_id, {"owner": owner}, MARK_TTL_S))[0]


async def release(markers: Markers, run_id: str, why: str) -> bool:
    """Remove the run's marker of `why`, if any; return whether one was removed."""
    return bool(await markers.take_all(why, [run_id]))


async def unmark(markers: Markers, run_ids: Sequence[str]) -> list[tuple[str, str]]:
    """Remove every marker of `run_ids` (runs that move again); return ``(run_id, why)`` of each removed."""
    return [(note.subject, why) for why in (QUARANTINED, UNKNOWN_FLOW) for note in await markers.take_all(why, run_ids)]


async def stranded_elsewhere(
    store: CheckpointStore, known: Collection[str], forgotten: Sequence[str], saved_before: float
) -> list[SealedCheckpoint]:
    """The latest rows (unchecked) of unfinished runs of flows not in `known`, saved before `saved_before`, unheld.

    Looks through the store's `SCAN` newest runs (one listing) and the `forgotten` run ids
    (runs the listing index lost, found by a sweep of the stored rows).
    """
    rows = [row for row in await store.list_runs(None, SCAN) if row.flow not in known]
    for run_id in forgotten:
        try:
            rows.append(await store.latest(run_id))
        except CheckpointNotFound:
            continue  # deleted meanwhile
    rows = [row for row in rows if row.status in UNFINISHED and row.saved_at <= saved_before]
    held = await held_by(store, [row.run_id for row in rows])
    return [row for row in rows if row.run_id not in held]  # a held run is moving (in another app)


@dataclass
class Reporter:
    """What one recover_all reports, each run once: a WARNING on `log`, an event, and an entry here."""

    store: CheckpointStore
    sealer: Sealer
    events: Events
    owner: str
    """Who sets the markers (the worker's lease name)."""
    log: logging.Logger
    markers: Markers = field(init=False)
    quarantined: list[tuple[str, str]] = field(default_factory=list)
    """``(flow, run_id)`` of each run quarantined now."""
    unknown: list[tuple[str, str]] = field(default_factory=list)
    """``(flow, run_id)`` of each run of an unknown flow reported now."""

    def __post_init__(self) -> None:
        self.markers = Markers(self.store, self.sealer, self.events, LONGEST)

    async def failed(self, row: SealedCheckpoint, why: str) -> None:
        """Quarantine a run whose latest checkpoint `row` failed its check, unless it is already."""
        if not await mark(self.markers, row.run_id, QUARANTINED, self.owner):
            self.log.debug("run %s stays quarantined: %s", row.run_id, why, extra=_fields(row))
            return
        self.log.warning(
            "run %s is not recovered: %s; it is quarantined (reported once, never enqueued) until its rows check "
            "again (the key that signed them added to the workers' ring) or it is deleted; "
            "`agentflow verify %s` shows it",
            row.run_id,
            why,
            row.run_id,
            extra=_fields(row),
        )
        self.events.emit("run.quarantined", row.run_id, flow=row.flow, step=row.step, why=why)
        self.quarantined.append((row.flow, row.run_id))

    async def moving(self, run_ids: Sequence[str]) -> None:
        """Remove the markers of runs recovered now (they check again, or their flow is known now)."""
        for run_id, why in await unmark(self.markers, run_ids):
            self.log.info("run %s moves again: its %s marker is removed", run_id, why, extra={"run_id": run_id})

    async def unknown_flows(self, known: Collection[str], forgotten: Sequence[str], saved_before: float) -> None:
        """Report each stranded run of a flow not in `known` (`stranded_elsewhere`), once."""
        for row in await stranded_elsewhere(self.store, known, forgotten, saved_before):
            try:
                self.sealer.open_checkpoint(row, row.run_id)
            except CheckpointStoreCorrupt as exc:
                await self.failed(row, str(exc))
                continue
            if not await mark(self.markers, row.run_id, UNKNOWN_FLOW, self.owner):
                continue
            self.log.warning(
                "run %s of flow %r is never recovered: the workers' app does not know that flow "
                "(add the flow to the app, or end or delete the run)",
                row.run_id,
                row.flow,
                extra=_fields(row),
            )
            self.events.emit("run.unknown_flow", row.run_id, flow=row.flow, step=row.step)
            self.unknown.append((row.flow, row.run_id))
