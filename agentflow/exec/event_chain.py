"""The chain of a run's event stream: every entry signed over its predecessor's link, and what a reader checks.

Moving parts:
- An entry (one append: `agentflow.exec.run.events`) is sealed with ``pos = [writer, n]``
  (the recorder that wrote it, a random id per held run, and the number of its first event
  among that writer's events) and ``chain = [height, prev]``: `prev` is the link of the
  entry it follows, `height` one more than that entry's (0 and ``""`` for the run's first).
  An entry's link (`link_of`) is the first 32 hex digits of its signature: an HMAC of the
  run id and the payload, so nobody without the key can make an entry with a given link,
  and a byte copy has the link of its original.
- A writer's entries follow each other; a writer's first entry follows the head the run's
  checkpoint names (the one it took the run up from, read anyway: no extra round trip).
  Several writers of one run over its life (successive lease holders, a recovery, a
  worker that lost its lease and still appends) so make one tree of entries, forked where
  a writer took over from a head that was not the stream's last entry.
- Each checkpoint a recording writer saves names the chain's head as that writer has stored
  it (`ANCHOR`: ``{"writer", "head": [height, link]}``); the save that gives the lease up
  names the entry it carries itself (stored in the same write). A process that records no
  events carries the head of the checkpoint it took up forward, without ``writer``.
- `Positions` is a reader's memory of what it read; `open_entry` checks one stored entry
  (its signature first, then its chain and each event's position) and `Positions.end`
  what only the whole stream and the run's newest checkpoint tell.

What a reader detects (every store; the packed Redis form keeps each entry's bytes, so the
same): a byte copy of an entry (its link was read before); an entry out of order (it does
not follow its writer's last entry read, but an earlier one); entries removed before a kept
one (its predecessor was never read: a gap, the kept entry still shown); a writer's entries
removed when a later writer took over from one of them; entries removed up to the head the
newest checkpoint names; a run that ended by a recording writer's save but whose stream has
no ``run.finished``/``run.cancelled`` of that writer; the stream's first entries removed
while it holds fewer than `EVENTS_KEPT` (a trim keeps that many). What it cannot detect:
removal of the entries stored after the newest checkpoint's head (the tail after the last
anchored point) while the run has not ended, and of entries after a head nobody continued
from (a writer that lost its lease and appended on); entries written before chains existed
carry none and are checked by position only.

A run's end and a crash: the save that ends a run carries its ``run.finished`` (or
``run.cancelled``) after its own ``checkpoint.saved`` (`agentflow.exec.run.steps`), so where
that save gives the lease up with the run's events in one write (the memory, SQLite and
Redis stores) no crash parts the end from the save: its anchor names the entry holding
both, and an ended run whose stream lacks that entry lost it (the head is missing). A
writer can still stop between an ending save and its events where the save does not carry
them: a cancel saved by a process that holds no lease to give up, an entry that could not
be sealed, and the SQLAlchemy store, whose save appends its events in a second round trip
(there the anchored entry itself is then missing, which reads as a cut). Nothing signed
tells that crash from a removal of the same entries (no row names what came after the head
a save signed), so `Positions.end` says it may be either, and names no removal twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from agentflow._errors import CheckpointStoreCorrupt
from agentflow.exec.checkpoints.records import EVENTS_KEPT, SealedEvent, StoredEvent
from agentflow.exec.seal import Sealer

#: The checkpoint body's field naming the chain's head (see the module notes).
ANCHOR: Final = "events"
#: How many hex digits of an entry's signature are its link (128 bits).
LINK_CHARS: Final = 32
#: Event names after which a run has no more events.
LAST: Final = frozenset({"run.finished", "run.cancelled"})
#: Separates the parts of a cursor inside an entry (``P~E~k``); no store's cursor holds it.
INSIDE: Final = "~"

Head = tuple[int, str]
"""A chain's head: an entry's height and link."""


def link_of(sealed: SealedEvent) -> str:
    """The link of a sealed entry: what the entry after it names as ``prev``."""
    return sealed.sig[:LINK_CHARS]


def head_of(anchor: Any) -> Head | None:
    """The head an anchor names (None: none, or not an anchor)."""
    head = anchor.get("head") if isinstance(anchor, dict) else None
    if isinstance(head, list) and len(head) == 2 and type(head[0]) is int and isinstance(head[1], str):
        return head[0], head[1]
    return None


def anchor_of(body: dict[str, Any]) -> dict[str, Any] | None:
    """A checked checkpoint body's anchor, as it is (None when it has none)."""
    anchor = body.get(ANCHOR)
    return anchor if isinstance(anchor, dict) else None


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
    empty), or, with its name and data, that events before it are missing."""


class Positions:
    """What a reader has read of a run's stream: links, each writer's last entry and number (see the module notes)."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}
        self._seen: set[tuple[str, int]] = set()
        self._links: dict[str, tuple[str, int]] = {}  # link -> (cursor, height)
        self._tip: dict[str, str] = {}  # writer -> link of its last entry read
        self._ended: set[str] = set()  # writers whose run.finished or run.cancelled was read
        self._misplaced: set[str] = set()  # links of entries read out of order (their followers are in order)
        self._unchecked: set[str] = set()  # the signatures' links of entries that did not check (reported as such)
        self._chained = False
        self.entries = 0
        """How many stored entries were read."""
        self.first_height: int | None = None
        """The height of the first chained entry read, when what it follows was not read (trimmed or removed)."""
        self.cursor = ""
        """The store cursor of the last entry read."""
        self.whole = True
        """Whether the stream was read from its start (else `end` has nothing to say)."""

    def entry(self, cursor: str, run_id: str, link: str, pos: Any, chain: Any) -> tuple[str | None, bool]:
        """Check an entry read now by its link and chain: (the problem or None, whether it is real)."""
        self.entries += 1
        self.cursor = cursor
        where = f"entry {cursor} of run {run_id!r}"
        if link in self._links:
            return f"{where} is a copy of an event already read (entry {self._links[link][0]}): a replay", False
        if chain is None:
            if self._chained:
                return f"{where} has no chain link, yet follows entries that have: not shown", False
            return None, True  # written before chains: its positions alone are checked
        if not (
            isinstance(chain, list)
            and len(chain) == 2
            and type(chain[0]) is int
            and chain[0] >= 0
            and isinstance(chain[1], str)
            and isinstance(pos, list)
            and len(pos) == 2
            and isinstance(pos[0], str)
        ):
            return f"{where} has no readable chain link or position", False
        height, prev = chain
        writer = pos[0]
        tip = self._tip.get(writer)
        problem: str | None = None
        known = prev in self._misplaced or prev in self._unchecked  # its follower is no further problem
        if tip is not None and prev != tip and not known:
            if prev in self._links or prev == "":
                self._links[link] = (cursor, height)
                self._misplaced.add(link)
                return f"{where} is out of order: writer {writer} wrote it before entry {self._links[tip][0]}", False
            problem = f"entries of writer {writer} of run {run_id!r} are missing before {cursor} (removed)"
        elif tip is None and prev and prev not in self._links and not known:
            if self.entries == 1:
                self.first_height = height  # a trim or a removal: `end` tells them apart
            else:
                problem = (
                    f"entries of run {run_id!r} are missing before {cursor}: the entry it follows "
                    f"(height {height - 1}, of an earlier writer) was never read (removed)"
                )
        self._chained = True
        self._links[link] = (cursor, height)
        self._tip[writer] = link
        return problem, True

    def unchecked(self, cursor: str, link: str) -> None:
        """An entry read now did not check (reported as such): the entry after it is no further problem."""
        self.entries += 1
        self.cursor = cursor
        self._unchecked.add(link)

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

    def shown(self, writer: Any, name: str) -> None:
        """A real event named `name` of `writer` was read."""
        if name in LAST and isinstance(writer, str):
            self._ended.add(writer)

    def end(self, run_id: str, anchor: dict[str, Any] | None, step: int | None, ended: bool) -> list[str]:
        """What the whole stream, read from its start, and the run's newest checkpoint (its `anchor`) tell.

        `step` is that checkpoint's step, `ended` whether it ended the run.
        """
        problems = []
        if self.first_height and self.entries < EVENTS_KEPT:
            problems.append(
                f"the stream of run {run_id!r} starts at entry height {self.first_height} yet holds only "
                f"{self.entries} entries (a trim keeps {EVENTS_KEPT}): its first entries were removed"
            )
        head = head_of(anchor)
        trimmed = head is not None and self.first_height is not None and head[0] < self.first_height
        read = head is not None and (head[1] in self._links or head[1] in self._unchecked)  # unchecked: said so
        if head is not None and not read and not trimmed:
            problems.append(
                f"entry height {head[0]} of run {run_id!r}, stored by checkpoint {step}'s time, is missing: "
                "the stream was cut after it or entries were removed (or, on a store that appends a save's "
                "events after it, its writer stopped between the two)"
            )
        writer = anchor.get("writer") if anchor is not None else None
        if ended and isinstance(writer, str) and writer not in self._ended and (head is None or read or trimmed):
            # what that save signed is all here: it did not carry the run's end (see the module notes)
            problems.append(
                f"run {run_id!r} ended at checkpoint {step} but its stream has no run.finished or run.cancelled "
                f"of writer {writer}: that writer stopped between the save and storing its last events (a "
                "crash there), or those entries were removed; the signed rows read the same either way"
            )
        return problems


def seal_entry(sealer: Sealer, run_id: str, writer: str, n: int, head: Head | None, items: list[Any]) -> SealedEvent:
    """One entry of `items` (``[name, at, data]`` each), numbered from `n` and following `head` (None: the first)."""
    chain = [0, ""] if head is None else [head[0] + 1, head[1]]
    return sealer.seal_event(run_id, {"pos": [writer, n], "chain": chain, "events": items})


def _items(body: dict[str, Any]) -> tuple[Any, Any, list[Any]] | None:
    """An entry's position, chain and ``[name, at, data]`` items, or None when it is not an entry."""
    if "events" in body:
        items = body["events"]
        return (body.get("pos"), body.get("chain"), items) if isinstance(items, list) and items else None
    return body.get("pos"), None, [[body.get("name"), body.get("at"), body.get("data")]]  # as earlier releases wrote


def open_entry(sealer: Sealer, run_id: str, before: str, stored: StoredEvent, positions: Positions) -> list[RunEvent]:
    """The events of one stored entry, checked; `before` is the store cursor read after to find it."""
    entry = stored.cursor
    try:
        found = _items(sealer.open_event(stored.event, run_id))
    except CheckpointStoreCorrupt as exc:
        positions.unchecked(entry, link_of(stored.event))
        return [RunEvent(entry, "", problem=str(exc))]
    if found is None:
        positions.unchecked(entry, link_of(stored.event))
        return [RunEvent(entry, "", problem=f"event {entry} of run {run_id!r} is not an event body")]
    pos, chain, items = found
    gap, real = positions.entry(entry, run_id, link_of(stored.event), pos, chain)
    opened = []
    for i, item in enumerate(items):
        cursor = entry if i == len(items) - 1 else INSIDE.join((before, entry, str(i + 1)))
        if not real:
            opened.append(RunEvent(cursor, "", problem=gap))
            continue
        if not (isinstance(item, list) and len(item) == 3):
            opened.append(RunEvent(cursor, "", problem=f"event {cursor} of run {run_id!r} is not an event body"))
            continue
        name, at, data = item
        if not isinstance(name, str) or not isinstance(at, int | float) or not isinstance(data, dict):
            opened.append(RunEvent(cursor, "", problem=f"event {cursor} of run {run_id!r} is not an event body"))
            continue
        here = [pos[0], pos[1] + i] if isinstance(pos, list) and len(pos) == 2 and type(pos[1]) is int else pos
        problem, shown = positions.check(cursor, run_id, here)
        if i == 0 and gap is not None and shown and problem is None:
            problem = gap  # the chain's word on what is missing (the positions' gap, when there is one, says more)
        if shown:
            positions.shown(here[0] if isinstance(here, list) else None, name)
        opened.append(
            RunEvent(cursor, name, float(at), data, problem) if shown else RunEvent(cursor, "", problem=problem)
        )
    return opened
