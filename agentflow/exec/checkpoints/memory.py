"""`MemoryCheckpointStore`: the whole protocol in one process's memory.

It is production code for single-process use and tests: it passes the same conformance
suite as every other store. Each method runs without awaiting, so on one event loop it is
atomic by construction.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

from agentflow._errors import CheckpointNotFound
from agentflow.exec.checkpoints._records import UNFINISHED, SealedCall, SealedCheckpoint
from agentflow.exec.checkpoints._rules import check_call, check_row, check_save


class MemoryCheckpointStore:
    """Keeps checkpoints and call logs in dicts; lost when the process ends."""

    in_process = True

    def __init__(self) -> None:
        #: Signs this store's rows when the runner is given no key (nothing leaves the process).
        self.local_key = secrets.token_bytes(32)
        self._checkpoints: dict[str, list[SealedCheckpoint]] = {}
        self._calls: dict[str, dict[int, list[SealedCall]]] = {}

    async def save(self, run_id: str, step: int, checkpoint: SealedCheckpoint) -> None:
        """Store a checkpoint (compare-and-set; see `CheckpointStore.save`)."""
        check_row(run_id, step, checkpoint)
        rows = self._checkpoints.get(run_id)
        last = rows[-1] if rows else None
        check_save(run_id, step, checkpoint.flow, (last.step, last.flow, last.status) if last else None)
        self._checkpoints.setdefault(run_id, []).append(checkpoint)

    async def latest(self, run_id: str) -> SealedCheckpoint:
        """Return the newest checkpoint of the run."""
        rows = self._checkpoints.get(run_id)
        if not rows:
            raise CheckpointNotFound(f"no checkpoint is stored for run {run_id!r}")
        return rows[-1]

    async def history(self, run_id: str) -> Sequence[SealedCheckpoint]:
        """Return every checkpoint of the run, oldest first."""
        return list(self._checkpoints.get(run_id, ()))

    async def list_unfinished(self, flow: str) -> Sequence[str]:
        """Return the ids of the flow's running and paused runs."""
        return [
            rid for rid, rows in self._checkpoints.items() if rows[-1].flow == flow and rows[-1].status in UNFINISHED
        ]

    async def list_runs(self, flow: str | None = None, limit: int = 1000) -> Sequence[SealedCheckpoint]:
        """Return the latest checkpoint of each run, newest first."""
        latest = [rows[-1] for rows in self._checkpoints.values() if flow is None or rows[-1].flow == flow]
        latest.sort(key=lambda c: c.saved_at, reverse=True)
        return latest[:limit]

    async def delete(self, run_id: str) -> None:
        """Forget the run."""
        self._checkpoints.pop(run_id, None)
        self._calls.pop(run_id, None)

    async def record_call(self, run_id: str, record: SealedCall) -> None:
        """Append a call record (numbered and fenced; see `CheckpointStore.record_call`)."""
        rows = self._checkpoints.get(run_id)
        last = rows[-1] if rows else None
        segments = self._calls.setdefault(run_id, {}) if last else {}
        seg = segments.get(record.segment, [])
        check_call(run_id, record, (last.step, last.status, last.segment) if last else None, len(seg))
        segments.setdefault(record.segment, seg).append(record)

    async def save_after_calls(
        self, run_id: str, step: int, checkpoint: SealedCheckpoint, calls: Sequence[SealedCall]
    ) -> None:
        """Append `calls`, then save `checkpoint`, all or nothing (see the protocol's optional part)."""
        check_row(run_id, step, checkpoint)
        rows = self._checkpoints.get(run_id)
        last = rows[-1] if rows else None
        latest = (last.step, last.status, last.segment) if last else None
        counts = {seg: len(recs) for seg, recs in self._calls.get(run_id, {}).items()}
        for record in calls:  # every rule is checked before anything is written
            check_call(run_id, record, latest, counts.get(record.segment, 0))
            counts[record.segment] = counts.get(record.segment, 0) + 1
        check_save(run_id, step, checkpoint.flow, (last.step, last.flow, last.status) if last else None)
        segments = self._calls.setdefault(run_id, {})
        for record in calls:
            segments.setdefault(record.segment, []).append(record)
        self._checkpoints.setdefault(run_id, []).append(checkpoint)

    async def calls(self, run_id: str) -> Sequence[SealedCall]:
        """Return the run's call records by segment, then sequence number."""
        segments = self._calls.get(run_id, {})
        return [rec for seg in sorted(segments) for rec in segments[seg]]

    async def aclose(self) -> None:
        """Nothing to release."""
