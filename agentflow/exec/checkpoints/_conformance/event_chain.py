"""Conformance checks of event chains: a stream tampered with by someone without the key reads as tampered.

Each check stores a run whose stream is a genuine chain (`agentflow.exec.event_chain`) as
three writers leave it, after someone who can write to the store but holds no key changed
which entries it holds or their order: what a store holds after an ``XADD`` of a copy,
an ``XDEL`` or a ``DELETE`` of rows is such a sequence of genuine entries, so the checks
append exactly that sequence. Read back (`read_events`, then `stream_end` against the
run's newest checkpoint), the tampering must be reported and no copy read as real; on a
store that packs streams (`EventCompacting`) the same holds once the stream is packed.
A store without the optional `EventStore` part passes them trivially.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentflow.exec.checkpoints._conformance.base import SEALER, _checkpoint, _expect, _ids
from agentflow.exec.checkpoints.protocol import CheckpointStore, EventCompacting, EventStore
from agentflow.exec.checkpoints.records import SealedEvent
from agentflow.exec.event_chain import RunEvent, link_of, seal_entry
from agentflow.exec.run.events import Positions, prime, read_events, stream_end

#: The writers of the run and what each entry of theirs carries; b's second entry holds the charge.
_WRITERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("a", ("run.started", "checkpoint.saved")),
    ("b", ("run.recovered", "tool.finished", "checkpoint.saved")),
    ("c", ("run.recovered", "checkpoint.saved", "run.finished")),
)
Tamper = Callable[[list[SealedEvent]], list[SealedEvent]]


def _chain(run_id: str) -> tuple[list[SealedEvent], dict[str, Any]]:
    """The run's entries in order, and the anchor its ending checkpoint names (c's entry before run.finished)."""
    entries: list[SealedEvent] = []
    head: tuple[int, str] | None = None
    for writer, names in _WRITERS:
        for n, name in enumerate(names):
            data = {"tool": "charge_card"} if name == "tool.finished" else {}
            sealed = seal_entry(SEALER, run_id, writer, n, head, [[name, 1.5, data]])
            head = (0 if head is None else head[0] + 1, link_of(sealed))
            entries.append(sealed)
    anchored = entries[-2]
    return entries, {"writer": "c", "head": [len(entries) - 2, link_of(anchored)]}


async def _read(store: CheckpointStore, run_id: str, after: str | None = None) -> list[RunEvent]:
    """The run's events after `after` as a reader that starts there reads them (``events --after``, a reconnect)."""
    positions = await prime(store, SEALER, run_id, after, Positions())
    events = await read_events(store, SEALER, run_id, after, positions=positions)
    return events + await stream_end(store, SEALER, run_id, positions)


async def _stored(store: CheckpointStore, tamper: Tamper) -> str:
    run_id, flow = _ids()
    entries, anchor = _chain(run_id)
    await store.save(run_id, 0, _checkpoint(run_id, 0, flow))
    await store.save(run_id, 1, _checkpoint(run_id, 1, flow, "done", events=anchor))  # events: ANCHOR
    assert isinstance(store, EventStore)
    await store.append_events(run_id, tamper(entries))
    return run_id


async def _check(store: CheckpointStore, tamper: Tamper, what: str, *, late: bool = False) -> None:
    """`tamper`'s stream is reported (a problem read) and no copy reads as real, packed or not.

    `late`: read after the stream's last genuine entry, as a reader that reconnects reads.
    """
    if not isinstance(store, EventStore):
        return
    packing = (False, True) if isinstance(store, EventCompacting) else (False,)
    for packed in packing:
        run_id = await _stored(store, tamper)
        if packed:
            assert isinstance(store, EventCompacting)
            _expect(await store.compact_events(run_id), f"{what}: the stream was not packed")
        stored = list(await store.read_events(run_id))
        events = await _read(store, run_id, stored[-2].cursor if late else None)
        form = "packed" if packed else "as appended"
        _expect(any(e.problem for e in events), f"{what} ({form}) read back clean")
        charges = [e for e in events if e.name == "tool.finished"]
        _expect(len(charges) <= 1, f"{what} ({form}): a copy of tool.finished read as real")


def _without(*indexes: int) -> Tamper:
    return lambda entries: [e for i, e in enumerate(entries) if i not in indexes]


def _copy_of(index: int) -> Tamper:
    return lambda entries: [*entries, entries[index]]


def _swapped(i: int, j: int) -> Tamper:
    def swap(entries: list[SealedEvent]) -> list[SealedEvent]:
        out = list(entries)
        out[i], out[j] = out[j], out[i]
        return out

    return swap


async def check_event_chain_reads_clean(store: CheckpointStore) -> None:
    """A chain of three writers, untouched, reads with no problem (packed too) and its one charge."""
    if not isinstance(store, EventStore):
        return
    packing = (False, True) if isinstance(store, EventCompacting) else (False,)
    for packed in packing:
        run_id = await _stored(store, list)
        if packed:
            assert isinstance(store, EventCompacting)
            await store.compact_events(run_id)
        events = await _read(store, run_id)
        _expect(not [e.problem for e in events if e.problem], f"an untouched chain reads with problems: {events}")
        _expect([e.name for e in events].count("tool.finished") == 1, "the untouched chain's one charge")


async def check_event_chain_reports_a_duplicate(store: CheckpointStore) -> None:
    """A byte copy of the entry holding ``tool.finished charge_card``, appended at the end, is a replay.

    Read by a reader that starts after the last genuine entry (``agentflow events --after``, a
    viewer's reconnect): the copy's original lies before its cursor.
    """
    await _check(store, _copy_of(3), "a duplicated entry", late=True)


async def check_event_chain_reports_a_removed_entry(store: CheckpointStore) -> None:
    """One entry removed, the last of its writer (the next writer's first follows it), is a gap before the next."""
    await _check(store, _without(4), "an entry removed")


async def check_event_chain_reports_a_writers_removed_entries(store: CheckpointStore) -> None:
    """Every entry of one writer removed (the next writer took over from its last) is a gap."""
    await _check(store, _without(2, 3, 4), "a writer's entries removed")


async def check_event_chain_reports_a_removed_last_entry(store: CheckpointStore) -> None:
    """The stream's last entry (the run's ``run.finished``) removed: the ended run misses its end."""
    await _check(store, lambda entries: entries[:-1], "the last entry removed")


async def check_event_chain_reports_a_reorder(store: CheckpointStore) -> None:
    """A writer's last entry and the next writer's first swapped: the first read is not after what it follows."""
    await _check(store, _swapped(4, 5), "two entries reordered")


async def check_event_chain_reports_a_truncation(store: CheckpointStore) -> None:
    """The stream cut before the head the newest checkpoint names (the last writer's entries gone)."""
    await _check(store, lambda entries: entries[:5], "the stream truncated")


async def check_event_chain_reports_removed_first_entries(store: CheckpointStore) -> None:
    """The first writer's entries removed from a stream far shorter than a trim keeps."""
    await _check(store, _without(0, 1), "the first entries removed")
