"""Retention of `SQLAlchemyCheckpointStore`: find finished runs, delete a batch of them whole, or trim them.

A run qualifies when its ``runs`` row points at its newest checkpoint row, that row ended
with one of the chosen statuses before the cut-off, and no live lease holds the run. The
``runs`` row is the way in (its ``saved_at`` index); the newest checkpoint row is judged.
Given the rows the caller judged (`JudgedRows`), a run also qualifies only while its newest
checkpoint row (the one with no row of a higher step after it: the table's max(step) row,
not what the ``runs`` row says) has the judged step and signature, compared after that row's
``runs`` row is locked: a save that landed after the judgement inserted another row, and
the run stays, whatever the columns in clear (``runs``, the rows' status and saved_at) say.
After the lock, in the same transaction, nothing may lie beyond that row either
(`rules.nothing_beyond`): no live cancel request in ``markers``, no record in ``calls`` the
row does not account for (a newer segment, or more records in a segment than it counted).
A run whose later rows were moved aside by an ``UPDATE`` (steps set back, ``runs`` pointed
at an older row) keeps its later segment's records, so it stays, and is reported.

`SQLPrune.prune` is one write transaction per batch:

1. the qualifying ``runs`` rows among the ids asked for are read and locked (PostgreSQL
   ``FOR UPDATE OF runs``, in run id order; SQLite holds its write lock from ``BEGIN
   IMMEDIATE``), with the step and signature of each run's newest checkpoint row, so no
   save, call record or relist of those runs runs meanwhile; a run whose newest row is not
   the judged one is dropped there;
2. their leases are taken, with the lease statements' own upsert (`sqlalchemy._leases`), for one
   token of this prune: a run a live holder has (taken since it was listed) is left
   alone, and a taker that comes later waits for the commit and then finds no run;
3. the runs this token holds are deleted from ``checkpoints``, ``calls``, ``leases`` and
   ``runs``.

The lock order (``runs`` rows, then ``leases`` rows) is `delete`'s, and a lease take locks
only its ``leases`` row, so a prune deadlocks with neither. A reader sees each run before
the commit or after it, and a process killed midway leaves the transaction rolled back.

`SQLPrune.trim` is one plain write transaction per batch too (no server-side function):
the ``runs`` rows of the runs that still qualify are read and locked as above, with the
trim's own conditions (not a tool loop, an older checkpoint row kept, no live lease); then
every checkpoint row of those runs older than the step their ``runs`` row names is
deleted. Nothing else is touched: no lease is taken (a trim keeps the lease, and a worker
that takes one meanwhile needs only the newest row and the call log, which stay). A
save or relist of a locked run waits for the commit; a trim killed midway rolls back.
"""

from __future__ import annotations

import secrets
from collections.abc import Collection, Sequence
from typing import Any

import sqlalchemy as sa

from agentflow.exec.checkpoints.records import JudgedRow, JudgedRows, Pruned, Trimmed
from agentflow.exec.checkpoints.rules import (
    UNTRIMMED_PREFIX,
    check_judged,
    check_prune_statuses,
    live_marker_keys,
    nothing_beyond,
)
from agentflow.exec.checkpoints.sqlalchemy._leases import SQLLeases, Transaction, clock
from agentflow.exec.checkpoints.sqlalchemy._statements import Tables

#: How long a prune holds the leases of a batch (seconds): the transaction's length at most.
_LEASE_S = 60.0


class SQLPrune:
    """The retention statements of one store's tables."""

    def __init__(self, t: Tables, *, sqlite: bool, tx: Transaction, leases: SQLLeases) -> None:
        runs, cps, lease = t.runs, t.checkpoints, t.leases
        self._sqlite = sqlite
        self._tx = tx
        self._leases = leases
        now = clock(sqlite)
        before = sa.bindparam("before", type_=sa.Double)
        newer = sa.exists().where(cps.c.run_id == runs.c.run_id, cps.c.step > runs.c.step)
        newest = cps.alias("newest")
        joined = runs.join(newest, (newest.c.run_id == runs.c.run_id) & (newest.c.step == runs.c.step))
        ended = (
            newest.c.status.in_(sa.bindparam("statuses", expanding=True)),
            runs.c.saved_at < before,
            newest.c.saved_at < before,
            ~newer,
        )
        qualify = sa.select(runs.c.run_id).select_from(joined).where(*ended)
        held = sa.exists().where(lease.c.run_id == runs.c.run_id, lease.c.expires_at > now)
        limit = sa.bindparam("limit", type_=sa.Integer)
        self._prunable = qualify.where(~held).order_by(runs.c.saved_at).limit(limit)
        ids: sa.BindParameter[list[str]] = sa.bindparam("runs", expanding=True)
        # With the newest row's step, signature and segment, to compare with the row the caller judged.
        pinned = sa.select(runs.c.run_id, newest.c.step, newest.c.sig, newest.c.segment).select_from(joined)
        self._lock = pinned.where(*ended, runs.c.run_id.in_(ids)).order_by(runs.c.run_id).with_for_update(of=runs)
        # Trimming: as a prune would take it, not a tool loop, an older checkpoint row kept, no live lease.
        older = sa.exists().where(cps.c.run_id == runs.c.run_id, cps.c.step < runs.c.step)
        loop = sa.func.substr(newest.c.flow, 1, len(UNTRIMMED_PREFIX)) == UNTRIMMED_PREFIX
        trims = (*ended, ~loop, older, ~held)
        listed = sa.select(runs.c.run_id, runs.c.saved_at).select_from(joined).where(*trims)
        since = runs.c.saved_at >= sa.bindparam("since", type_=sa.Double)
        self._trimmable = {
            False: listed.order_by(runs.c.saved_at, runs.c.run_id).limit(limit),
            True: listed.where(since).order_by(runs.c.saved_at, runs.c.run_id).limit(limit),
        }
        self._trim_lock = pinned.where(*trims, runs.c.run_id.in_(ids)).order_by(runs.c.run_id).with_for_update(of=runs)
        step_of_run = sa.select(runs.c.step).where(runs.c.run_id == cps.c.run_id).scalar_subquery()
        self._trim = sa.delete(cps).where(cps.c.run_id.in_(ids), cps.c.step < step_of_run)
        # What lies beyond the judged row: the records per segment, and the live markers of the runs.
        calls, markers = t.calls, t.markers
        self._counts = (
            sa.select(calls.c.run_id, calls.c.segment, sa.func.count())
            .where(calls.c.run_id.in_(ids))
            .group_by(calls.c.run_id, calls.c.segment)
        )
        keys: sa.BindParameter[list[str]] = sa.bindparam("keys", expanding=True)
        self._live = sa.select(markers.c.key).where(markers.c.key.in_(keys), markers.c.expires_at > now)
        self._ours = sa.select(lease.c.run_id).where(lease.c.run_id.in_(ids), lease.c.token == sa.bindparam("token"))
        #: Counted as the run's rows: checkpoints and calls; then its lease, its runs row and its events.
        self._deletes = [
            sa.delete(table).where(table.c.run_id.in_(ids)) for table in (cps, t.calls, lease, runs, t.events)
        ]

    def _clock(self, **values: Any) -> dict[str, Any]:
        return self._leases.params(**values)

    async def prunable(self, before: float, statuses: Collection[str], limit: int) -> list[str]:
        """The runs a prune would take now, oldest first."""
        params = self._clock(before=before, statuses=list(check_prune_statuses(statuses)), limit=max(limit, 0))
        async with self._tx() as conn:
            return [str(run_id) for run_id in (await conn.scalars(self._prunable, params)).all()]

    async def prune(
        self,
        run_ids: Sequence[str],
        before: float,
        statuses: Collection[str],
        owner: str,
        judged: JudgedRows | None = None,
    ) -> Pruned:
        """Delete the runs of `run_ids` that qualify, whole, in one transaction (see the module docstring)."""
        chosen = list(check_prune_statuses(statuses))
        pinned = check_judged(judged)
        unique = [run_id for run_id in dict.fromkeys(run_ids) if pinned is None or run_id in pinned]
        if not unique:
            return Pruned((), 0)
        token = f"prune-{secrets.token_hex(16)}"
        problems: list[tuple[str, str]] = []
        async with self._tx(write=True) as conn:
            params = {"before": before, "statuses": chosen, "runs": unique}
            found = (await conn.execute(self._lock, params)).all()
            locked = await self._nothing_beyond(conn, found, pinned, problems)
            if not locked:
                return Pruned((), 0, tuple(problems))
            await self._leases.take_many(conn, locked, owner, token, _LEASE_S)
            ours = set((await conn.scalars(self._ours, {"runs": locked, "token": token})).all())
            pruned = [run_id for run_id in unique if run_id in ours]
            rows = 0
            for i, delete in enumerate(self._deletes):
                deleted = (await conn.execute(delete, {"runs": pruned})).rowcount
                rows += deleted if i < 2 else 0
        return Pruned(tuple(pruned), rows, tuple(problems))

    async def _nothing_beyond(
        self, conn: Any, found: Sequence[Any], pinned: dict[str, JudgedRow] | None, problems: list[tuple[str, str]]
    ) -> list[str]:
        """Of the locked runs `found`, those with nothing beyond the row judged (`rules.nothing_beyond`).

        `found` holds each run's id and its newest row's step, sig and segment; the call counts
        and live markers are read in the caller's transaction. A run left with a problem goes
        to `problems`.
        """
        newest = {str(run_id): (int(step), str(sig), int(segment)) for run_id, step, sig, segment in found}
        if not newest:
            return []
        counts: dict[str, dict[int, int]] = {}
        for run_id, segment, n in (await conn.execute(self._counts, {"runs": list(newest)})).all():
            counts.setdefault(str(run_id), {})[int(segment)] = int(n)
        keys = [key for run_id in newest for key in live_marker_keys(run_id)]
        live = {str(key).partition("/")[2] for key in (await conn.scalars(self._live, self._clock(keys=keys))).all()}
        return [
            run_id
            for run_id, row in newest.items()
            if nothing_beyond(pinned, run_id, row, counts.get(run_id, {}), run_id in live, problems)
        ]

    async def trimmable(
        self, before: float, statuses: Collection[str], limit: int, since: float | None
    ) -> list[tuple[str, float]]:
        """The runs a trim would take now, ``(run_id, saved_at)`` oldest first."""
        chosen = list(check_prune_statuses(statuses, "a trim"))
        params = self._clock(before=before, statuses=chosen, limit=max(limit, 0), since=since)
        async with self._tx() as conn:
            rows = (await conn.execute(self._trimmable[since is not None], params)).all()
        return [(str(run_id), float(saved_at)) for run_id, saved_at in rows]

    async def trim(
        self, run_ids: Sequence[str], before: float, statuses: Collection[str], judged: JudgedRows | None = None
    ) -> Trimmed:
        """Delete the older checkpoints of the runs of `run_ids` that qualify, in one transaction (module docstring)."""
        chosen = list(check_prune_statuses(statuses, "a trim"))
        pinned = check_judged(judged)
        unique = [run_id for run_id in dict.fromkeys(run_ids) if pinned is None or run_id in pinned]
        if not unique:
            return Trimmed((), 0)
        problems: list[tuple[str, str]] = []
        async with self._tx(write=True) as conn:
            params = self._clock(before=before, statuses=chosen, runs=unique)
            found = (await conn.execute(self._trim_lock, params)).all()
            locked = set(await self._nothing_beyond(conn, found, pinned, problems))
            trimmed = [run_id for run_id in unique if run_id in locked]
            if not trimmed:
                return Trimmed((), 0, tuple(problems))
            rows = (await conn.execute(self._trim, {"runs": trimmed})).rowcount
        return Trimmed(tuple(trimmed), rows, tuple(problems))
