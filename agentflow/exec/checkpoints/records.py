"""The sealed rows a checkpoint store keeps: one per checkpoint, one per call record.

A store never looks inside ``payload``: it keeps the row and reads only the fields in
clear, which it needs for the compare-and-set, the fencing check and the run listing.
Every field in clear is also covered by the signature, so changing one of them in the
store is detected exactly like changing the payload.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import Field, dataclass, field, fields
from typing import Any, Final, Literal, NamedTuple, TypeAlias

from agentflow._errors import CheckpointStoreCorrupt

#: Statuses a checkpoint can carry. ``done``, ``failed`` and ``cancelled`` end the run.
Status = Literal["running", "paused", "done", "failed", "cancelled"]
ENDED: Final = frozenset({"done", "failed", "cancelled"})
#: Statuses after which a run takes no save at all. A ``failed`` run takes one more: the
#: claim of a retry (and still no ``started`` record before that claim).
FINAL: Final = frozenset({"done", "cancelled"})
UNFINISHED: Final = frozenset({"running", "paused"})

#: Kinds of call record. ``started`` comes first; the others close it.
CallKind = Literal["started", "done", "failed", "pending", "denied", "unrecordable"]


@dataclass(frozen=True, slots=True)
class SealedCheckpoint:
    """One signed checkpoint of a run, as a store keeps it."""

    run_id: str
    """The run this checkpoint belongs to."""
    step: int
    """Position in the run's checkpoint sequence: 0 for the first, then +1 per save."""
    flow: str
    """The flow's name (``loop:<name>`` for tool loops); a run never changes flow."""
    status: str
    """One of ``running``, ``paused``, ``done``, ``failed``, ``cancelled``."""
    segment: int
    """The call-log segment of the worker that holds the run: the step at which it claimed it."""
    saved_at: float
    """Wall-clock time of the save (seconds since the epoch), for listings."""
    payload: bytes
    """Canonical JSON of the checkpoint body; decoded only after the signature checks."""
    kid: str
    """Id of the key that signed this row."""
    sig: str
    """HMAC-SHA256 (hex) over the fields above and the payload."""

    @property
    def ended(self) -> bool:
        """Whether the run ended with this checkpoint."""
        return self.status in ENDED


@dataclass(frozen=True, slots=True)
class SealedCall:
    """One signed call-log record, as a store keeps it."""

    run_id: str
    """The run this record belongs to."""
    segment: int
    """The segment of the worker that wrote it (see `SealedCheckpoint.segment`)."""
    seq: int
    """Position within the segment: 0, 1, 2, ... with no gaps."""
    kind: str
    """One of ``started``, ``done``, ``failed``, ``pending``, ``denied``, ``unrecordable``."""
    payload: bytes
    """Canonical JSON of the record body; decoded only after the signature checks."""
    kid: str
    """Id of the key that signed this row."""
    sig: str
    """HMAC-SHA256 (hex) over the fields above and the payload."""
    durable: bool = field(default=False, metadata={"stored": False})
    """Whether the run must not go on until this record would survive the loss of the store's server.

    Set by the writer for the ``started`` record of a non-idempotent call; not signed and not
    stored (it says how to write the record, not what it says). A store that can wait for
    replicas or an fsync (`RedisCheckpointStore`'s ``wait_replicas``, ``wait_fsync``) waits for
    these; any other store ignores it.
    """


@dataclass(frozen=True, slots=True)
class Lease:
    """Who holds a run, and until when (a store keeps it apart from the signed rows).

    A lease is advisory ownership: it keeps a second worker, the CLI or the viewer from
    acting on a run that a live worker is moving. It is not what stops a worker that lost
    the run from acting twice: the segment fencing and the compare-and-set do that.
    """

    run_id: str
    """The run held."""
    owner: str
    """Who holds it, for people: ``<name>@<host>:<pid>``."""
    token: str
    """Random per take: only the holder of this token renews or releases the lease."""
    expires_at: float
    """When it lapses unless renewed (seconds since the epoch, on the store's clock)."""


@dataclass(frozen=True, slots=True)
class LeaseMove:
    """A change of a run's lease made in the same atomic write as a call record or a save (`LeaseMoving`).

    The write is applied only while the run's lease is free, lapsed or held by `bearer`;
    the lease then becomes `to`'s (as `owner`, for `ttl_s` seconds from the store's now),
    or is given up when `to` is None. While another token holds it live, nothing is
    written and the store raises `RunHeld` naming that holder.
    """

    bearer: str
    """The token the writer bears: its own lease's, or a baton's handed to it."""
    to: str | None
    """The token that holds the lease after the write (the bearer's again: renewed); None: given up."""
    owner: str
    """Who holds it after the write, for people."""
    ttl_s: float
    """How long the lease lasts after the write, unless renewed."""


@dataclass(frozen=True, slots=True)
class Marker:
    """A note agentflow leaves in the store beside a run, apart from its leases and rows (`MarkerStore`).

    What agentflow keeps there: a cancel request waiting for a run's holder, a run reported
    as quarantined, a recovery or recheck sent, the lock of a sweep. The store treats the
    value as opaque text; agentflow signs it (`agentflow.exec.run.markers`), so a marker
    someone wrote by hand is read as no marker at all.
    """

    key: str
    """What the marker is about: ``<kind>/<subject>``."""
    value: str
    """What it says (opaque to the store)."""
    token: str
    """Random per put: only a put or take with this token replaces or removes it."""
    expires_at: float
    """When it lapses unless put again with its token (seconds since the epoch, on the store's clock)."""


@dataclass(frozen=True, slots=True)
class Pruned:
    """What a prune deleted: whole runs, each with every row and entry it had."""

    run_ids: tuple[str, ...]
    """The runs deleted, in the order they were asked for."""
    rows: int
    """How many checkpoint rows and call records were deleted with them."""
    refused: tuple[tuple[str, str], ...] = ()
    """``(run id, why)`` of listed runs left with a problem: their newest checkpoint did not check
    (`retention.judged_rows`), or the store holds more of the run than that row accounts for (`rules.beyond_judged`)."""

    def __add__(self, other: Pruned) -> Pruned:
        return Pruned(self.run_ids + other.run_ids, self.rows + other.rows, self.refused + other.refused)


@dataclass(frozen=True, slots=True)
class Trimmed:
    """What a trim deleted: every checkpoint but the newest of some finished runs (the runs stay)."""

    run_ids: tuple[str, ...]
    """The runs trimmed, in the order they were asked for."""
    rows: int
    """How many checkpoint rows were deleted from them (call records are never trimmed)."""
    refused: tuple[tuple[str, str], ...] = ()
    """``(run id, why)`` of listed runs left with a problem: their newest checkpoint did not check
    (`retention.judged_rows`), or the store holds more of the run than that row accounts for (`rules.beyond_judged`)."""

    def __add__(self, other: Trimmed) -> Trimmed:
        return Trimmed(self.run_ids + other.run_ids, self.rows + other.rows, self.refused + other.refused)


@dataclass(frozen=True, slots=True)
class Bookkeeping:
    """What a store keeps of one run beside its signed rows, in clear, read in one instant (`BookkeepingReading`).

    None of it is signed: whoever can write to the store can set any of it. Every store
    agentflow ships keeps it equal to what the rows say, so a difference is a write made
    behind the store's back (`agentflow.exec.run.erasure` reports it).
    """

    newest: tuple[int, str, str] | None
    """The newest stored checkpoint row's step, flow and status, from its header (None: no row)."""
    listed: tuple[int, str, str] | None
    """The step, flow and status the run's listing entry names (Redis ``latest`` hash, the SQL ``runs`` row).

    None: no entry (what ``verify --all`` reports as a run the listing index forgot)."""
    counted: Mapping[int, tuple[int, int]] | None
    """Per segment: what its record counter says and how many records are stored.

    None: the store keeps no counter apart from its records (it counts rows)."""


def listing_bookkeeping(row: Sequence[Any] | None, what: str) -> Bookkeeping:
    """The bookkeeping of a store that counts rows (SQL): its newest checkpoint row and its listing row, as read.

    Args:
        row: ``(step, flow, status)`` of the newest checkpoint row, then of the ``runs`` row
            (NULLs when there is none), read in one statement; None when no checkpoint row is stored.
        what: names the store and the run in an error.

    Raises:
        CheckpointStoreCorrupt: a value is not of its column's type.
    """
    if row is None:
        return Bookkeeping(None, None, None)
    values = tuple(row)
    kinds = (int, str, str)
    if len(values) != 6 or not all(isinstance(v, k) for v, k in zip(values[:3], kinds, strict=True)):
        raise CheckpointStoreCorrupt(f"{what}: the newest checkpoint row's step, flow or status cannot be read")
    entry = values[3:]
    if entry[0] is None:
        return Bookkeeping((values[0], values[1], values[2]), None, None)
    if not all(isinstance(v, k) for v, k in zip(entry, kinds, strict=True)):
        raise CheckpointStoreCorrupt(f"{what}: the runs row's step, flow or status cannot be read")
    return Bookkeeping((values[0], values[1], values[2]), (entry[0], entry[1], entry[2]), None)


class JudgedRow(NamedTuple):
    """What a prune or trim judged of one run: its newest checkpoint row, checked, and what that row accounts for.

    A store compares it, inside its atomic step, with what it holds of the run: the run goes
    only while nothing lies beyond this row (`rules.beyond_judged`). The store cannot check a
    signature nor read a body; every field here comes from the signed row the caller checked.
    """

    step: int
    """The row's step: it must still be the newest row's."""
    sig: str
    """The row's signature: the newest row must still carry it."""
    segment: int | None = None
    """The row's call-log segment (signed); None: the store reads the stored row's own (its column or header)."""
    counts: tuple[tuple[int, int], ...] | None = None
    """``(segment, records)`` the row accounts for: its own segment's count when it was saved (its ``log``
    marker) and the counts its segment's claim pinned of earlier ones (its ``pins``); a segment it does not
    name has none. None: the caller read no such marker, and only the segments are compared."""


#: What a prune or trim judged, per run id (`JudgedRow`; a bare ``(step, sig)`` is one with nothing else known).
#: A store given it deletes a run only while that very row is still the run's newest and nothing lies beyond
#: it (`RetentionStore.prune`, `TrimStore.trim`); a run without an entry is left.
JudgedRows: TypeAlias = Mapping[str, JudgedRow | tuple[int, str]]


def judged_row(row: SealedCheckpoint, counts: Mapping[int, int] | None = None) -> JudgedRow:
    """What a prune or trim passes on of a row it judged: its step, signature, segment and `counts` (`JudgedRow`)."""
    return JudgedRow(row.step, row.sig, row.segment, None if counts is None else tuple(sorted(counts.items())))


#: How many event entries (appends) a store keeps per run: appending more drops the oldest (Redis trims
#: approximately, so it may keep a few more).
EVENTS_KEPT: Final = 10_000


@dataclass(frozen=True, slots=True)
class SealedEvent:
    """One signed entry of a run's event stream (one append's events), as a store keeps it."""

    run_id: str
    """The run the event happened in."""
    payload: bytes
    """Canonical JSON of ``{"pos", "events"}`` (`agentflow.exec.run.events`), decoded once its signature checks."""
    kid: str
    """Id of the key that signed this event."""
    sig: str
    """HMAC-SHA256 (hex) over the run id and the payload."""


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """A sealed event as read back, with the cursor the store gave it."""

    cursor: str
    """Opaque and ordered per run: reading after it returns the events appended after this one."""
    event: SealedEvent
    """The event, still sealed."""


def stored_fields(cls: type[Any]) -> tuple[Field[Any], ...]:
    """The fields of a sealed row that a store keeps, in order (not `SealedCall.durable`: how to write, not what)."""
    return tuple(f for f in fields(cls) if f.metadata.get("stored", True))


#: The status of `unreadable`'s stand-in rows (no checkpoint has it).
UNREADABLE: Final = "unreadable"


def unreadable(run_id: str, why: str) -> SealedCheckpoint:
    """What a listing gives for a run whose newest row the store cannot even decode.

    A stand-in, not a row: no signature (``kid`` and ``sig`` empty, so no reader can take
    it for a checkpoint), status `UNREADABLE`, the store's complaint as its payload. One
    broken row then shows as one bad run in a listing instead of failing the listing, and
    hiding every other run with it. Reading the run itself still raises.
    """
    return SealedCheckpoint(run_id, 0, "", UNREADABLE, 0, 0.0, why.encode(), "", "")


def is_unreadable(row: SealedCheckpoint) -> bool:
    """Whether `row` is `unreadable`'s stand-in."""
    return row.status == UNREADABLE and not row.sig


def listed(run_id: str, decode: Callable[[], SealedCheckpoint]) -> SealedCheckpoint:
    """A listing's row of run `run_id`: `decode()`, or `unreadable`'s stand-in when the store cannot decode it."""
    try:
        return decode()
    except CheckpointStoreCorrupt as exc:
        return unreadable(run_id, str(exc))
