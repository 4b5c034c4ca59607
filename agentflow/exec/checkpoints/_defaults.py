"""`StoreDefaults`: the parts of `CheckpointStore` a store written outside agentflow may inherit.

A third-party store implements the core methods (``save``, ``latest``, ``history``,
``list_unfinished``, ``list_runs``, ``delete``, ``record_call``, ``calls``, ``aclose``),
``in_process``, ``stored_runs``, ``relist`` and the four lease methods (``take_lease``,
``renew_lease``, ``release_lease``, ``leases``), and mixes this class in for the rest.
Those have no default on purpose: ``stored_runs`` must find rows without the listing
index, ``relist`` must rebuild that index from the rows in one atomic step, and a take of
a lease must be atomic against every other taker, judged on one clock that every worker
shares; only the backend knows where its rows and index live and how to do either. The
mixin gives:

- ``head``: the latest checkpoint, then the counts folded from ``calls`` (two reads, the
  log read second, so the counts are no older than the checkpoint);
- ``save_after_calls``: every rule checked up front against one read of the run, then
  the records and the checkpoint written one call at a time (not atomic; see its
  docstring);
- ``local_key = None``: a store shared with other processes has no key of its own;
- ``prunable`` and ``prune`` (retention): the generic versions below, built on
  ``list_runs``, ``leases``, ``take_lease``, ``latest``, ``history``, ``calls`` and
  ``delete``, one run at a time. A run is pruned whole only if the store's ``delete`` is
  atomic, and only while its newest row is the one the caller judged (``judged``); they
  are also what `retention` falls back on for a store without them.

No trim (`TrimStore`): the port has no way to delete one checkpoint of a run and keep the
rest (``delete`` takes all of it, and a save cannot put the newest row back: it would be a
step 0 over stored call records). So `default_trimmable` and `default_trim`, what
`retention` falls back on for a store without ``trimmable`` and ``trim``, refuse with a
`NotImplementedError` that says so (`no_trim`), rather than half-do it.

The stores agentflow ships do not use it: each has a one-transaction or one-script
``save_after_calls``, a cheaper ``head`` and batched ``prunable`` and ``prune``.
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from typing import Final, NoReturn, Protocol

from agentflow._errors import CheckpointNotFound
from agentflow.exec.checkpoints.records import (
    JudgedRows,
    Lease,
    Marker,
    Pruned,
    SealedCall,
    SealedCheckpoint,
    Trimmed,
)
from agentflow.exec.checkpoints.rules import (
    check_call,
    check_judged,
    check_prune_statuses,
    check_row,
    check_save,
    live_marker_keys,
    nothing_beyond,
)

#: How many runs the generic `default_prunable` reads from the listing (all of them, in practice).
_EVERY_RUN: Final = 1_000_000
#: How long the generic `default_prune` holds a run's lease while it deletes it (seconds; released after).
PRUNE_LEASE_S: Final = 60.0


class _CoreStore(Protocol):
    """The core methods the defaults are built from."""

    async def save(self, run_id: str, step: int, checkpoint: SealedCheckpoint) -> None: ...

    async def latest(self, run_id: str) -> SealedCheckpoint: ...

    async def record_call(self, run_id: str, record: SealedCall) -> None: ...

    async def calls(self, run_id: str) -> Sequence[SealedCall]: ...


class _PrunedStore(_CoreStore, Protocol):
    """The methods the generic prune is built from."""

    async def history(self, run_id: str) -> Sequence[SealedCheckpoint]: ...

    async def list_runs(self, flow: str | None = None, limit: int = 1000) -> Sequence[SealedCheckpoint]: ...

    async def delete(self, run_id: str) -> None: ...

    async def take_lease(self, run_id: str, owner: str, token: str, ttl_s: float) -> Lease: ...

    async def release_lease(self, run_id: str, token: str) -> bool: ...

    async def peek_markers(self, keys: Sequence[str]) -> Mapping[str, Marker]: ...

    async def leases(self, run_ids: Sequence[str]) -> Mapping[str, Lease]: ...


async def default_prunable(store: _PrunedStore, before: float, statuses: Collection[str], limit: int) -> list[str]:
    """The runs a prune would take now, oldest first: read from one listing of every run, then their leases."""
    chosen = check_prune_statuses(statuses)
    found = [cp for cp in await store.list_runs(None, _EVERY_RUN) if cp.status in chosen and cp.saved_at < before]
    found.sort(key=lambda cp: cp.saved_at)
    held = await store.leases([cp.run_id for cp in found])
    return [cp.run_id for cp in found if cp.run_id not in held][: max(limit, 0)]


async def default_prune(
    store: _PrunedStore,
    run_ids: Sequence[str],
    before: float,
    statuses: Collection[str],
    owner: str,
    judged: JudgedRows | None = None,
) -> Pruned:
    """Delete each run that still qualifies, one at a time, under its lease.

    For each run: take its lease (a live holder keeps it), read its newest checkpoint
    again (`latest` reads the rows, not the listing), and if it still ended with one of
    `statuses` before `before`, and is the very row that was `judged` (its step and
    signature; any row when None), no cancel request waits for it and its call log holds
    nothing past that row (`rules.beyond_judged`: else the run is left and reported),
    count its rows and `delete` it (which forgets the
    lease too); else give the lease back. Whole or not at all only as far as the store's
    `delete` is one atomic step, and the re-read and the delete are two calls: the lease
    is what keeps a worker from saving in between.
    """
    chosen = check_prune_statuses(statuses)
    pinned = check_judged(judged)
    pruned: list[str] = []
    problems: list[tuple[str, str]] = []
    rows = 0
    for run_id in dict.fromkeys(run_ids):
        if pinned is not None and run_id not in pinned:
            continue  # not judged: left as it is
        token = secrets.token_hex(16)
        if (await store.take_lease(run_id, owner, token, PRUNE_LEASE_S)).token != token:
            continue  # held: someone is moving it
        deleted = False
        try:
            try:
                latest = await store.latest(run_id)
            except CheckpointNotFound:
                continue
            if not (latest.status in chosen and latest.saved_at < before):
                continue
            records = await store.calls(run_id)
            counts = Counter(rec.segment for rec in records)
            live = bool(await store.peek_markers(live_marker_keys(run_id)))
            if nothing_beyond(pinned, run_id, (latest.step, latest.sig, latest.segment), counts, live, problems):
                count = len(await store.history(run_id)) + len(records)
                await store.delete(run_id)
                deleted = True
                pruned.append(run_id)
                rows += count
        finally:
            if not deleted:
                await store.release_lease(run_id, token)
    return Pruned(tuple(pruned), rows, tuple(problems))


def no_trim(store: object) -> NoReturn:
    """Refuse to trim on a store without `TrimStore`, saying why and what to do instead.

    Raises:
        NotImplementedError: always.
    """
    raise NotImplementedError(
        f"{type(store).__name__} cannot trim runs: it has no trimmable and trim (TrimStore), and the store port "
        "has no way to delete one checkpoint of a run; prune finished runs whole instead (keep_s), or give the "
        "store trimmable and trim"
    )


async def default_trimmable(
    store: object, before: float, statuses: Collection[str], limit: int, since: float | None = None
) -> list[tuple[str, float]]:
    """The generic trim listing: there is none (see `no_trim`).

    Raises:
        NotImplementedError: always.
    """
    no_trim(store)


async def default_trim(
    store: object,
    run_ids: Sequence[str],
    before: float,
    statuses: Collection[str],
    judged: JudgedRows | None = None,
) -> Trimmed:
    """The generic trim: there is none (see `no_trim`); nothing is deleted.

    Raises:
        NotImplementedError: always.
    """
    no_trim(store)


async def _read_head(store: _CoreStore, run_id: str) -> tuple[SealedCheckpoint, dict[int, int]]:
    """The latest checkpoint, then the record count of each segment (read after it)."""
    latest = await store.latest(run_id)
    counts: dict[int, int] = {}
    for record in await store.calls(run_id):
        counts[record.segment] = counts.get(record.segment, 0) + 1
    return latest, counts


class StoreDefaults:
    """Defaults for a store built on the core methods: ``head``, ``save_after_calls``, ``local_key``, retention.

    Use it as a base class (``class MyStore(StoreDefaults): ...``); a store that can do
    better overrides any of them.
    """

    #: A store shared with other processes signs nothing itself: runners need ``checkpoint_key``.
    local_key: bytes | None = None

    async def head(self: _CoreStore, run_id: str) -> tuple[SealedCheckpoint, Mapping[int, int]]:
        """Return the latest checkpoint and the record count of each segment.

        Two reads, the call log second, so the counts are no older than the checkpoint.
        Reading the whole log is what a native ``head`` avoids (Redis and SQL count
        without reading a record).

        Raises:
            CheckpointNotFound: nothing is stored for `run_id`.
        """
        return await _read_head(self, run_id)

    async def save_after_calls(
        self: _CoreStore, run_id: str, step: int, checkpoint: SealedCheckpoint, calls: Sequence[SealedCall]
    ) -> None:
        """Append `calls`, then save `checkpoint`, checking every rule first. NOT atomic.

        The records and the checkpoint are checked against one read of the run (its latest
        checkpoint and record counts) before anything is written, so a refusal the store
        can see at that moment stores nothing. The writes that follow are separate
        ``record_call`` and ``save`` calls, though: a writer that changes the run between
        the read and the writes (a worker claiming it, a racing save), or a crash between
        two writes, can leave some records stored without the checkpoint. The caller then
        gets `CheckpointConflict` (or the crash) exactly as if it had written them one by
        one, which it must handle anyway. A backend that can write several rows in one
        transaction or script should override this: one round trip instead of one per
        row, and all or nothing even against concurrent writers.

        Raises:
            CheckpointConflict: a record or the checkpoint is refused (when found by the
                writes, after some of the records may be stored).
            CheckpointNotFound: `calls` is not empty and the run has no checkpoint.
            ValueError: `checkpoint` does not carry `run_id` and `step`, or a record is of
                another run.
        """
        check_row(run_id, step, checkpoint)
        if calls:
            try:
                last, counts = await _read_head(self, run_id)
            except CheckpointNotFound:
                check_call(run_id, calls[0], None, 0)  # says why: another run's record, or no checkpoint
                raise
            for record in calls:
                check_call(run_id, record, (last.step, last.status, last.segment), counts.get(record.segment, 0))
                counts[record.segment] = counts.get(record.segment, 0) + 1
            check_save(run_id, step, checkpoint.flow, (last.step, last.flow, last.status))
        for record in calls:
            await self.record_call(run_id, record)
        await self.save(run_id, step, checkpoint)

    async def prunable(self: _PrunedStore, before: float, statuses: Collection[str], limit: int) -> Sequence[str]:
        """The runs a prune would take now, oldest first (see `RetentionStore.prunable`).

        Reads every listed run's newest checkpoint (one ``list_runs``), then their leases:
        a store with an index by time should override it.
        """
        return await default_prunable(self, before, statuses, limit)

    async def prune(
        self: _PrunedStore,
        run_ids: Sequence[str],
        before: float,
        statuses: Collection[str],
        owner: str,
        judged: JudgedRows | None = None,
    ) -> Pruned:
        """Delete each run that still qualifies, one at a time under its lease (see `default_prune`).

        A run goes whole only if this store's ``delete`` removes all of it in one atomic
        step; a store that can delete a batch of runs in one transaction should override it
        (and compare each run's newest row with `judged` inside that transaction).
        """
        return await default_prune(self, run_ids, before, statuses, owner, judged)
