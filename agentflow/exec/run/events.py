"""A run's event stream: recorded from the `Events` hub into the store, read back from any process.

- `recording` wraps the block in which a process holds a run (`RunProtocol.hold`): every
  event the hub emits for that run is buffered and appended to the store's stream
  (`EventStore`) by one background task, in emit order, once it has waited `FLUSH_AFTER_S`
  (50 ms) for others to share the append. So a superstep of a few milliseconds costs one
  append, not one per event, and a long tool call still shows its ``tool.started`` while it
  runs. Leaving the block appends what is left at once and awaits it, so a superstep's
  events are stored before its drive returns; a process killed inside the block loses
  what it had not appended yet (at most the last 50 ms of events). Nothing is
  recorded unless the hub says so (``Events(record=True)``, as the Celery workers' hub
  does), nor when the store has no stream or there is no sealer. A failed append is logged
  and dropped: observing a run never breaks it.
- The save that gives the run's lease up (the last write of a held block on a store that
  moves leases with its writes: `agentflow.exec.run.lease.Tenure`) carries the buffered
  events, and its own ``checkpoint.saved``, as one entry in the same write: the recorder is
  the tenure's `Rider`. No append runs while that write is in flight, so the entries keep
  their order. Refused with nothing written, the save gives its events back to the buffer
  (the ``checkpoint.saved`` of a save that did not happen is dropped); of a save whose
  outcome is unknown (the store failed mid-write), the events are dropped and their
  numbers spent, with a warning: stored, they must not be stored twice; missing, a reader
  shows a gap before the holder's next event.
- Once the recorder has stored the run's last event (``run.finished``, ``run.cancelled``), it
  asks a store that can (`EventCompacting`: Redis) to pack the stream into fewer bytes,
  every entry and cursor kept; a failure there is logged, and the stream stays as it was.
- One append is one stored entry: the events it carries, sealed together
  (`Sealer.seal_event`: the MAC covers the run id and the payload,
  ``{"pos": [writer, n], "events": [[name, at, data], ...]}``), and checked before its
  payload is decoded (`read_events`): a forged or moved entry comes back as one `RunEvent`
  with a ``problem``, never as data. A superstep's five or so events so cost one signature,
  one id and one stream entry between them: a finished run's stream is about a third of what
  one entry per event took. (An entry of one event, ``{"name", "at", "data", "pos"}``, as
  earlier releases wrote, still reads.)
- Each event has a position, signed in its entry: ``pos = [writer, n]``, the recorder that
  wrote it (a random id per held run) and the number of the entry's first event among that
  writer's events, from 0 (the next events of the entry follow on). `Positions` follows
  them as a reader goes: a copy of an event already read (a byte-for-byte replay appended
  again), an event older than one read before it, and a writer's numbers that skip (entries
  removed between two kept ones) each come back with a ``problem``, never as data. (What a
  stream's trim removed from its start is not a gap: a writer first seen at n > 0 is taken
  from there.) An event with no position is one too: nothing tells its copy from itself.
- A `RunEvent`'s cursor is the store's cursor of its entry for the entry's last event; for an
  event before it, ``P~E~k``: read on after store cursor ``P`` (empty: from the start) and
  skip the first ``k`` events of entry ``E`` (all of them are read when the first entry found
  is not ``E``: trimmed away meanwhile). Any of them may be passed as ``after``.
- `follow_events` reads on after a cursor, polling, until the run has ended and its last
  events are read: what `FlowClient.events` and the viewer's live page use.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar, cast

from agentflow._errors import CheckpointNotFound, CheckpointStoreCorrupt
from agentflow._events import Event, Events
from agentflow.exec.checkpoints.protocol import CheckpointStore, EventCompacting, EventStore, has_part
from agentflow.exec.checkpoints.records import SealedEvent, StoredEvent
from agentflow.exec.run.lease import Tenure
from agentflow.exec.seal import Sealer

log = logging.getLogger("agentflow.events")

_T = TypeVar("_T")
#: How often a follower polls the store for new events (seconds).
POLL_S: Final = 0.2
#: How long a follower goes on reading after it saw the run ended (its last events may still come).
SETTLE_S: Final = 1.0
#: How long an emitted event may wait in the buffer for others to share its append (seconds).
FLUSH_AFTER_S: Final = 0.05
#: Event names after which a run has no more events.
_LAST: Final = frozenset({"run.finished", "run.cancelled"})


@dataclass(frozen=True, slots=True)
class RunEvent:
    """One event of a run's stream, checked, with its cursor."""

    cursor: str
    """Where it sits in the stream: pass it as ``after`` to read on from the next one."""
    name: str
    """Dotted event name (``checkpoint.saved``); empty when the event did not check."""
    at: float = 0.0
    """Wall-clock time it was emitted."""
    data: dict[str, Any] = field(default_factory=dict)
    """Its fields (see `agentflow._events`); empty when the event did not check."""
    problem: str | None = None
    """Why the stored event was not shown (forged, moved, copied, out of order, unreadable; `name` is then
    empty), or, with its name and data, that events of its writer before it are missing."""


class Positions:
    """What a reader has seen of each writer's numbered events (see the module notes)."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}
        self._seen: set[tuple[str, int]] = set()

    def check(self, cursor: str, run_id: str, pos: Any) -> tuple[str | None, bool]:
        """Check an event at `pos` read now: (the problem or None, whether the event itself is real).

        A copy, an older event or one with no position is not shown; an event after a gap is
        (it checks), with the gap as its problem.
        """
        if not (isinstance(pos, list) and len(pos) == 2 and isinstance(pos[0], str) and type(pos[1]) is int):
            return f"event {cursor} of run {run_id!r} has no position: nothing tells a copy of it from it", False
        writer, n = pos
        last = self._last.get(writer)
        if last is not None and n <= last:
            copy = (writer, n) in self._seen
            what = "a copy of an event already read" if copy else "older than an event read before it"
            return f"event {cursor} of run {run_id!r} is {what} (writer {writer}, event {n}): a replay", False
        self._last[writer] = n
        self._seen.add((writer, n))
        if last is not None and n > last + 1:
            gap = f"events {last + 1} to {n - 1} of writer {writer} of run {run_id!r} are missing before {cursor}"
            return gap, True
        return None, True


def stream_of(store: object) -> EventStore | None:
    """The store as an `EventStore`, or None when it keeps no event streams (`has_part`)."""
    return cast(EventStore, store) if has_part(store, EventStore) else None


def _item(event: Event) -> list[Any]:
    """The event as its entry carries it: ``[name, at, data]``."""
    item = [event.name, event.at, event.data]
    try:
        json.dumps(item, allow_nan=False)
    except (TypeError, ValueError):  # a field JSON cannot carry is shown as text
        item = json.loads(json.dumps(item, default=str).replace("NaN", "null"))
    return item


class _Recorder:
    """Buffers one run's events and appends them in order from one task on the loop."""

    def __init__(self, store: EventStore, sealer: Sealer, run_id: str) -> None:
        self._store, self._sealer, self._run_id = store, sealer, run_id
        self._writer = secrets.token_hex(6)  # this holder's events: numbered from 0 (`Positions`)
        self._written = 0
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        self._buffer: list[Event] = []
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None  # starts the next append once FLUSH_AFTER_S passed
        self._riding: list[Event] | None = None  # the events a save carries while it is in flight (`ride`)
        self._carried: Event | None = None  # the save's own event, stored by it: not buffered when delivered
        self.ended = False  # a run.finished or run.cancelled was stored (or may have been): the stream is whole

    def __call__(self, event: Event) -> None:
        if event.run_id != self._run_id:
            return
        if event is self._carried:
            self._carried = None
            return
        if threading.get_ident() == self._thread:
            self._add(event)
        else:
            self._loop.call_soon_threadsafe(self._add, event)

    def _add(self, event: Event) -> None:
        self._buffer.append(event)
        self._start_timer()

    def _start_timer(self) -> None:
        idle = self._task is None or self._task.done()  # else an append under way takes the buffer
        if self._buffer and self._timer is None and idle and self._riding is None:
            self._timer = self._loop.call_later(FLUSH_AFTER_S, self._due)

    async def ride(self, last: Event) -> SealedEvent:
        """The buffered events and `last`, sealed as the next entry, for the save that gives the lease up (`Rider`)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._task is not None and not self._task.done():  # an append under way is stored first
            await self._task
        batch = [*self._buffer, last]
        sealed = self._seal(batch)  # raises with nothing changed
        self._riding, self._buffer = batch, []
        return sealed

    def rode(self, stored: bool | None) -> None:
        """What became of the save that carried the events (`Rider`); appends go on after it."""
        riding, self._riding = self._riding or [], None
        self.ended = self.ended or (stored is not False and _ends(riding))
        if stored is True:
            self._written += len(riding)
            self._carried = riding[-1]
        elif stored is False:
            self._buffer = riding[:-1] + self._buffer
        else:
            self._written += len(riding)
            log.warning(
                "%d events of run %s went with a save that may not have been stored; they are not stored again",
                len(riding),
                self._run_id,
                extra={"run_id": self._run_id},
            )
        self._start_timer()

    def _seal(self, batch: list[Event]) -> SealedEvent:
        body = {"pos": [self._writer, self._written], "events": [_item(event) for event in batch]}
        return self._sealer.seal_event(self._run_id, body)

    def _due(self) -> None:
        self._timer = None
        if self._task is None or self._task.done():
            self._task = self._loop.create_task(self._flush())

    async def _flush(self) -> None:
        while self._buffer:
            batch, self._buffer = self._buffer, []
            try:
                sealed = self._seal(batch)
                self._written += len(batch)
                await self._store.append_events(self._run_id, [sealed])
                self.ended = self.ended or _ends(batch)
            except Exception:
                log.exception("could not store %d events of run %s", len(batch), self._run_id)

    async def drain(self) -> None:
        """Store every event buffered so far, now, and wait until it is."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._task is not None and not self._task.done():
            await self._task
        if self._buffer:
            await self._flush()

    async def compact(self) -> None:
        """Have the store pack the run's stream, once the run's last event is stored (`EventCompacting`)."""
        if not self.ended or not has_part(self._store, EventCompacting):
            return
        try:
            await cast(EventCompacting, self._store).compact_events(self._run_id)
        except Exception:
            log.exception("could not compact the event stream of run %s (it stays as it was)", self._run_id)


def _ends(batch: list[Event]) -> bool:
    return any(event.name in _LAST for event in batch)


@contextlib.asynccontextmanager
async def recording(
    store: CheckpointStore | None,
    sealer: Sealer | None,
    events: Events,
    run_id: str,
    held: contextlib.AbstractAsyncContextManager[_T],
    tenure_of: Callable[[_T], Tenure | None] | None = None,
) -> AsyncIterator[_T]:
    """Hold `held` and record the run's events meanwhile; the last append is awaited before it is let go.

    `tenure_of`: the lease `held` holds, found in what it yields; the recorder rides with the
    save that gives it up (`Tenure.rider`).
    """
    stream = stream_of(store)
    if stream is None or sealer is None or not events.record:
        async with held as value:
            yield value
        return
    async with held as value:
        recorder = _Recorder(stream, sealer, run_id)
        tenure = tenure_of(value) if tenure_of is not None else None
        if tenure is not None:
            tenure.rider = recorder
        unsubscribe = events.subscribe(recorder)
        try:
            yield value
        finally:
            unsubscribe()
            await recorder.drain()
            await recorder.compact()


#: Separates the parts of a cursor inside an entry (``P~E~k``); no store's cursor holds it.
_INSIDE: Final = "~"


def _items(body: dict[str, Any]) -> tuple[Any, list[Any]] | None:
    """An entry's position and its ``[name, at, data]`` items, or None when it is not an entry."""
    if "events" in body:
        items = body["events"]
        return (body.get("pos"), items) if isinstance(items, list) and items else None
    return body.get("pos"), [
        [body.get("name"), body.get("at"), body.get("data")]
    ]  # one event, as earlier releases wrote


def _opened(sealer: Sealer, run_id: str, before: str, stored: StoredEvent, positions: Positions) -> list[RunEvent]:
    """The events of one stored entry, checked; `before` is the store cursor read after to find it."""
    entry = stored.cursor
    try:
        found = _items(sealer.open_event(stored.event, run_id))
    except CheckpointStoreCorrupt as exc:
        return [RunEvent(entry, "", problem=str(exc))]
    if found is None:
        return [RunEvent(entry, "", problem=f"event {entry} of run {run_id!r} is not an event body")]
    pos, items = found
    opened = []
    for i, item in enumerate(items):
        cursor = entry if i == len(items) - 1 else _INSIDE.join((before, entry, str(i + 1)))
        if not (isinstance(item, list) and len(item) == 3):
            opened.append(RunEvent(cursor, "", problem=f"event {cursor} of run {run_id!r} is not an event body"))
            continue
        name, at, data = item
        if not isinstance(name, str) or not isinstance(at, int | float) or not isinstance(data, dict):
            opened.append(RunEvent(cursor, "", problem=f"event {cursor} of run {run_id!r} is not an event body"))
            continue
        here = [pos[0], pos[1] + i] if isinstance(pos, list) and len(pos) == 2 and type(pos[1]) is int else pos
        problem, real = positions.check(cursor, run_id, here)
        opened.append(
            RunEvent(cursor, name, float(at), data, problem) if real else RunEvent(cursor, "", problem=problem)
        )
    return opened


def _split(after: str | None) -> tuple[str | None, str | None, int]:
    """A cursor as (store cursor to read after, the entry to skip into or None, how many of its events to skip).

    Raises:
        ValueError: `after` is an inside cursor that is not ``P~E~k`` with k a whole number from 1.
    """
    if after is None or not isinstance(after, str) or _INSIDE not in after:
        return after, None, 0
    parts = after.split(_INSIDE)
    if len(parts) != 3 or not parts[1] or not parts[2].isdigit() or int(parts[2]) < 1:
        raise ValueError(f"{after!r} is not an event cursor: expected a store cursor or P~E~k")
    return parts[0] or None, parts[1], int(parts[2])


async def read_events(
    store: CheckpointStore,
    sealer: Sealer,
    run_id: str,
    after: str | None = None,
    limit: int = 1000,
    positions: Positions | None = None,
) -> list[RunEvent]:
    """The run's stored events after cursor `after` (from the oldest kept if None), each checked.

    `limit` counts stored entries (appends), each of one or more events.
    `positions` is what the caller has read of the stream before (`follow_events` keeps one
    across its reads); None: a fresh one, so a copy of an event before `after` goes unseen.
    A store without event streams has none: the list is empty.

    Raises:
        ValueError: `after` is not a cursor of this store, nor one inside an entry (``P~E~k``).
    """
    stream = stream_of(store)
    if stream is None:
        return []
    seen = positions if positions is not None else Positions()
    before, inside, skip = _split(after)
    found: list[RunEvent] = []
    for n, stored in enumerate(await stream.read_events(run_id, before, limit)):
        opened = _opened(sealer, run_id, before or "", stored, seen)
        found += opened[skip:] if n == 0 and stored.cursor == inside else opened
        before = stored.cursor
    return found


async def _ended(store: CheckpointStore, run_id: str) -> bool:
    try:
        return (await store.latest(run_id)).ended
    except CheckpointNotFound:
        return False


async def follow_events(
    store: CheckpointStore,
    sealer: Sealer,
    run_id: str,
    after: str | None = None,
    *,
    poll_s: float = POLL_S,
    settle_s: float = SETTLE_S,
) -> AsyncIterator[RunEvent]:
    """Yield the run's events after `after`, as they are stored, until the run has ended.

    It stops after a ``run.finished`` or ``run.cancelled`` event, or once the run's newest
    checkpoint has ended and no event came for `settle_s` seconds (a tool loop's end, or
    a run whose last events were trimmed). A paused run is followed until it goes on.
    """
    loop = asyncio.get_running_loop()
    quiet_since: float | None = None
    positions = Positions()
    while True:
        batch = await read_events(store, sealer, run_id, after, positions=positions)
        for event in batch:
            after = event.cursor
            yield event
            if event.name in _LAST:
                return
        if batch:
            quiet_since = None
            continue
        if await _ended(store, run_id):
            now = loop.time()
            quiet_since = now if quiet_since is None else quiet_since
            if now - quiet_since >= settle_s:
                return
        await asyncio.sleep(poll_s)
