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
- ``local_key = None``: a store shared with other processes has no key of its own.

The stores agentflow ships do not use it: each has a one-transaction or one-script
``save_after_calls`` and a cheaper ``head``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from agentflow._errors import CheckpointNotFound
from agentflow.exec.checkpoints._records import SealedCall, SealedCheckpoint
from agentflow.exec.checkpoints._rules import check_call, check_row, check_save


class _CoreStore(Protocol):
    """The core methods the defaults are built from."""

    async def save(self, run_id: str, step: int, checkpoint: SealedCheckpoint) -> None: ...

    async def latest(self, run_id: str) -> SealedCheckpoint: ...

    async def record_call(self, run_id: str, record: SealedCall) -> None: ...

    async def calls(self, run_id: str) -> Sequence[SealedCall]: ...


async def _read_head(store: _CoreStore, run_id: str) -> tuple[SealedCheckpoint, dict[int, int]]:
    """The latest checkpoint, then the record count of each segment (read after it)."""
    latest = await store.latest(run_id)
    counts: dict[int, int] = {}
    for record in await store.calls(run_id):
        counts[record.segment] = counts.get(record.segment, 0) + 1
    return latest, counts


class StoreDefaults:
    """Default ``head``, ``save_after_calls`` and ``local_key`` for a store built on the core methods.

    Use it as a base class (``class MyStore(StoreDefaults): ...``); a store that can do
    better overrides any of the three.
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
