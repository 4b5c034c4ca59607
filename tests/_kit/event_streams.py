"""A run's event stream as its writers wrote it: who wrote which entry, and what each entry follows.

`writers` opens every stored entry of a run (each checked under the key first) and groups
them by writer (the recorder of one held block), in stream order; `heads` is the chain head
each checkpoint of the run names (`agentflow.exec.event_chain.ANCHOR`). `assert_handed_on`
checks what a handover must leave: every writer after the first starts where the checkpoint
it took the run up from says the chain stood (one killed before it saved any checkpoint
follows an entry of another writer) (a new root when it names no head: a writer
that stored nothing before that save, as one block's ``run`` buffers its events to its end),
and both readers (``agentflow verify``'s `stream_problems`, ``agentflow events``'s
`read_events` with `stream_end`) find nothing wrong.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.event_chain import anchor_of, head_of, link_of
from agentflow.exec.run.events import Positions, read_events, stream_end, stream_problems
from agentflow.exec.seal import Sealer


@dataclasses.dataclass
class Entry:
    cursor: str
    height: int
    prev: str
    link: str
    names: list[str]


@dataclasses.dataclass
class Writer:
    writer: str
    entries: list[Entry]

    @property
    def names(self) -> list[str]:
        return [name for entry in self.entries for name in entry.names]


async def writers(store: Any, sealer: Sealer, run_id: str) -> list[Writer]:
    """The run's writers in the order their first entries were stored, each with its entries."""
    found: dict[str, Writer] = {}
    for stored in await store.read_events(run_id, None, 10_000):
        body = sealer.open_event(stored.event, run_id)
        (writer, _), (height, prev) = body["pos"], body["chain"]
        entry = Entry(stored.cursor, height, prev, link_of(stored.event), [item[0] for item in body["events"]])
        found.setdefault(writer, Writer(writer, [])).entries.append(entry)
    return list(found.values())


async def heads(store: Any, sealer: Sealer, run_id: str) -> list[tuple[str | None, tuple[int, str] | None]]:
    """(writer, head) as each checkpoint of the run names them, oldest first."""
    named = []
    for row in await store.history(run_id):
        anchor = anchor_of(sealer.open_checkpoint(row, run_id))
        named.append((anchor.get("writer") if anchor else None, head_of(anchor)))
    return named


async def assert_handed_on(store: CheckpointStore, sealer: Sealer, run_id: str) -> list[Writer]:
    """Check the run's stream reads back clean and each writer took over from the head it was handed; its writers."""
    assert await stream_problems(store, sealer, run_id) == []
    shown = await read_events(store, sealer, run_id)
    shown += await stream_end(store, sealer, run_id, Positions())
    assert [e.problem for e in shown if e.problem] == [], [e.problem for e in shown if e.problem]
    by = await writers(store, sealer, run_id)
    named = await heads(store, sealer, run_id)
    for later in by[1:]:
        # the checkpoint this writer took the run up from: the newest one saved before its own first save
        own = [i for i, (writer, _) in enumerate(named) if writer == later.writer]
        first = later.entries[0]
        if not own:  # a writer killed before its first save (its entries went on their own): it followed one
            assert first.prev == "" or any(e.link == first.prev for w in by if w is not later for e in w.entries)
            continue
        handed = named[own[0] - 1][1]
        if handed is None:  # nothing of the chain was stored by that checkpoint's time: a new root
            assert (first.height, first.prev) == (0, "")
            continue
        assert (first.height, first.prev) == (handed[0] + 1, handed[1])
        assert any(e.link == handed[1] for w in by if w is not later for e in w.entries)
    return by
