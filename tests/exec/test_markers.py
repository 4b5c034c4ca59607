"""Markers: signed notes beside runs, in the store's markers, that count only when they check (`run.markers`)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from _kit.tickets import KEY

from agentflow._events import Event, Events
from agentflow.exec.checkpoints import MemoryCheckpointStore
from agentflow.exec.run.markers import MarkerBusy, Markers, key_of, marker_value
from agentflow.exec.seal import Sealer

OTHER_KEY = b"another-key-the-workers-lack-0123456789"


def _markers(store: MemoryCheckpointStore, events: Events | None = None) -> Markers:
    return Markers(store, Sealer(KEY), events)


async def test_of_two_puts_the_first_sets_the_marker_and_the_second_reads_it() -> None:
    store = MemoryCheckpointStore()
    first, second = _markers(store), _markers(store)
    mine, note = await first.put("recheck", "r1", {"owner": "w1"}, 60.0)
    theirs, seen = await second.put("recheck", "r1", {"owner": "w2"}, 60.0)
    assert mine and not theirs
    assert seen.body["owner"] == "w1" and seen.token == note.token
    assert set(await second.peek("recheck", ["r1", "r2"])) == {"r1"}


@pytest.mark.parametrize(
    "value",
    [
        "written by hand",
        marker_value(Sealer(OTHER_KEY), "recheck", "r1", {"owner": "mallory"}, 60.0)[1],
        marker_value(Sealer(KEY), "recheck", "r2", {"owner": "mallory"}, 60.0)[1],  # another run's
        marker_value(Sealer(KEY), "cancel", "r1", {"owner": "mallory"}, 60.0)[1],  # another kind's
        marker_value(Sealer(KEY), "recheck", "r1", {"owner": "mallory"}, 60.0, now=time.time() - 3600)[1],
    ],
    ids=["unsigned", "other-key", "other-run", "other-kind", "meant-to-lapse-an-hour-ago"],
)
async def test_a_marker_that_does_not_check_is_no_marker(value: str, caplog: pytest.LogCaptureFixture) -> None:
    # Given a marker someone wrote straight into the store, for a day
    store = MemoryCheckpointStore()
    await store.put_marker(key_of("recheck", "r1"), value, "forged-token", 86400.0)
    events, seen = Events(), list[Event]()
    events.subscribe(seen.append)
    # When a worker reads it, Then it does not count: it is reported and removed
    with caplog.at_level(logging.WARNING, "agentflow.markers"):
        assert await _markers(store, events).peek("recheck", ["r1"]) == {}
    assert "does not count" in caplog.text
    assert [(e.name, e.run_id, e.data["kind"]) for e in seen] == [("control.refused", "r1", "recheck")]
    assert await store.peek_markers([key_of("recheck", "r1")]) == {}


async def test_a_put_replaces_a_marker_that_does_not_check() -> None:
    store = MemoryCheckpointStore()
    await store.put_marker(key_of("lock", "recover_all"), "written by hand", "forged-token", 86400.0)
    mine, note = await _markers(store).put("lock", "recover_all", {"owner": "w1"}, 10.0)
    assert mine and note.body["owner"] == "w1"


async def test_a_marker_held_is_renewed_keeps_others_out_and_goes_with_its_holder() -> None:
    # Given a marker held with a short lifetime
    store = MemoryCheckpointStore()
    async with _markers(store).holding("lock", "prune", "w1", 0.3) as held:
        # When the holder works for several lifetimes, Then it is renewed: another holder is kept out
        began = time.monotonic()
        while time.monotonic() - began < 1.0:
            with pytest.raises(MarkerBusy, match="lock/prune is held by w1"):
                async with _markers(store).holding("lock", "prune", "w2", 0.3):
                    pass
            await asyncio.sleep(0.05)
        assert held.body["owner"] == "w1"
    # And once the holder lets go, it is gone
    assert await _markers(store).peek("lock", ["prune"]) == {}
