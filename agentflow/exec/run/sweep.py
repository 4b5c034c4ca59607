"""Runs the listing index forgot: found from the stored rows themselves, checked, and listed again.

Every store keeps, beside a run's signed rows, an unsigned listing index (the ``runs``
table, Redis' latest hash and sorted sets) that `list_unfinished`, `list_runs` and the
compare-and-set read. Someone with write access to the store can delete a run's entry
there: the run then vanishes from listings and from `recover_all` while its rows stay.
`stored_runs` reads the rows (a key scan, a ``SELECT DISTINCT``), so comparing the two
finds such runs:

- `forgotten`: the ids with stored rows and no listing entry (what ``verify --all`` reports);
- `relist_forgotten`: for each forgotten run whose newest checkpoint checks (signature)
  and belongs to one of the given flows and is unfinished, the store rebuilds its entry
  from the rows (`CheckpointStore.relist`), so an ordinary recovery can claim it.

Nothing here trusts the index or an unchecked row: a row whose signature fails is
reported, never listed again.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Final

from agentflow._errors import CheckpointStoreCorrupt
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.checkpoints.records import UNFINISHED
from agentflow.exec.seal import Sealer

#: How many listed runs a sweep compares at most.
SWEEP_LIMIT: Final = 1_000_000


@dataclass(frozen=True, slots=True)
class Relisted:
    """A forgotten run the sweep listed again (or why it did not)."""

    run_id: str
    flow: str
    """The run's ``flow`` column as its newest checkpoint row says (unproven when `relisted` is False)."""
    relisted: bool
    """Whether the store's listing entry was rebuilt (the run can be recovered now)."""
    why: str
    """What was found: relisted, ended, another flow's, or the check that failed."""


async def forgotten(store: CheckpointStore) -> list[str]:
    """The ids of runs that have stored rows but no entry in the store's listing index."""
    listed = {row.run_id for row in await store.list_runs(None, SWEEP_LIMIT)}
    return [run_id for run_id in await store.stored_runs() if run_id not in listed]


async def relist_forgotten(store: CheckpointStore, sealer: Sealer, columns: Collection[str]) -> list[Relisted]:
    """List again every forgotten, unfinished run of the given ``flow`` columns whose newest row checks.

    Args:
        store: the store to sweep.
        sealer: checks each forgotten run's newest checkpoint before anything is rebuilt.
        columns: the ``flow`` columns (flow names, ``loop:<name>``) the caller can recover.

    Returns:
        One entry per forgotten run, relisted or not, with why.
    """
    out: list[Relisted] = []
    for run_id in await forgotten(store):
        rows = list(await store.history(run_id))
        if not rows:
            continue  # deleted since the scan
        newest = rows[-1]
        try:
            sealer.open_checkpoint(newest, run_id)
        except CheckpointStoreCorrupt as exc:
            out.append(Relisted(run_id, newest.flow, False, str(exc)))
            continue
        if newest.flow not in columns:
            out.append(Relisted(run_id, newest.flow, False, f"another flow's run ({newest.flow!r})"))
            continue
        if newest.status not in UNFINISHED:
            out.append(Relisted(run_id, newest.flow, False, f"ended ({newest.status})"))
            continue
        rebuilt = await store.relist(run_id)
        if rebuilt is None or rebuilt.step != newest.step:
            out.append(Relisted(run_id, newest.flow, False, "its rows changed while it was being listed again"))
            continue
        out.append(Relisted(run_id, newest.flow, True, f"listed again at step {newest.step} ({newest.status})"))
    return out
