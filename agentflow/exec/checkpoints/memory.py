"""`MemoryCheckpointStore`: the whole protocol in one process's memory.

It is production code for single-process use and tests: it passes the same conformance
suite as every other store. Each method runs without awaiting, so on one event loop it is
atomic by construction.

Like the shared stores it keeps the rows (``_checkpoints``, ``_calls``) apart from the
listing index (``_listed``, the ids `list_runs` and `list_unfinished` walk): the rules
and `stored_runs` read the rows, so an index entry going missing hides a run from the
listings but never lets a step 0 start over its rows. The index holds only ids (each
listing reads the run's newest row), so `relist` puts the id back and has nothing else
to mend.

Leases live in a dict (``_leases``) and are judged against ``time.time()``; like every
other method, a take runs without awaiting, so racing takers on one loop cannot interleave.

`prune` judges and forgets each run without awaiting too: a run is gone whole, in one
step, and one a live lease or cancel request holds is kept, and so is one whose newest row
is not the row the caller judged (`judged`: its step and signature) or whose call log goes
on past that row (`rules.beyond_judged`: kept and reported). `trim` judges each run the same way
and cuts its checkpoint list to the newest row, also without awaiting.

Event streams (``_events``) hold the newest `EVENTS_KEPT` events of each run, numbered by
one counter for the store: a cursor is the event's number.
"""

from __future__ import annotations

import secrets
import time
from collections import deque
from collections.abc import Collection, Mapping, Sequence

from agentflow._errors import CheckpointNotFound
from agentflow.exec.checkpoints.records import (
    EVENTS_KEPT,
    UNFINISHED,
    JudgedRow,
    JudgedRows,
    Lease,
    LeaseMove,
    Marker,
    Pruned,
    SealedCall,
    SealedCheckpoint,
    SealedEvent,
    StoredEvent,
    Trimmed,
)
from agentflow.exec.checkpoints.rules import (
    check_call,
    check_events,
    check_judged,
    check_lease_args,
    check_lease_move,
    check_marker_args,
    check_no_stored_rows,
    check_prune_statuses,
    check_row,
    check_save,
    int_cursor,
    live_marker_keys,
    nothing_beyond,
    trims,
)


class MemoryCheckpointStore:
    """Keeps checkpoints and call logs in dicts; lost when the process ends."""

    in_process = True

    def __init__(self) -> None:
        #: Signs this store's rows when the runner is given no key (nothing leaves the process).
        self.local_key: bytes = secrets.token_bytes(32)
        self._checkpoints: dict[str, list[SealedCheckpoint]] = {}
        self._calls: dict[str, dict[int, list[SealedCall]]] = {}
        #: The listing index: the ids of the runs the listings show (a dict keeps save order).
        self._listed: dict[str, None] = {}
        #: Who holds which run (a lapsed entry is free; it is overwritten by the next take).
        self._leases: dict[str, Lease] = {}
        #: agentflow's markers (`MarkerStore`), apart from the leases; a lapsed one is free.
        self._markers: dict[str, Marker] = {}
        #: Each run's event stream, oldest first, and the last number given to an event.
        self._events: dict[str, deque[StoredEvent]] = {}
        self._event_no = 0

    async def save(self, run_id: str, step: int, checkpoint: SealedCheckpoint) -> None:
        """Store a checkpoint (compare-and-set; see `CheckpointStore.save`)."""
        check_row(run_id, step, checkpoint)
        self._check_save(run_id, step, checkpoint)
        self._checkpoints.setdefault(run_id, []).append(checkpoint)
        self._listed[run_id] = None

    def _check_save(self, run_id: str, step: int, checkpoint: SealedCheckpoint) -> None:
        """The compare-and-set, read from the rows; a step 0 over leftover call rows is refused too."""
        rows = self._checkpoints.get(run_id)
        last = rows[-1] if rows else None
        check_save(run_id, step, checkpoint.flow, (last.step, last.flow, last.status) if last else None)
        if last is None:
            check_no_stored_rows(run_id, any(self._calls.get(run_id, {}).values()))

    async def latest(self, run_id: str) -> SealedCheckpoint:
        """Return the newest checkpoint of the run."""
        rows = self._checkpoints.get(run_id)
        if not rows:
            raise CheckpointNotFound(f"no checkpoint is stored for run {run_id!r}")
        return rows[-1]

    async def history(self, run_id: str) -> Sequence[SealedCheckpoint]:
        """Return every checkpoint of the run, oldest first."""
        return list(self._checkpoints.get(run_id, ()))

    def _listed_latest(self) -> list[SealedCheckpoint]:
        """The latest checkpoint of each run in the listing index."""
        return [rows[-1] for rows in map(self._checkpoints.get, self._listed) if rows]

    async def list_unfinished(self, flow: str) -> Sequence[str]:
        """Return the ids of the flow's running and paused runs."""
        return [cp.run_id for cp in self._listed_latest() if cp.flow == flow and cp.status in UNFINISHED]

    async def list_runs(self, flow: str | None = None, limit: int = 1000) -> Sequence[SealedCheckpoint]:
        """Return the latest checkpoint of each run, newest first."""
        latest = [cp for cp in self._listed_latest() if flow is None or cp.flow == flow]
        latest.sort(key=lambda c: c.saved_at, reverse=True)
        return latest[: max(limit, 0)]

    async def stored_runs(self) -> Sequence[str]:
        """Return the id of every run with a checkpoint row, sorted (the rows, not the index)."""
        return sorted(run_id for run_id, rows in self._checkpoints.items() if rows)

    async def relist(self, run_id: str) -> SealedCheckpoint | None:
        """Put the run back in the listing index; return its newest row (see `CheckpointStore.relist`).

        The index holds only the run's id, so a listed run is left as it is.
        """
        rows = self._checkpoints.get(run_id)
        if not rows:
            return None
        self._listed.setdefault(run_id, None)
        return rows[-1]

    def _prunable(self, run_id: str, before: float, chosen: Collection[str]) -> SealedCheckpoint | None:
        """The run's newest row if a prune may take the run now (ended as chosen, before the cut-off, not held)."""
        rows = self._checkpoints.get(run_id)
        last = rows[-1] if rows else None
        if last is None or last.status not in chosen or not last.saved_at < before:
            return None
        return last if self._live(run_id) is None else None

    async def prunable(self, before: float, statuses: Collection[str], limit: int) -> Sequence[str]:
        """The listed runs a prune would take now, oldest first (see `RetentionStore.prunable`)."""
        chosen = check_prune_statuses(statuses)
        found = [last for run_id in self._listed if (last := self._prunable(run_id, before, chosen)) is not None]
        found.sort(key=lambda cp: cp.saved_at)
        return [cp.run_id for cp in found[: max(limit, 0)]]

    async def prune(
        self,
        run_ids: Sequence[str],
        before: float,
        statuses: Collection[str],
        owner: str,
        judged: JudgedRows | None = None,
    ) -> Pruned:
        """Forget each run that still qualifies, whole, without awaiting (see `RetentionStore.prune`)."""
        chosen = check_prune_statuses(statuses)
        pinned = check_judged(judged)
        pruned: list[str] = []
        problems: list[tuple[str, str]] = []
        rows = 0
        for run_id in dict.fromkeys(run_ids):
            last = self._prunable(run_id, before, chosen)
            if last is None or not self._nothing_beyond(run_id, last, pinned, problems):
                continue
            rows += len(self._checkpoints[run_id]) + sum(map(len, self._calls.get(run_id, {}).values()))
            self._forget(run_id)
            pruned.append(run_id)
        return Pruned(tuple(pruned), rows, tuple(problems))

    def _nothing_beyond(
        self, run_id: str, last: SealedCheckpoint, pinned: dict[str, JudgedRow] | None, problems: list[tuple[str, str]]
    ) -> bool:
        """Whether nothing of the run lies beyond its newest row `last` (`rules.nothing_beyond`)."""
        counts = {seg: len(recs) for seg, recs in self._calls.get(run_id, {}).items()}
        live = any(self._live_marker(key) is not None for key in live_marker_keys(run_id))
        return nothing_beyond(pinned, run_id, (last.step, last.sig, last.segment), counts, live, problems)

    def _trimmable(self, run_id: str, before: float, chosen: Collection[str]) -> SealedCheckpoint | None:
        """The run's newest row if a trim may take the run now (as a prune would, not a tool loop, older rows kept)."""
        last = self._prunable(run_id, before, chosen)
        if last is None or not trims(last.flow) or len(self._checkpoints[run_id]) < 2:
            return None
        return last

    async def trimmable(
        self, before: float, statuses: Collection[str], limit: int, since: float | None = None
    ) -> Sequence[tuple[str, float]]:
        """The listed runs a trim would take now, oldest first (see `TrimStore.trimmable`)."""
        chosen = check_prune_statuses(statuses, "a trim")
        floor = float("-inf") if since is None else since
        found = [
            last
            for run_id in self._listed
            if (last := self._trimmable(run_id, before, chosen)) is not None and last.saved_at >= floor
        ]
        found.sort(key=lambda cp: (cp.saved_at, cp.run_id))
        return [(cp.run_id, cp.saved_at) for cp in found[: max(limit, 0)]]

    async def trim(
        self, run_ids: Sequence[str], before: float, statuses: Collection[str], judged: JudgedRows | None = None
    ) -> Trimmed:
        """Keep only the newest checkpoint of each run that still qualifies, without awaiting (see `TrimStore.trim`)."""
        chosen = check_prune_statuses(statuses, "a trim")
        pinned = check_judged(judged)
        trimmed: list[str] = []
        problems: list[tuple[str, str]] = []
        rows = 0
        for run_id in dict.fromkeys(run_ids):
            last = self._trimmable(run_id, before, chosen)
            if last is None or not self._nothing_beyond(run_id, last, pinned, problems):
                continue
            kept = self._checkpoints[run_id]
            rows += len(kept) - 1
            self._checkpoints[run_id] = kept[-1:]
            trimmed.append(run_id)
        return Trimmed(tuple(trimmed), rows, tuple(problems))

    async def delete(self, run_id: str) -> None:
        """Forget the run."""
        self._forget(run_id)

    def _forget(self, run_id: str) -> None:
        self._checkpoints.pop(run_id, None)
        self._calls.pop(run_id, None)
        self._listed.pop(run_id, None)
        self._leases.pop(run_id, None)
        self._events.pop(run_id, None)

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
        """Append `calls`, then save `checkpoint`, all or nothing (see `CheckpointStore.save_after_calls`)."""
        check_row(run_id, step, checkpoint)
        rows = self._checkpoints.get(run_id)
        last = rows[-1] if rows else None
        latest = (last.step, last.status, last.segment) if last else None
        counts = {seg: len(recs) for seg, recs in self._calls.get(run_id, {}).items()}
        for record in calls:  # every rule is checked before anything is written
            check_call(run_id, record, latest, counts.get(record.segment, 0))
            counts[record.segment] = counts.get(record.segment, 0) + 1
        self._check_save(run_id, step, checkpoint)
        segments = self._calls.setdefault(run_id, {})
        for record in calls:
            segments.setdefault(record.segment, []).append(record)
        self._checkpoints.setdefault(run_id, []).append(checkpoint)
        self._listed[run_id] = None

    async def record_call_moving(self, run_id: str, record: SealedCall, move: LeaseMove) -> None:
        """`record_call`, moving the run's lease in the same instant (see `LeaseMoving`)."""
        check_lease_move(run_id, move, self._live(run_id))
        await self.record_call(run_id, record)
        self._move(run_id, move)

    async def save_after_calls_moving(
        self,
        run_id: str,
        step: int,
        checkpoint: SealedCheckpoint,
        calls: Sequence[SealedCall],
        move: LeaseMove,
        events: Sequence[SealedEvent] = (),
    ) -> None:
        """`save_after_calls`, moving the run's lease and appending `events` in the same instant (see `LeaseMoving`)."""
        check_lease_move(run_id, move, self._live(run_id))
        check_events(run_id, events)
        await self.save_after_calls(run_id, step, checkpoint, calls)
        self._move(run_id, move)
        self._append(run_id, events)

    def _move(self, run_id: str, move: LeaseMove) -> None:
        if move.to is None:
            self._leases.pop(run_id, None)
        else:
            self._leases[run_id] = Lease(run_id, move.owner, move.to, time.time() + move.ttl_s)

    async def head(self, run_id: str) -> tuple[SealedCheckpoint, Mapping[int, int]]:
        """Return the latest checkpoint and the record count of each segment, in one instant."""
        latest = await self.latest(run_id)
        return latest, {seg: len(recs) for seg, recs in self._calls.get(run_id, {}).items() if recs}

    async def calls(self, run_id: str) -> Sequence[SealedCall]:
        """Return the run's call records by segment, then sequence number."""
        segments = self._calls.get(run_id, {})
        return [rec for seg in sorted(segments) for rec in segments[seg]]

    async def append_events(self, run_id: str, events: Sequence[SealedEvent]) -> None:
        """Append to the run's stream, keeping the newest `EVENTS_KEPT` (see `EventStore.append_events`)."""
        check_events(run_id, events)
        self._append(run_id, events)

    def _append(self, run_id: str, events: Sequence[SealedEvent]) -> None:
        stream = self._events.setdefault(run_id, deque(maxlen=EVENTS_KEPT))
        for event in events:
            self._event_no += 1
            stream.append(StoredEvent(str(self._event_no), event))

    async def read_events(self, run_id: str, after: str | None = None, limit: int = 1000) -> Sequence[StoredEvent]:
        """The run's events after cursor `after`, oldest first (see `EventStore.read_events`)."""
        number = int_cursor(after)
        found = [e for e in self._events.get(run_id, ()) if int(e.cursor) > number]
        return found[: max(limit, 0)]

    def _live(self, run_id: str) -> Lease | None:
        lease = self._leases.get(run_id)
        return lease if lease is not None and lease.expires_at > time.time() else None

    async def take_lease(self, run_id: str, owner: str, token: str, ttl_s: float) -> Lease:
        """Take the run's lease unless another live token holds it (see `CheckpointStore.take_lease`)."""
        check_lease_args(owner, token, ttl_s)
        held = self._live(run_id)
        if held is not None and held.token != token:
            return held
        self._leases[run_id] = Lease(run_id, owner, token, time.time() + ttl_s)
        return self._leases[run_id]

    async def renew_lease(self, run_id: str, token: str, ttl_s: float) -> Lease | None:
        """Extend the lease if `token` still holds it (see `CheckpointStore.renew_lease`)."""
        held = self._live(run_id)
        if held is None or held.token != token:
            return None
        self._leases[run_id] = Lease(run_id, held.owner, token, time.time() + ttl_s)
        return self._leases[run_id]

    async def release_lease(self, run_id: str, token: str) -> bool:
        """Give the lease up if `token` holds it."""
        held = self._leases.get(run_id)
        if held is None or held.token != token:
            return False
        del self._leases[run_id]
        return held.expires_at > time.time()

    async def leases(self, run_ids: Sequence[str]) -> Mapping[str, Lease]:
        """The live leases among `run_ids`."""
        return {run_id: lease for run_id in run_ids if (lease := self._live(run_id)) is not None}

    def _live_marker(self, key: str) -> Marker | None:
        marker = self._markers.get(key)
        return marker if marker is not None and marker.expires_at > time.time() else None

    async def put_marker(self, key: str, value: str, token: str, ttl_s: float) -> Marker:
        """Set the marker unless another token's is live (see `MarkerStore.put_marker`)."""
        check_marker_args(key, value, token, ttl_s)
        held = self._live_marker(key)
        if held is not None and held.token != token:
            return held
        self._markers[key] = Marker(key, value, token, time.time() + ttl_s)
        return self._markers[key]

    async def peek_markers(self, keys: Sequence[str]) -> Mapping[str, Marker]:
        """The live markers among `keys`."""
        return {key: marker for key in keys if (marker := self._live_marker(key)) is not None}

    async def take_marker(self, key: str, token: str) -> bool:
        """Remove the marker if `token` set it; whether it was live."""
        held = self._markers.get(key)
        if held is None or held.token != token:
            return False
        del self._markers[key]
        return held.expires_at > time.time()

    async def aclose(self) -> None:
        """Nothing to release."""
