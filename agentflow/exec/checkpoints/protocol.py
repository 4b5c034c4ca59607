"""The port every checkpoint store implements.

Rules every backend keeps (the conformance suite in `conformance.py` checks each one):

- `save` is a compare-and-set: step 0 only for a run the store does not have; any other
  step exactly one past the stored latest. A run whose latest checkpoint ended (``done``
  or ``failed``) takes no more saves, and a run never changes flow.
- `record_call` appends to the run's call log. Records are numbered per segment from 0
  with no gaps. A ``started`` record is refused unless its segment is the segment of the
  run's latest checkpoint (fencing): a worker that lost the run starts no new call.
- Both are atomic against every other writer the backend supports (one process for the
  memory store; every process on the host for SQLite; every client for Redis and SQL).
- Stores keep rows exactly as given and never decode payloads; checking signatures is the
  caller's job (`agentflow.exec.seal`).

The rest of the contract, which callers use as plainly as the methods above (a store that
wraps another must forward them too, or callers lose them silently):

- ``save_after_calls(run_id, step, checkpoint, calls)``: append `calls`, then save
  `checkpoint`, all or nothing. A superstep whose last call finished just before its
  checkpoint stores the ``done`` record and the checkpoint in one commit or round trip.
- ``head(run_id)``: the latest checkpoint and the number of call records per segment, read
  no earlier than the checkpoint, so a distributed superstep sees a clean handoff without
  reading the log.
- ``stored_runs()``: every run id with a stored checkpoint row, found from the rows
  themselves rather than the listing index, so a run whose index entry is gone still shows.
- ``relist(run_id)``: rebuild the run's listing-index entry from its newest checkpoint
  row, so a run `stored_runs` found but the listings lost can be recovered again.
- ``local_key``: the signing key of a store that lives in one process (the memory store),
  None for every store shared with other processes.
- Leases (``take_lease``, ``renew_lease``, ``release_lease``, ``leases``): who holds a run
  and until when. A take is atomic against every other taker the backend supports: of
  racing takers of a free or lapsed lease exactly one gets it. Only the holder's token
  renews or releases it; a lapsed lease is free, whatever its row or key still says.
  Expiry is judged on the store's clock where there is one (Redis, PostgreSQL), so hosts
  with skewed clocks still agree. Leases need no checkpoint (a run is held before its
  step 0 is saved) and `delete` forgets the run's lease with its rows.

A step 0 is refused whenever any row of the run id is stored, even when the entry the
compare-and-set reads (the listing row, the latest hash) is missing: a new run never
starts over an old one's rows.

A store written outside agentflow can take default ``head``, ``save_after_calls`` and
``local_key`` from `agentflow.exec.checkpoints.StoreDefaults` (``_defaults``); the stores
agentflow ships implement each of them natively. ``stored_runs`` and ``relist`` have no
default: only the backend knows where its rows and its listing index are.

Retention (`RetentionStore`: ``prunable`` and ``prune``) is the port's optional part: a
store that has it prunes finished runs in batches, natively; any other store (a wrapper
that forwards only `CheckpointStore`, a third-party store) is pruned by the generic
version built on the methods above (`_defaults.default_prune`), one run at a time.
Callers go through `agentflow.exec.checkpoints.retention`, which picks one or the other.
A prune (and a trim) takes the rows the caller judged (`JudgedRows`: each run's newest
checkpoint row, by step and signature, whose signature the caller checked) and deletes a
run only while that very row is still its newest, compared inside the store's atomic step:
a save that lands between the judgement and the delete keeps the run, whatever the fields
the store keeps in clear say.
Trimming (`TrimStore`: ``trimmable`` and ``trim``) is optional apart from pruning: a store
that has it deletes every checkpoint but the newest of finished runs and keeps the rest of
each run. The port has no way to delete one checkpoint, so there is no generic trim: a
store without `TrimStore` is refused with a `NotImplementedError` that says so.

Event streams (`EventStore`: ``append_events`` and ``read_events``) are optional too: a
store that has them keeps every event of a run, in order, readable from any process with
a cursor (`agentflow.exec.run.events`); a store without them (a wrapper that forwards only
`CheckpointStore`) simply records no stream. A run's events go with the run: ``delete`` and
``prune`` remove them. A store with `EventCompacting` also packs a finished run's stream
into fewer bytes, cursors and entries unchanged (the Redis store: one compressed entry).

Lease moves (`LeaseMoving`: ``record_call_moving`` and ``save_after_calls_moving``) are
optional as well: a store that has them gives a run's lease up (or hands it on) in the
same atomic write as a save, so the save that ends a holder's last step is also its
release, one round trip instead of two (`agentflow.exec.run.lease.Tenure`), and carries
the run's events not yet appended with it; a store without them is released on its own
afterwards, and its events appended on their own.

Confirming durability (`DurabilityConfirming`: ``confirm_durable``) is optional too: a store
whose writes can wait for replicas or a disk (the Redis store's ``wait_replicas`` and
``wait_fsync``) confirms on demand that what it holds of a run is acknowledged as such a
write would be. A start retried with a run's id asks it before it attaches to the run
(`agentflow.exec.run.protocol`); any other store's writes are as durable as they will be.

A lease take that reads the head (`HeadReading`: ``take_lease_reading_head``) is optional
too: a store that has it starts a worker's superstep with one round trip (the Redis store:
the lease, the run's head and its cancel request in one script); any other store's head is
read beside its take.

Reading a run's bookkeeping (`BookkeepingReading`: ``bookkeeping``) is optional too: a store
that keeps anything of a run in clear beside its rows (the SQL ``runs`` row, Redis' ``latest``
hash and per-segment record counters) reads it in one instant, so ``agentflow verify`` can
hold it against the rows and say what a write behind the store's back erased or rewound
(`agentflow.exec.run.erasure`). The memory store keeps nothing such, and has no such part.

`has_part(store, Part)` says whether a store has an optional part, cheaply enough to ask
on every run.
"""

from __future__ import annotations

import weakref
from collections.abc import Collection, Mapping, Sequence
from typing import Protocol, runtime_checkable

from agentflow.exec.checkpoints.records import (
    Bookkeeping,
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


@runtime_checkable
class MarkerStore(Protocol):
    """The marker part of the port: small notes with an expiry, kept apart from the leases (`Marker`).

    A marker is not a lease: nothing fences on it, and no run's lease is ever one. It is a
    key set for a while, atomically against every other put and take of that key, judged
    on the store's clock as leases are, so that of many workers exactly one sets it.
    """

    async def put_marker(self, key: str, value: str, token: str, ttl_s: float) -> Marker:
        """Set marker `key` to `value` for `ttl_s` seconds, unless another token's marker is live there.

        A live marker of the same `token` is replaced, value and expiry (a renewal); a lapsed
        one of any token is overwritten. Atomic: of racing puts with different tokens, exactly
        one sets a free key.

        Returns:
            The marker as it stands afterwards: this token's, or the live one that stayed
            (compare ``marker.token`` with `token`).

        Raises:
            ValueError: `key`, `value` or `token` is empty, or `ttl_s` is not positive.
        """
        ...

    async def peek_markers(self, keys: Sequence[str]) -> Mapping[str, Marker]:
        """Return the live marker of each of `keys` that has one (lapsed and absent ones are left out)."""
        ...

    async def take_marker(self, key: str, token: str) -> bool:
        """Remove the marker if `token` set it (live or lapsed); return whether it was live.

        Another token's marker stays.
        """
        ...


@runtime_checkable
class CheckpointStore(MarkerStore, Protocol):
    """Where runs keep their checkpoints and call logs (and their markers: every store has them, `MarkerStore`)."""

    #: Whether the store lives inside one process (then no shared key is required).
    in_process: bool

    async def save(self, run_id: str, step: int, checkpoint: SealedCheckpoint) -> None:
        """Store `checkpoint` as `step` of `run_id` (0 for a new run, else exactly latest + 1).

        Raises:
            CheckpointConflict: the step is taken or skips ahead, the run ended, or the run
                belongs to another flow.
            ValueError: `checkpoint` does not carry `run_id` and `step`.
        """
        ...

    async def latest(self, run_id: str) -> SealedCheckpoint:
        """Return the run's newest checkpoint.

        Read from the checkpoint rows, not from the listing index, so a run whose index
        entry is missing or stale still has its newest row read here (`relist` mends the entry).

        Raises:
            CheckpointNotFound: nothing is stored for `run_id`.
        """
        ...

    async def history(self, run_id: str) -> Sequence[SealedCheckpoint]:
        """Return every checkpoint of the run, oldest first (empty if there is none)."""
        ...

    async def list_unfinished(self, flow: str) -> Sequence[str]:
        """Return the ids of the flow's runs whose latest checkpoint is ``running`` or ``paused``."""
        ...

    async def list_runs(self, flow: str | None = None, limit: int = 1000) -> Sequence[SealedCheckpoint]:
        """Return the latest checkpoint of up to `limit` runs (of one flow, or all), newest first."""
        ...

    async def delete(self, run_id: str) -> None:
        """Remove every checkpoint and call record of the run (nothing happens if there is none)."""
        ...

    async def record_call(self, run_id: str, record: SealedCall) -> None:
        """Append `record` to the run's call log.

        Raises:
            CheckpointNotFound: the run has no checkpoint.
            CheckpointConflict: the record's position in its segment is taken or leaves a
                gap, or it is a ``started`` record whose segment is not the run's latest
                (the writer was fenced), or the run ended.
        """
        ...

    async def calls(self, run_id: str) -> Sequence[SealedCall]:
        """Return the run's call records ordered by segment, then sequence number."""
        ...

    async def save_after_calls(
        self, run_id: str, step: int, checkpoint: SealedCheckpoint, calls: Sequence[SealedCall]
    ) -> None:
        """Append `calls` in order, then save `checkpoint`, as one write: all of it or nothing.

        Each record is checked under `record_call`'s rules against the run as it stands
        before this write (records earlier in `calls` count for the numbering), and the
        checkpoint under `save`'s. If any rule refuses, nothing at all is stored: none of
        the records, not the checkpoint. With no `calls` it is `save`.

        Raises:
            CheckpointConflict: a record or the checkpoint is refused (out of sequence,
                fenced, the step taken or skipped, the run ended or of another flow).
            CheckpointNotFound: `calls` is not empty and the run has no checkpoint.
            ValueError: `checkpoint` does not carry `run_id` and `step`, or a record is of
                another run.
        """
        ...

    async def head(self, run_id: str) -> tuple[SealedCheckpoint, Mapping[int, int]]:
        """Return the run's latest checkpoint and how many call records each segment holds.

        The counts are read no earlier than the checkpoint, so they may show records
        written after it but never miss one it saw. A segment without records may be
        absent from the mapping.

        Raises:
            CheckpointNotFound: nothing is stored for `run_id`.
        """
        ...

    async def stored_runs(self) -> Sequence[str]:
        """Return the id of every run that has at least one stored checkpoint row, sorted ascending.

        Found from the checkpoint rows (keys, table rows) themselves, never from the listing
        index that `list_runs` and `list_unfinished` read, so a run whose index entry was
        deleted or lost is still found. Meant for audits and repairs, not hot paths: it may
        walk the whole store.
        """
        ...

    async def relist(self, run_id: str) -> SealedCheckpoint | None:
        """Rebuild the run's listing-index entry from its newest checkpoint row; return that row.

        The listing index is what the store keeps beside the rows for `list_runs`,
        `list_unfinished`, `latest` and the compare-and-set and fencing checks (the ``runs``
        row in SQL, the latest hash and sorted sets in Redis). When a run's entry is missing
        (deleted by hand, lost), or names an older step than the newest stored row (the
        index was rolled back), or disagrees with that row in any field in clear, the entry
        is written again from the newest row's fields in clear (step, flow, status,
        segment, saved_at), in one transaction or script. When the entry already matches
        the newest row, nothing is written: a relist of a healthy run changes nothing.
        Afterwards every operation works for the run as if its last save had just kept the
        index: `latest`, the listings, a save of the next step, `record_call` and its
        fencing, `head`.

        Relist never writes, changes or deletes a checkpoint or call row, only the index,
        and never decodes a payload. So it can list again a row someone forged: the caller
        must check the returned row's signature (`agentflow.exec.seal`) before it
        trusts or acts on the run, and should relist only runs it means to recover.

        Returns:
            The run's newest checkpoint row, or None when the run has no checkpoint row
            (then nothing is written, even if a stale index entry names the run).

        Raises:
            CheckpointStoreCorrupt: the run's rows cannot be read as the store wrote them.
        """
        ...

    async def take_lease(self, run_id: str, owner: str, token: str, ttl_s: float) -> Lease:
        """Take the run's lease for `ttl_s` seconds unless another token holds it and it has not lapsed.

        Taking it again with the token that holds it renews it. Atomic: of racing takers
        exactly one gets a free or lapsed lease.

        Returns:
            The lease as it stands afterwards: this token's (taken) or the live holder's
            (compare ``lease.token`` with `token`).

        Raises:
            ValueError: `ttl_s` is not positive, or `owner` or `token` is empty.
        """
        ...

    async def renew_lease(self, run_id: str, token: str, ttl_s: float) -> Lease | None:
        """Push the lease's expiry to `ttl_s` from now if `token` holds it and it has not lapsed.

        Returns:
            The renewed lease, or None when the token no longer holds it (it lapsed, was
            taken by another, or released): the holder lost the run.
        """
        ...

    async def release_lease(self, run_id: str, token: str) -> bool:
        """Give the lease up if `token` holds it; return whether it did (another's lease stays)."""
        ...

    async def leases(self, run_ids: Sequence[str]) -> Mapping[str, Lease]:
        """Return the live lease of each of `run_ids` that has one (lapsed and free ones are absent)."""
        ...

    @property
    def local_key(self) -> bytes | None:
        """The store's own signing key if it lives in one process, else None.

        Only an in-process store (`in_process`) may have one: nothing it signs leaves the
        process, so a runner given no ``checkpoint_key`` can sign with it.
        """
        ...

    async def aclose(self) -> None:
        """Release connections (the store can still be used again afterwards)."""
        ...


@runtime_checkable
class DurabilityConfirming(Protocol):
    """An optional part of the port: a store that confirms what it holds of a run is durable (see the notes)."""

    async def confirm_durable(self, run_id: str) -> None:
        """Return once everything the store holds of the run is acknowledged as its durable writes are.

        Raises:
            StoreNotDurable: not acknowledged in time (nothing is lost: ask again).
        """
        ...


@runtime_checkable
class LeaseMoving(Protocol):
    """An optional part of the port: a run's lease moved in the same atomic write as a record or a save.

    What lets the save that ends a holder's last step give the run's lease up with it, in
    one round trip (`agentflow.exec.run.lease.Tenure`), and a lease be handed on or taken
    with a write. Each method is its plain counterpart's write, with `LeaseMove`'s rule
    checked first, in the same transaction or script: both happen or neither does.
    """

    async def record_call_moving(self, run_id: str, record: SealedCall, move: LeaseMove) -> None:
        """`record_call`, moving the run's lease as `move` says.

        Raises:
            RunHeld: another token holds the lease live (nothing is written).
            CheckpointConflict, CheckpointNotFound: as `record_call` (the lease is not moved).
        """
        ...

    async def save_after_calls_moving(
        self,
        run_id: str,
        step: int,
        checkpoint: SealedCheckpoint,
        calls: Sequence[SealedCall],
        move: LeaseMove,
        events: Sequence[SealedEvent] = (),
    ) -> None:
        """`save_after_calls` (with no `calls`: `save`), moving the run's lease as `move` says.

        `events` are appended to the run's stream (`EventStore.append_events`) when the save
        is stored, and never when it is refused: in the same write where the store can (the
        memory, SQLite and Redis stores); the SQLAlchemy store appends them right after it,
        and logs an append that fails then (the save is stored). A store that keeps no
        streams drops them.

        Raises:
            RunHeld: another token holds the lease live (nothing is written).
            CheckpointConflict, CheckpointNotFound, ValueError: as `save_after_calls` (the lease is not moved,
                no event is appended).
        """
        ...


@runtime_checkable
class HeadReading(Protocol):
    """An optional part of the port: a lease take that reads the run's head, and a marker about it, with the take.

    What a worker's superstep starts with, in one round trip where the store can (the Redis
    store's lease script); `agentflow.exec.run.lease.take_reading_head` reads the head beside
    the take on any other store.
    """

    async def take_lease_reading_head(
        self, run_id: str, owner: str, token: str, ttl_s: float, marker: str | None = None
    ) -> tuple[Lease, tuple[SealedCheckpoint, Mapping[int, int]] | None, Marker | None]:
        """`take_lease`, and when it took the lease, `head` and the marker `marker` (``<kind>/<run_id>``) as they stand.

        The head is None when the lease was not taken or nothing is stored; the marker is None
        when none was asked, none is live, or the lease was not taken.

        Raises:
            ValueError: `marker` is not a key about this run.
        """
        ...


@runtime_checkable
class RetentionStore(Protocol):
    """The retention part of the port: find finished runs older than a cut-off, and delete them whole."""

    async def prunable(self, before: float, statuses: Collection[str], limit: int) -> Sequence[str]:
        """Return the ids of up to `limit` runs a prune would take now, oldest first.

        A run qualifies when its newest checkpoint's status is one of `statuses` (statuses
        of a run that ended only), that checkpoint was saved before `before` (seconds since
        the epoch), and no live lease holds the run. Read from the listing index (a run it
        forgot is not found), without writing.

        Raises:
            ValueError: `statuses` names a status of a run that has not ended.
        """
        ...

    async def prune(
        self,
        run_ids: Sequence[str],
        before: float,
        statuses: Collection[str],
        owner: str,
        judged: JudgedRows | None = None,
    ) -> Pruned:
        """Delete each run of `run_ids` that still qualifies, whole; leave every other one as it is.

        Each run is judged again at the moment it is deleted, under the same rule as
        `prunable`, and deleted in one atomic step with everything the store keeps of it:
        its checkpoints, call records, lease and listing entries. A reader sees the run
        whole or not at all; a prune cut off midway leaves each run whole or gone; a run
        resumed or retried meanwhile (a new checkpoint, a live lease) is kept. The pruner
        holds the run's lease (as `owner`) while it deletes it. Unknown ids are skipped.

        `judged` is what the caller checked, per run: ``(step, sig)`` of the newest
        checkpoint row whose signature it verified (`retention.judged_rows`). Given it, the
        store deletes a run only if, inside that same atomic step, the run's newest
        checkpoint *row* (the last row stored, read from the rows themselves: never the
        listing index, the ``runs`` row or the latest hash, whose fields in clear anyone
        with write access can set) is still at that step and carries that signature. A run
        with no entry, or whose newest row is another (a save landed after the judgement:
        a retry's claim, a resume), is left whole, whatever the fields in clear say. Rows
        are append-only and signed, so a writer without the key cannot make another row
        the newest one and give it the judged row's signature short of rewriting stored
        rows. Nothing may lie beyond that row either, read in the same step
        (`rules.nothing_beyond`): no live cancel request, no call record of a newer segment
        or past the counts the row accounts for (`JudgedRow`); a run left for its log is
        returned in `Pruned.refused` with why. With None, the store's own re-judgement alone
        decides, its newest row standing for the judged one (a caller that judged no signed row).

        Raises:
            ValueError: `statuses` names a status of a run that has not ended, or an entry
                of `judged` is not a step and a signature.
        """
        ...


@runtime_checkable
class TrimStore(Protocol):
    """The trimming part of the port: keep only the newest checkpoint of finished runs older than a cut-off.

    Apart from `RetentionStore` so that a store written before it (with ``prunable`` and
    ``prune`` only) is still recognised as one: a runtime-checkable Protocol matches only
    a store with every one of its members.
    """

    async def trimmable(
        self, before: float, statuses: Collection[str], limit: int, since: float | None = None
    ) -> Sequence[tuple[str, float]]:
        """Return up to `limit` runs a trim would take now, as ``(run_id, saved_at)``, oldest first.

        A run qualifies when its newest checkpoint's status is one of `statuses` (statuses
        of a run that ended only), that checkpoint was saved before `before` and at or after
        `since` (None: no lower bound; the caller's cursor when it lists batch after
        batch), no live lease holds the run, the run is not a tool loop (`rules.trims`),
        and an older checkpoint of it is still stored (a trimmed run is not listed again).
        Read from the listing index (a run it forgot is not found), without writing.

        Raises:
            ValueError: `statuses` names a status of a run that has not ended.
        """
        ...

    async def trim(
        self,
        run_ids: Sequence[str],
        before: float,
        statuses: Collection[str],
        judged: JudgedRows | None = None,
    ) -> Trimmed:
        """Delete every checkpoint but the newest of each run of `run_ids` that still qualifies.

        Each run is judged again at the moment it is trimmed, under the same rule as
        `trimmable`, and trimmed in one atomic step: its older checkpoint rows go; its
        newest checkpoint, call records, lease, listing entries and events stay, so the run
        is read, listed, retried and resumed exactly as before (every reader of the latest
        state reads only the newest checkpoint and the call log). A trim cut off midway
        leaves each run trimmed or untouched; a run retried or resumed meanwhile (a new
        checkpoint, a live lease) is left. Unknown ids, and runs with one checkpoint, are
        skipped. A run retried after a trim and ended again qualifies again.

        `judged` pins each run to the newest row the caller checked, exactly as for
        `RetentionStore.prune`: the run is trimmed only if that row (its step and
        signature, compared with the newest stored row itself in the same atomic step) is
        still its newest, and nothing lies beyond it (as for a prune; a run left for its log
        is returned in `Trimmed.refused`); else, or with no entry, it is left untouched.
        None: the store's own re-judgement alone.

        Raises:
            ValueError: `statuses` names a status of a run that has not ended, or an entry
                of `judged` is not a step and a signature.
        """
        ...


@runtime_checkable
class EventStore(Protocol):
    """The event-stream part of the port: a bounded, ordered log of each run's events."""

    async def append_events(self, run_id: str, events: Sequence[SealedEvent]) -> None:
        """Append `events` to the run's stream, in order, each given the next cursor.

        Each is an entry (`SealedEvent`: the events of one append, to the recorder). The
        stream keeps the newest `EVENTS_KEPT` entries (Redis trims approximately: a few
        more). Appending needs no checkpoint: a run's first events come before its step 0.

        Raises:
            ValueError: an event is of another run.
        """
        ...

    async def read_events(self, run_id: str, after: str | None = None, limit: int = 1000) -> Sequence[StoredEvent]:
        """Return up to `limit` of the run's events appended after cursor `after` (from the oldest kept if None).

        Raises:
            ValueError: `after` is not a cursor this store gave.
        """
        ...


@runtime_checkable
class EventCompacting(Protocol):
    """Packing a finished run's stream into fewer bytes, every entry and cursor kept (optional)."""

    async def compact_events(self, run_id: str) -> bool:
        """Store the run's stream in a compact form, if nothing is appended meanwhile; whether it did.

        Afterwards `read_events` gives exactly what it gave before, after any cursor it gave:
        the same entries, with the same cursors. The recorder that stored a run's last event
        (``run.finished``, ``run.cancelled``) asks for it once; an append that comes after
        (a retried run's) goes on after the compact form, and a later compaction takes both.
        A failure leaves the stream as it was.
        """
        ...


@runtime_checkable
class BookkeepingReading(Protocol):
    """Reading what a store keeps of a run in clear beside its rows, in one instant (optional; audits only)."""

    async def bookkeeping(self, run_id: str) -> Bookkeeping:
        """The run's newest row header, its listing entry and its record counters, as they stand together.

        Decodes no payload and trusts nothing: the caller compares (`agentflow.exec.run.erasure`).

        Raises:
            CheckpointStoreCorrupt: the newest row's header cannot be read.
        """
        ...


#: (store class, optional part) -> whether the class's stores have that part (`has_part`).
_HAS: dict[tuple[type, type], bool] = {}


def has_part(store: object, part: type) -> bool:
    """Whether `store` has the optional part `part` of the port (a runtime-checkable protocol).

    The answer is kept per store class: checking a runtime protocol walks its members each
    time (tens of microseconds), and this is asked on every run. For a class that answers
    attributes itself (``__getattr__``: a wrapper has a part exactly when what it wraps has
    it), it is kept per store instead, for as long as the store lives.
    """
    if store is None:
        return False
    kind = type(store)
    has = _HAS.get((kind, part))
    if has is not None:
        return has
    if not hasattr(kind, "__getattr__"):
        has = _HAS[kind, part] = isinstance(store, part)
        return has
    try:
        kept = _HAS_BY_STORE.setdefault(store, {})
    except TypeError:  # not weakly referable: asked afresh each time
        return isinstance(store, part)
    if part not in kept:
        kept[part] = isinstance(store, part)
    return kept[part]


#: Wrapper store -> {optional part: whether it has it} (`has_part`), forgotten with the store.
_HAS_BY_STORE: weakref.WeakKeyDictionary[object, dict[type, bool]] = weakref.WeakKeyDictionary()
