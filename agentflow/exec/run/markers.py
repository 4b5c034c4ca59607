"""Markers: agentflow's signed notes beside runs, kept in the store's markers (`MarkerStore`), never in its leases.

A marker says something for a while about a run (or about agentflow's own work), so that
every worker sharing the store knows it:

- ``cancel/<run>``: an operator asks the run's holder to stop it (`run.cancel`);
- ``quarantined/<run>``, ``unknown-flow/<run>``: recover_all reported the run and leaves it
  alone (`run.quarantine`);
- ``recovering/<run>``: a recovery was sent for the run at a step, on a rung of a back-off
  (`agentflow.celery._resends`);
- ``recheck/<run>``: a worker sends the recheck of a held run (`agentflow.celery._rechecks`);
- ``lock/recover_all``, ``lock/prune``: one sweep, one prune tick at a time (`Markers.holding`).

The rules, kept here and nowhere else:

- The store keeps a marker's key, value, token and expiry, and sets a key atomically: of
  many workers putting one free key, exactly one sets it (`MarkerStore.put_marker`).
- The value is the marker's body signed with the checkpoint key for its subject and kind
  (`Sealer.seal_request`), with ``at`` (when it was first set) and ``until`` (when it is
  meant to lapse) in the body. So whoever can write to the store but holds no key cannot
  make a marker that counts: one written by hand, moved to another run or kind, or signed
  with a key the reader lacks does not check; nor can they make one last: a marker whose
  signed ``until`` passed more than `SKEW_S` ago (an old one written back, or its expiry
  pushed out) is as good as lapsed.
- A marker lasts no longer than its signed ``until``, whatever the store says: a note's
  `Note.expires_at` is the earlier of the two, so a marker captured while it stood and
  written back with a far expiry keeps nobody out past the moment it was signed for.
- A marker lasts no longer than the longest its kind is ever set for (`Markers`' ``longest``,
  `ANY_KIND_S` for a kind not named there): one whose signed ``until`` or store expiry lies
  further out than that (plus `SKEW_S`) does not count, and a put refuses to set one
  (`ValueError`: the product never writes one).
- A marker that does not count is no marker: it is reported (a WARNING and a
  ``control.refused`` event) and removed by its own token when it is read, and a put
  replaces it. A marker never keeps a real one out for longer than it takes to read it.
- A marker steers nothing by itself being there: each reader decides what a marker that
  counts means (the run's holder ends the run for a cancel request; recover_all skips a
  quarantined run), and the fact that follows is signed in the run's own rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from agentflow._errors import CheckpointStoreCorrupt
from agentflow._events import Events
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.checkpoints.records import Marker
from agentflow.exec.seal import Sealer

log = logging.getLogger("agentflow.markers")

#: How far a marker's signed ``until`` may lie behind this host's clock before it no longer counts (seconds).
SKEW_S: Final = 30.0
#: How many times a put replaces a marker that does not count before it gives up.
_PUTS: Final = 3
#: The longest a marker of a kind without a bound of its own may last (seconds): the longest
#: any kind is set for (a Celery task's ``asked`` note, 90 days).
ANY_KIND_S: Final = 90 * 24 * 3600.0


@dataclass(frozen=True)
class Note:
    """A marker that counts: checked, opened, and still meant to be there."""

    kind: str
    subject: str
    body: Mapping[str, Any]
    """What the marker says (its ``at`` and ``until`` among it)."""
    token: str
    expires_at: float
    """When it lapses: the store's expiry, or its signed ``until`` when that comes first."""

    @property
    def at(self) -> float:
        """When the marker was first set (seconds since the epoch)."""
        return float(self.body["at"])


class MarkerBusy(Exception):
    """Another holder's marker stands where `Markers.holding` would put one."""

    def __init__(self, holder: Note) -> None:
        super().__init__(f"{holder.kind}/{holder.subject} is held by {holder.body.get('owner', 'another worker')}")
        self.holder = holder


def key_of(kind: str, subject: str) -> str:
    """The store key of the marker of `kind` about `subject`."""
    return f"{kind}/{subject}"


def marker_value(
    sealer: Sealer, kind: str, subject: str, body: Mapping[str, Any], ttl_s: float, now: float | None = None
) -> tuple[dict[str, Any], str]:
    """What a marker of `kind` about `subject` that says `body` signs, and the value stored for it.

    The signed body is `body` with ``at`` (`now`, unless the body has one) and ``until``
    (`ttl_s` after `now`); `now` defaults to this host's clock.
    """
    at = time.time() if now is None else now
    signed = {"at": at, **body, "until": at + ttl_s}
    return signed, sealer.seal_request(subject, f"marker/{kind}", signed)


class Markers:
    """The markers of one store, signed and checked with one sealer (see the module docstring)."""

    def __init__(
        self,
        store: CheckpointStore,
        sealer: Sealer,
        events: Events | None = None,
        longest: Mapping[str, float] | None = None,
    ) -> None:
        """`events`: where a marker that does not count is reported (``control.refused``), beside the WARNING.

        `longest`: by kind, the longest a marker of that kind is ever set for (seconds), as the
        caller's settings set them (`ANY_KIND_S` for a kind not named). Workers sharing a store
        share these settings: a marker from one set longer than another's bound does not count there.
        """
        self._store = store
        self._sealer = sealer
        self._events = events
        self._longest = dict(longest or {})

    def longest(self, kind: str) -> float:
        """The longest a marker of `kind` may last (seconds)."""
        return self._longest.get(kind, ANY_KIND_S)

    def _open(self, kind: str, subject: str, marker: Marker) -> Note:
        """The note `marker` carries.

        Raises:
            CheckpointStoreCorrupt: it does not count (see the module docstring).
        """
        body = self._sealer.open_request(marker.value, subject, f"marker/{kind}")
        at, until = body.get("at"), body.get("until")
        if not isinstance(at, int | float) or not isinstance(until, int | float):
            raise CheckpointStoreCorrupt(f"the {kind} marker of {subject!r} is signed but has no at and until")
        now = time.time()
        if until + SKEW_S < now:
            raise CheckpointStoreCorrupt(f"the {kind} marker of {subject!r} was meant to lapse at {until}")
        furthest = now + self.longest(kind) + SKEW_S
        for what, when in (("is signed to last", until), ("is kept by the store", marker.expires_at)):
            if when > furthest:
                raise CheckpointStoreCorrupt(
                    f"the {kind} marker of {subject!r} {what} {when - now:.0f} s more, longer than a {kind} "
                    f"marker is ever set for ({self.longest(kind):.0f} s)"
                )
        return Note(kind, subject, body, marker.token, min(marker.expires_at, float(until)))

    async def _refuse(self, kind: str, subject: str, marker: Marker, why: str) -> None:
        log.warning("removing a %s marker that does not count: %s", kind, why, extra={"run_id": subject})
        if self._events is not None:
            self._events.emit("control.refused", subject, kind=kind, why=why)
        await self._store.take_marker(marker.key, marker.token)

    async def put(
        self, kind: str, subject: str, body: Mapping[str, Any], ttl_s: float, token: str | None = None
    ) -> tuple[bool, Note]:
        """Set the marker of `kind` about `subject` for `ttl_s`, unless one that counts stands.

        `token`: the token of a marker this caller set before (then the put renews it,
        with this body); None: a new one. ``at`` is added to the body unless it has one.

        Returns:
            Whether this call set it, and the note that stands.

        Raises:
            CheckpointStoreCorrupt: markers that do not count keep appearing as fast as
                they are removed (someone writes to the store's markers).
            ValueError: `ttl_s` is longer than a marker of `kind` may last (`longest`).
        """
        if ttl_s > self.longest(kind):
            raise ValueError(f"a {kind} marker lasts {self.longest(kind)} s at most, not {ttl_s}")
        signed, value = marker_value(self._sealer, kind, subject, body, ttl_s)
        mine = token or secrets.token_hex(16)
        key = key_of(kind, subject)
        for _ in range(_PUTS):
            stands = await self._store.put_marker(key, value, mine, ttl_s)
            if stands.token == mine:
                return True, Note(kind, subject, signed, mine, min(stands.expires_at, signed["until"]))
            try:
                return False, self._open(kind, subject, stands)
            except CheckpointStoreCorrupt as exc:
                await self._refuse(kind, subject, stands, str(exc))
        raise CheckpointStoreCorrupt(
            f"a {kind} marker of {subject!r} that does not count keeps reappearing: "
            "someone writes to the store's markers"
        )

    async def peek(self, kind: str, subjects: Sequence[str]) -> dict[str, Note]:
        """The markers of `kind` that count among `subjects`, by subject (the others are reported and removed)."""
        if not subjects:
            return {}
        by_key = {key_of(kind, subject): subject for subject in subjects}
        found: dict[str, Note] = {}
        keys = list(by_key)
        for start in range(0, len(keys), 500):
            found.update(await self.opened(kind, by_key, await self._store.peek_markers(keys[start : start + 500])))
        return found

    async def opened(self, kind: str, by_key: Mapping[str, str], markers: Mapping[str, Marker]) -> dict[str, Note]:
        """The markers of `kind` read elsewhere (keys as `by_key` maps them to subjects) that count, by subject.

        What `peek` does with what it read; the others are reported and removed.
        """
        found: dict[str, Note] = {}
        for key, marker in markers.items():
            subject = by_key[key]
            try:
                found[subject] = self._open(kind, subject, marker)
            except CheckpointStoreCorrupt as exc:
                await self._refuse(kind, subject, marker, str(exc))
        return found

    async def take(self, note: Note) -> bool:
        """Remove the marker `note` was read from (unless another was put since); whether it was live."""
        return await self._store.take_marker(key_of(note.kind, note.subject), note.token)

    async def take_all(self, kind: str, subjects: Sequence[str]) -> list[Note]:
        """Remove every marker of `kind` among `subjects`; the notes removed."""
        return [note for note in (await self.peek(kind, subjects)).values() if await self.take(note)]

    @contextlib.asynccontextmanager
    async def holding(self, kind: str, subject: str, owner: str, ttl_s: float) -> AsyncIterator[Note]:
        """Hold the marker while the block runs, put again every third of `ttl_s`, taken afterwards.

        A holder that dies stops putting it, and it lapses `ttl_s` later at most.

        Raises:
            MarkerBusy: another holder's marker stands (the block does not run).
        """
        body = {"owner": owner, "at": time.time()}
        mine, note = await self.put(kind, subject, body, ttl_s)
        if not mine:
            raise MarkerBusy(note)
        stop = asyncio.Event()
        renewing = asyncio.ensure_future(self._renew(kind, subject, body, ttl_s, note.token, stop))
        try:
            yield note
        finally:
            stop.set()  # a put in flight ends first: a command cut off half-way could spoil the connection
            await renewing
            try:
                await self.take(note)
            except Exception as exc:  # it lapses on its own
                log.warning("could not remove the %s marker of %s (it lapses in %s s): %s", kind, subject, ttl_s, exc)

    async def _renew(
        self, kind: str, subject: str, body: Mapping[str, Any], ttl_s: float, token: str, stop: asyncio.Event
    ) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), ttl_s / 3)
                return
            try:
                mine, holder = await self.put(kind, subject, body, ttl_s, token)
            except Exception as exc:  # the next renewal tries again; the marker lapses meanwhile at worst
                log.warning("could not renew the %s marker of %s: %s", kind, subject, exc)
                continue
            if not mine:
                log.warning("the %s marker of %s lapsed and was taken by %s", kind, subject, holder.body.get("owner"))
                return
