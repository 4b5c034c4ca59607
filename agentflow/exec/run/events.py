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
  events, and its own ``checkpoint.saved`` (and, when it ends the run, its ``run.finished``
  or ``run.cancelled``: `RunSteps.save`'s `ending`), as one entry in the same write: the
  recorder is the tenure's `Rider`, and no crash parts a run's end from the save that ended it.
  No append runs while that write is in flight, so the entries keep their order. Refused
  with nothing written, the save gives its events back to the buffer (the save's own events,
  of a save that did not happen, are dropped); of a save whose
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
- Each entry is a link of the run's chain (`agentflow.exec.event_chain`, which says what a
  reader can and cannot detect): signed with its position ``pos = [writer, n]`` (the
  recorder that wrote it, a random id per held run, and the number of its first event among
  that writer's events) and ``chain = [height, prev]``, the link of the entry it follows:
  the writer's previous entry, or, for its first, the head the run's checkpoint names
  (`follow`, told by the protocol when it opens the run: no extra round trip). Each save
  signs the head this writer has stored into the checkpoint (`anchor`); the save that
  gives the lease up names the entry it carries. A copy, an entry out of order, and
  entries removed before a kept one each come back with a ``problem``, never as data;
  `stream_end` says what only the whole stream and the newest checkpoint tell (the stream
  cut after the head a checkpoint names, an ended run without its last events). A reader
  that starts after a cursor first reads the stream up to it (`prime`), so a copy of an
  entry before the cursor is one too.
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
from collections.abc import AsyncIterator, Callable, MutableMapping
from typing import Any, Final, TypeVar, cast

from agentflow._errors import CheckpointNotFound, CheckpointStoreCorrupt
from agentflow._events import Event, Events
from agentflow.exec.checkpoints.protocol import CheckpointStore, EventCompacting, EventStore, has_part
from agentflow.exec.checkpoints.records import SealedEvent
from agentflow.exec.event_chain import (
    INSIDE,
    LAST,
    Head,
    Positions,
    RunEvent,
    anchor_of,
    head_of,
    link_of,
    open_entry,
    seal_entry,
)
from agentflow.exec.run.lease import Rider, Tenure
from agentflow.exec.seal import Sealer

__all__ = ["Positions", "RunEvent", "follow_events", "prime", "read_events", "recording", "stream_end", "stream_of"]

log = logging.getLogger("agentflow.events")

_T = TypeVar("_T")
#: How often a follower polls the store for new events (seconds).
POLL_S: Final = 0.2
#: How long a follower goes on reading after it saw the run ended (its last events may still come).
SETTLE_S: Final = 1.0
#: How long an emitted event may wait in the buffer for others to share its append (seconds).
FLUSH_AFTER_S: Final = 0.05
#: Event names after which a run has no more events.
_LAST: Final = LAST
#: How many entries one read takes while a reader reads up to its cursor (`prime`).
_PRIME_PAGE: Final = 1000


def stream_of(store: object) -> EventStore | None:
    """The store as an `EventStore`, or None when it keeps no event streams (`has_part`)."""
    return cast(EventStore, store) if has_part(store, EventStore) else None


def _item(event: Event) -> list[Any]:
    """The event as an entry that would not encode carries it: ``[name, at, data]``, a bad field as text.

    Only then is each event checked: an entry whose fields JSON can all carry is encoded once (`_Recorder._seal`).
    """
    item = [event.name, event.at, event.data]
    try:
        json.dumps(item, allow_nan=False)
    except (TypeError, ValueError):
        item = json.loads(json.dumps(item, default=str).replace("NaN", "null"))
    return item


class _Recorder:
    """Buffers one run's events and appends them in order from one task on the loop."""

    def __init__(self, store: EventStore, sealer: Sealer, run_id: str) -> None:
        self._store, self._sealer, self._run_id = store, sealer, run_id
        self._writer = secrets.token_hex(6)  # this holder's events: numbered from 0 (`Positions`)
        self._written = 0
        self._head: Head | None = None  # the entry the next one follows: the last sealed, or the one followed
        self._stored: Head | None = None  # the last entry known stored (or the one followed): what a save anchors
        self._sealed = False  # an entry was sealed: the followed head is spent
        self._before_ride: Head | None = None  # the head before the riding entry (back to it if it is refused)
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        self._buffer: list[Event] = []
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None  # starts the next append once FLUSH_AFTER_S passed
        self._riding: list[Event] | None = None  # the events a save carries while it is in flight (`ride`)
        self._own = 0  # how many of them are the save's own (delivered once it is stored, dropped if refused)
        self._carried: list[Event] = []  # the save's own events, stored by it: not buffered when delivered
        self.ended = False  # a run.finished or run.cancelled was stored (or may have been): the stream is whole

    def __call__(self, event: Event) -> None:
        if event.run_id != self._run_id:
            return
        if self._carried and any(event is carried for carried in self._carried):
            self._carried = [carried for carried in self._carried if carried is not event]
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

    def follow(self, anchor: Any) -> None:
        """The run's checkpoint names `anchor` as its chain's head: this writer's first entry follows it (`Rider`)."""
        if not self._sealed:
            self._head = self._stored = head_of(anchor)

    def anchor(self) -> dict[str, Any]:
        """The chain's head the save under way signs (`Rider`): the entry it carries, else the last one stored."""
        head = self._head if self._riding is not None else self._stored
        return {"writer": self._writer} | ({"head": list(head)} if head is not None else {})

    async def ride(self, *last: Event) -> SealedEvent:
        """The buffered events and `last`, sealed as the next entry, for the save that gives the lease up (`Rider`)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._task is not None and not self._task.done():  # an append under way is stored first
            await self._task
        batch = [*self._buffer, *last]
        before, sealed_before = self._head, self._sealed
        sealed = self._seal(batch)  # raises with nothing changed
        self._before_ride, self._sealed = before, sealed_before or self._sealed
        self._riding, self._buffer, self._own = batch, [], len(last)
        return sealed

    def rode(self, stored: bool | None) -> None:
        """What became of the save that carried the events (`Rider`); appends go on after it."""
        riding, self._riding = self._riding or [], None
        self.ended = self.ended or (stored is not False and _ends(riding))
        if stored is True:
            self._written += len(riding)
            self._carried = riding[len(riding) - self._own :]
            self._stored = self._head
        elif stored is False:
            self._buffer = riding[: len(riding) - self._own] + self._buffer
            self._head = self._before_ride  # its events are sealed again, as the next entry
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
        """The next entry of the chain; the head moves on to it (raises with nothing changed)."""
        try:
            items = [[event.name, event.at, event.data] for event in batch]
            sealed = seal_entry(self._sealer, self._run_id, self._writer, self._written, self._head, items)
        except (TypeError, ValueError):  # a field JSON cannot carry: each event is checked, and shown as text
            items = [_item(event) for event in batch]
            sealed = seal_entry(self._sealer, self._run_id, self._writer, self._written, self._head, items)
        self._head = (0 if self._head is None else self._head[0] + 1, link_of(sealed))
        self._sealed = True
        return sealed

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
                head = self._head
                await self._store.append_events(self._run_id, [sealed])  # lost: the next entry shows the gap
                self._stored = head
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
    recorders: MutableMapping[str, Rider] | None = None,
) -> AsyncIterator[_T]:
    """Hold `held` and record the run's events meanwhile; the last append is awaited before it is let go.

    `tenure_of`: the lease `held` holds, found in what it yields; the recorder rides with the
    save that gives it up (`Tenure.rider`). `recorders`: where the protocol finds the run's
    recorder while the block holds it (to tell it the chain's head, and ask what to anchor).
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
        if recorders is not None:
            recorders[run_id] = recorder
        try:
            yield value
        finally:
            unsubscribe()
            if recorders is not None and recorders.get(run_id) is recorder:
                del recorders[run_id]
            await recorder.drain()
            await recorder.compact()


def _split(after: str | None) -> tuple[str | None, str | None, int]:
    """A cursor as (store cursor to read after, the entry to skip into or None, how many of its events to skip).

    Raises:
        ValueError: `after` is an inside cursor that is not ``P~E~k`` with k a whole number from 1.
    """
    if after is None or not isinstance(after, str) or INSIDE not in after:
        return after, None, 0
    parts = after.split(INSIDE)
    if len(parts) != 3 or not parts[1] or not parts[2].isdigit() or int(parts[2]) < 1:
        raise ValueError(f"{after!r} is not an event cursor: expected a store cursor or P~E~k")
    return parts[0] or None, parts[1], int(parts[2])


async def prime(
    store: CheckpointStore, sealer: Sealer, run_id: str, after: str | None, positions: Positions
) -> Positions:
    """`positions` having read the stream from its start up to cursor `after`, for a reader that starts there.

    So a copy of an entry before `after`, appended after it, is seen as one. When `after` is
    not found (trimmed away meanwhile), a fresh `Positions` that knows the stream was not
    read from its start.
    """
    stream = stream_of(store)
    before, _, _ = _split(after)
    if stream is None or before is None:
        return positions
    cursor: str | None = None
    while True:
        page = await stream.read_events(run_id, cursor, _PRIME_PAGE)
        for stored in page:
            open_entry(sealer, run_id, cursor or "", stored, positions)
            cursor = stored.cursor
            if cursor == before:
                return positions
        if len(page) < _PRIME_PAGE:
            fresh = Positions()
            fresh.whole = False
            return fresh


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
    across its reads, after `prime`); None: the stream is read up to `after` first (`prime`),
    so a copy of an event before `after` is seen as one.
    A store without event streams has none: the list is empty.

    Raises:
        ValueError: `after` is not a cursor of this store, nor one inside an entry (``P~E~k``).
    """
    stream = stream_of(store)
    if stream is None:
        return []
    before, inside, skip = _split(after)
    entries = await stream.read_events(run_id, before, limit)  # a cursor the store never gave raises here
    seen = positions if positions is not None else await prime(store, sealer, run_id, after, Positions())
    found: list[RunEvent] = []
    for n, stored in enumerate(entries):
        opened = open_entry(sealer, run_id, before or "", stored, seen)
        found += opened[skip:] if n == 0 and stored.cursor == inside else opened
        before = stored.cursor
    return found


async def stream_end(store: CheckpointStore, sealer: Sealer, run_id: str, positions: Positions) -> list[RunEvent]:
    """The events stored after those `positions` read, then what the newest checkpoint tells of the stream's end.

    The checkpoint is read first, so every entry its anchor names is stored by the time the
    stream is read to its end. Each problem is a `RunEvent` with no name at the last cursor.

    A newest checkpoint that fails its check is one problem: the end is then not checked.
    """
    stream = stream_of(store)
    if stream is None:
        return []
    try:
        row = await store.latest(run_id)
        body = sealer.open_checkpoint(row, run_id)
    except CheckpointNotFound:
        return []
    except CheckpointStoreCorrupt as exc:  # `agentflow verify` names the row; the stream's end goes unchecked
        return [RunEvent(positions.cursor, "", problem=f"the stream's end is not checked: {exc}")]
    found: list[RunEvent] = []
    while True:
        batch = await read_events(store, sealer, run_id, positions.cursor or None, _PRIME_PAGE, positions)
        found += batch
        if not batch:
            break
    if positions.whole:
        found += [
            RunEvent(positions.cursor, "", problem=p)
            for p in positions.end(run_id, anchor_of(body), row.step, row.ended)
        ]
    return found


async def stream_problems(store: CheckpointStore, sealer: Sealer, run_id: str) -> list[str]:
    """Every problem of the run's stream, read whole (what ``agentflow verify`` reports of a run whose rows check)."""
    return [event.problem for event in await stream_end(store, sealer, run_id, Positions()) if event.problem]


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
    Before it stops, what the stream's end tells (`stream_end`) comes as problems.
    """
    loop = asyncio.get_running_loop()
    quiet_since: float | None = None
    positions = await prime(store, sealer, run_id, after, Positions())
    while True:
        batch = await read_events(store, sealer, run_id, after, positions=positions)
        for event in batch:
            after = event.cursor
            yield event
            if event.name in _LAST:
                for late in await stream_end(store, sealer, run_id, positions):
                    yield late
                return
        if batch:
            quiet_since = None
            continue
        if await _ended(store, run_id):
            now = loop.time()
            quiet_since = now if quiet_since is None else quiet_since
            if now - quiet_since >= settle_s:
                for late in await stream_end(store, sealer, run_id, positions):
                    yield late
                return
        await asyncio.sleep(poll_s)
