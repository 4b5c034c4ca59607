"""Conformance checks of event streams (`EventStore`): order, cursors, the bound, deletion, forgery.

A store without the optional `EventStore` part passes them trivially: it records no
stream. Each check takes a store and raises `AssertionError` naming the rule it breaks.
"""

from __future__ import annotations

from agentflow._errors import CheckpointStoreCorrupt
from agentflow.exec.checkpoints import retention
from agentflow.exec.checkpoints._conformance.base import SEALER, _expect, _expect_raises, _ids, _save_steps
from agentflow.exec.checkpoints._conformance.retention import CUT_OFF, OWNER, _run
from agentflow.exec.checkpoints.protocol import CheckpointStore, EventCompacting, EventStore
from agentflow.exec.checkpoints.records import ENDED, EVENTS_KEPT, SealedEvent


def _events(run_id: str, start: int, count: int) -> list[SealedEvent]:
    bodies = [{"name": "n", "at": 1.5, "data": {"i": i, "t": "ü ✓\n"}} for i in range(start, start + count)]
    return [SEALER.seal_event(run_id, body) for body in bodies]


async def _numbers(store: EventStore, run_id: str, after: str | None = None) -> list[int]:
    return [SEALER.open_event(e.event, run_id)["data"]["i"] for e in await store.read_events(run_id, after, 100_000)]


async def check_events_in_order_with_cursors(store: CheckpointStore) -> None:
    """Events come back in append order, as written; reading after a cursor returns exactly the later ones."""
    if not isinstance(store, EventStore):
        return
    run_id, other = _ids()[0], _ids()[0]
    _expect(not await store.read_events(run_id), "a run with no events has an empty stream")
    written = _events(run_id, 0, 3) + _events(run_id, 3, 2)
    await store.append_events(run_id, written[:3])
    await store.append_events(other, _events(other, 100, 1))
    await store.append_events(run_id, written[3:])
    read = list(await store.read_events(run_id))
    _expect([e.event for e in read] == written, "the stream holds the events as written, in append order")
    for i, stored in enumerate(read):
        later = await _numbers(store, run_id, stored.cursor)
        _expect(later == list(range(i + 1, 5)), f"after cursor {i}: got {later}, expected {list(range(i + 1, 5))}")
    _expect(len(await store.read_events(run_id, None, 2)) == 2, "read_events returns at most `limit` events")
    _expect(await _numbers(store, other) == [100], "each run has its own stream")
    await _expect_raises(ValueError, store.append_events(run_id, _events(other, 0, 1)), "another run's event")


async def check_event_positions_are_append_only(store: CheckpointStore) -> None:
    """An event, once stored, keeps its place and its bytes: later appends only add after it, at growing cursors.

    What makes a copy or a reorder visible to a reader (`agentflow.exec.run.events.Positions`):
    a replayed event lands after the ones it copies, never in their place.
    """
    if not isinstance(store, EventStore):
        return
    run_id = _ids()[0]
    first = _events(run_id, 0, 3)
    await store.append_events(run_id, first)
    before = list(await store.read_events(run_id))
    await store.append_events(run_id, [first[0], *_events(run_id, 3, 2)])  # a byte-for-byte copy among new ones
    after = list(await store.read_events(run_id))
    _expect(after[: len(before)] == before, "appending changed an event already stored (its cursor or its bytes)")
    _expect(len(after) == len(before) + 3, "each append adds every event given, a copy included")
    _expect(after[len(before)].event == first[0], "a copy is stored after the events before it, not in its place")
    later = [e.cursor for e in await store.read_events(run_id, before[-1].cursor)]
    _expect(later == [e.cursor for e in after[len(before) :]], "reading after the last old cursor gives the new ones")


async def check_events_are_bounded(store: CheckpointStore) -> None:
    """A stream keeps about its newest `EVENTS_KEPT` events: the oldest go first."""
    if not isinstance(store, EventStore):
        return
    run_id = _ids()[0]
    total = EVENTS_KEPT + 300
    await store.append_events(run_id, _events(run_id, 0, total))
    kept = await _numbers(store, run_id)
    _expect(EVENTS_KEPT <= len(kept) < total, f"the stream kept {len(kept)} of {total} events, expected ~{EVENTS_KEPT}")
    _expect(kept == list(range(total - len(kept), total)), "the stream kept the newest events, in order")


async def check_events_go_with_the_run(store: CheckpointStore) -> None:
    """`delete` and `prune` remove a run's events with it."""
    if not isinstance(store, EventStore):
        return
    run_id, flow = _ids()
    await _save_steps(store, run_id, flow, "running", "done")
    await store.append_events(run_id, _events(run_id, 0, 2))
    await store.delete(run_id)
    _expect(not await store.read_events(run_id), "delete removes the run's events")
    old = await _run(store, _ids()[1], "done", CUT_OFF - 100)
    await store.append_events(old, _events(old, 0, 2))
    pruned = await retention.prune(store, [old], CUT_OFF, ENDED, OWNER)
    _expect(pruned.run_ids == (old,), f"the old run was not pruned: {pruned}")
    _expect(not await store.read_events(old), "prune removes the run's events")


async def check_forged_event_is_refused(store: CheckpointStore) -> None:
    """An event changed in the store fails its check on read (the store keeps bytes exact)."""
    if not isinstance(store, EventStore):
        return
    run_id = _ids()[0]
    genuine = _events(run_id, 0, 1)[0]
    forged = SealedEvent(run_id, genuine.payload.replace(b'"i":0', b'"i":9'), genuine.kid, genuine.sig)
    moved = _events(_ids()[0], 0, 1)[0]
    await store.append_events(run_id, [genuine, forged, SealedEvent(run_id, moved.payload, moved.kid, moved.sig)])
    first, *bad = await store.read_events(run_id)
    _expect(SEALER.open_event(first.event, run_id)["data"]["i"] == 0, "a genuine event opens")
    for stored in bad:
        try:
            SEALER.open_event(stored.event, run_id)
        except CheckpointStoreCorrupt:
            continue
        raise AssertionError("a changed or moved event opened as data")


async def check_compacted_stream_reads_as_before(store: CheckpointStore) -> None:
    """`compact_events` keeps every entry, its bytes and its cursor; appends after it go on after them.

    What a reader holds from before (a cursor) reads on from the same place; a second
    compaction takes the packed entries and the later ones together. A store without the
    optional `EventCompacting` part passes trivially.
    """
    if not isinstance(store, EventStore) or not isinstance(store, EventCompacting):
        return
    run_id, other = _ids()[0], _ids()[0]
    _expect(not await store.compact_events(run_id), "a run with no events has nothing to compact")
    for start, count in ((0, 2), (2, 1), (3, 2)):
        await store.append_events(run_id, _events(run_id, start, count))
    await store.append_events(other, _events(other, 100, 1))
    before = list(await store.read_events(run_id))
    _expect(await store.compact_events(run_id), "a stream of three entries was not compacted")
    after = list(await store.read_events(run_id))
    _expect(after == before, "compaction changed an entry, its bytes or its cursor")
    for i, stored in enumerate(before):
        later = [e.cursor for e in await store.read_events(run_id, stored.cursor)]
        _expect(later == [e.cursor for e in before[i + 1 :]], f"after cursor {i} the compacted stream reads otherwise")
    _expect(len(await store.read_events(run_id, None, 2)) == 2, "read_events returns at most `limit` entries")
    _expect(await _numbers(store, other) == [100], "compaction touched another run's stream")
    await store.append_events(run_id, _events(run_id, 5, 2))
    grown = list(await store.read_events(run_id))
    _expect(grown[: len(before)] == before and len(grown) == len(before) + 2, "an append after compaction")
    _expect(
        [e.cursor for e in await store.read_events(run_id, before[-1].cursor)] == [e.cursor for e in grown[-2:]],
        "reading after the last compacted cursor gives the entries appended since",
    )
    _expect(await store.compact_events(run_id), "a stream appended to after its compaction was not compacted again")
    _expect(list(await store.read_events(run_id)) == grown, "the second compaction changed what reads")
    _expect(await _numbers(store, run_id) == list(range(7)), "the events read after two compactions")
