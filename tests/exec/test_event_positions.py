"""Every event is sealed with its position: a replayed copy, an old event appended again, or a gap is a problem.

The seal covers the run and the payload of an entry (one append's events); the payload
carries ``pos = [writer, n]``, the number of its first event. An attacker who can write to
the store but has no key can still append a byte-for-byte copy of a signed entry, or an
older one, or delete one: each is reported by `read_events` and
`follow_events` (and so by `FlowClient.events` and the viewer), never read as a real event.
"""

from __future__ import annotations

from typing import Any

import pytest
from _kit.stores import StoreSetup, setups
from _kit.tickets import KEY, ORDER, TICKETS, make_tickets

from agentflow import Events, Executor, FlowRunner
from agentflow.exec.checkpoints import MemoryCheckpointStore
from agentflow.exec.checkpoints.protocol import EventStore
from agentflow.exec.checkpoints.records import StoredEvent
from agentflow.exec.run import events as run_events
from agentflow.exec.run.events import Positions, follow_events, read_events
from agentflow.exec.seal import Sealer

STREAMS = setups("memory", "sqlite", "fakeredis", "redis", "sql-sqlite", "sql-postgres")


async def _recorded_run(store_setup: StoreSetup) -> EventStore:
    store = store_setup.open()
    runner = FlowRunner(Executor(make_tickets().registry, events=Events(record=True)), checkpoints=store,
                        checkpoint_key=None if store.in_process else KEY)  # fmt: skip
    assert (await runner.run(TICKETS, ORDER, run_id="order-1")).status == "done"
    assert isinstance(store, EventStore)
    return store


def _sealer(store: EventStore) -> Sealer:
    local = getattr(store, "local_key", None)
    return Sealer(local if local is not None else KEY)


@pytest.mark.parametrize("store_setup", STREAMS, indirect=True)
async def test_a_run_s_own_events_read_back_without_a_problem(store_setup: StoreSetup) -> None:
    store = await _recorded_run(store_setup)
    events = await read_events(store, _sealer(store), "order-1")  # type: ignore[arg-type]
    assert events and all(e.problem is None for e in events)
    assert [e.name for e in events].count("tool.finished") == 3


def _names(sealer: Sealer, entry: StoredEvent) -> list[tuple[str, dict[str, Any]]]:
    """The (name, data) of each event a stored entry carries."""
    return [(name, data) for name, _, data in sealer.open_event(entry.event, "order-1")["events"]]


@pytest.mark.parametrize("store_setup", STREAMS, indirect=True)
async def test_a_byte_for_byte_copy_of_a_signed_entry_is_a_problem_not_more_events(store_setup: StoreSetup) -> None:
    store = await _recorded_run(store_setup)
    stored = list(await store.read_events("order-1"))
    sealer = _sealer(store)
    charged = next(e for e in stored if ("tool.finished", {"tool": "charge_card"}) in [
        (name, {"tool": data.get("tool")}) for name, data in _names(sealer, e)])  # fmt: skip
    # When someone appends a copy of the entry with charge_card's tool.finished, and of the run's first entry
    await store.append_events("order-1", [charged.event, stored[0].event])
    events = await read_events(store, sealer, "order-1")  # type: ignore[arg-type]
    # Then no event of either reads as an event: each is a replay
    copies = len(_names(sealer, charged)) + len(_names(sealer, stored[0]))
    real, copied = events[:-copies], events[-copies:]
    assert [e.name for e in real].count("tool.finished") == 3 and all(e.problem is None for e in real)
    for copy in copied:
        assert copy.name == "" and "a copy of an event already read" in (copy.problem or "")
    # And a follower (FlowClient.events, the viewer's live page) sees the same
    followed = [e async for e in follow_events(store, sealer, "order-1", settle_s=0.0, poll_s=0.01)]  # type: ignore[arg-type]
    assert [e.name for e in followed].count("tool.finished") == 3


@pytest.mark.parametrize("store_setup", setups("fakeredis", "redis"), indirect=True)
async def test_an_entry_deleted_between_two_kept_ones_is_reported_as_a_gap(
    store_setup: StoreSetup, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a run whose recorder appended as soon as it could (so its one writer wrote several entries)
    monkeypatch.setattr(run_events, "FLUSH_AFTER_S", 0.0)
    store = await _recorded_run(store_setup)
    stored = list(await store.read_events("order-1"))
    assert len(stored) >= 3, "the run's events went into fewer than three entries"
    # When someone deletes one entry of the stream (XDEL: no key needed)
    victim = stored[len(stored) // 2]
    await store_setup.rows.drop_event("order-1", victim.cursor)  # type: ignore[attr-defined]
    events = await read_events(store, _sealer(store), "order-1")  # type: ignore[arg-type]
    # Then the event after it says how many are missing
    gaps = [e for e in events if e.problem and "are missing before" in e.problem]
    assert len(gaps) == 1 and gaps[0].name  # the event itself is real
    assert len(events) == sum(len(_names(_sealer(store), e)) for e in stored if e is not victim)


async def test_a_cursor_inside_an_entry_reads_on_from_the_next_event() -> None:
    # Given a run's events in several entries of several events (a memory store; each superstep
    # took less than the recorder's wait): the start's, then one per superstep, each carried by
    # the save that gave the lease up, the last one's run.finished with it
    store = MemoryCheckpointStore()
    runner = FlowRunner(Executor(make_tickets().registry, events=Events(record=True)), checkpoints=store)
    await runner.start(TICKETS, ORDER, run_id="order-1")
    while (await runner.advance(TICKETS, "order-1")).status != "done":
        pass
    sealer = Sealer(store.local_key)
    every = await read_events(store, sealer, "order-1")
    assert len(await store.read_events("order-1")) > 2 and len(every) > 3 and every[-1].name == "run.finished"
    # When a reader goes on from each event's cursor, Then it reads exactly the events after it
    for i, event in enumerate(every):
        assert [e.name for e in await read_events(store, sealer, "order-1", after=event.cursor)] == [
            e.name for e in every[i + 1 :]
        ]
    # And a cursor that only looks like one inside an entry is refused with what a cursor is
    for bad in ("1~", "~1~0", "~1~x", "0~~1", "a~b~c~1"):
        with pytest.raises(ValueError, match="is not an event cursor"):
            await read_events(store, sealer, "order-1", after=bad)


def test_positions_tell_a_copy_an_older_event_and_a_gap_apart() -> None:
    positions = Positions()
    assert positions.check("1", "r", ["w", 0]) == (None, True)
    assert positions.check("2", "r", ["v", 5]) == (None, True)  # a writer first seen past 0: a trimmed start
    gap, real = positions.check("3", "r", ["w", 3])
    assert real and gap is not None and "events 1 to 2 of writer w" in gap
    older, real = positions.check("4", "r", ["w", 2])
    assert not real and older is not None and "older than an event read before it" in older
    copy, real = positions.check("5", "r", ["w", 3])
    assert not real and copy is not None and "a copy of an event already read" in copy
    none, real = positions.check("6", "r", None)
    assert not real and none is not None and "has no position" in none
