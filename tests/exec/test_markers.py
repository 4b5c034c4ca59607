"""Markers: signed notes beside runs, in the store's markers, that count only when they check (`run.markers`)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from _kit.stores import StoreSetup, setups
from _kit.tickets import KEY

from agentflow._events import Event, Events
from agentflow.celery._markers import worker_markers
from agentflow.celery._settings import WorkerSettings
from agentflow.celery._store_waits import ttl_s as store_wait_ttl_s
from agentflow.exec.checkpoints import CheckpointStore, MemoryCheckpointStore
from agentflow.exec.run.markers import MarkerBusy, Markers, key_of, marker_value
from agentflow.exec.run.store_waits import KIND as STORE_WAIT
from agentflow.exec.run.store_waits import note_store_wait, read_store_wait
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


# -- how long a marker lasts: never past its signed until, never past its kind's longest ------------

#: The set-ups whose markers a store writer can rewrite: every engine, on the real servers too.
MARKER_SETUPS = setups("memory", "sqlite", "fakeredis", "redis", "sql-postgres")
#: A sweep lock lasts 10 s, as `WorkerSettings.recover_lock_s` sets it by default.
LOCK_S = 10.0
TEN_YEARS_S = 10 * 365 * 24 * 3600.0


def _bounded(store: CheckpointStore, events: Events | None = None) -> Markers:
    return Markers(store, Sealer(KEY), events, longest={"lock": LOCK_S})


async def _captured_lock(store: CheckpointStore) -> str:
    """The value of a sweep lock a worker held and let go of (what a store writer saw while it stood)."""
    async with _bounded(store).holding("lock", "recover_all", "w1", LOCK_S):
        (stood,) = (await store.peek_markers([key_of("lock", "recover_all")])).values()
    return stood.value


@pytest.mark.parametrize("store_setup", MARKER_SETUPS, indirect=True)
async def test_a_captured_marker_written_back_with_a_far_expiry_is_no_marker(
    store_setup: StoreSetup, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a sweep lock a store writer captured while it stood, written back to lapse in ten years
    store = store_setup.open()
    value = await _captured_lock(store)
    await store_setup.rows.put_marker(key_of("lock", "recover_all"), value, "forged-token", time.time() + TEN_YEARS_S)
    # When a worker's sweep takes the lock, Then the marker does not count: it is reported and
    # removed, and the sweep holds the lock (it is not pushed ten years out)
    with caplog.at_level(logging.WARNING, "agentflow.markers"):
        mine, note = await _bounded(store).put("lock", "recover_all", {"owner": "w2"}, LOCK_S)
    assert mine and note.body["owner"] == "w2"
    assert "is kept by the store" in caplog.text and "longer than a lock marker is ever set for" in caplog.text


@pytest.mark.parametrize("store_setup", MARKER_SETUPS, indirect=True)
async def test_a_marker_lapses_at_its_signed_until_whatever_expiry_the_store_keeps(store_setup: StoreSetup) -> None:
    # Given a sweep lock signed for 10 s, written back to lapse later than that, though within the lock's longest
    store = store_setup.open()
    assert await store.peek_markers([key_of("lock", "recover_all")]) == {}  # and the store's tables made
    signed, value = marker_value(Sealer(KEY), "lock", "recover_all", {"owner": "w1"}, LOCK_S)
    await store_setup.rows.put_marker(key_of("lock", "recover_all"), value, "forged-token", time.time() + LOCK_S + 20)
    # When a worker finds it standing, Then it waits for it until its signed until, not the store's expiry
    mine, note = await _bounded(store).put("lock", "recover_all", {"owner": "w2"}, LOCK_S)
    assert not mine and note.body["owner"] == "w1"
    assert note.expires_at == signed["until"]


@pytest.mark.parametrize("store_setup", MARKER_SETUPS, indirect=True)
async def test_a_marker_signed_for_longer_than_its_kind_lasts_is_no_marker(store_setup: StoreSetup) -> None:
    # Given a recheck marker signed under the workers' key for twenty years (what a worker fooled by
    # a fake lease would have signed), kept by the store as long
    store = store_setup.open()
    assert await store.peek_markers([key_of("recheck", "r1")]) == {}  # and the store's tables made
    twenty_years = 2 * TEN_YEARS_S
    _, value = marker_value(Sealer(KEY), "recheck", "r1", {"owner": "w1"}, twenty_years)
    await store_setup.rows.put_marker(key_of("recheck", "r1"), value, "forged-token", time.time() + twenty_years)
    # When a worker whose leases last 30 s reads it, Then it does not count, and it is removed
    markers = Markers(store, Sealer(KEY), longest={"recheck": 30.0})
    assert await markers.peek("recheck", ["r1"]) == {}
    assert await store.peek_markers([key_of("recheck", "r1")]) == {}


async def test_a_put_longer_than_its_kind_lasts_is_refused() -> None:
    store = MemoryCheckpointStore()
    with pytest.raises(ValueError, match="a lock marker lasts 10.0 s at most"):
        await _bounded(store).put("lock", "recover_all", {"owner": "w1"}, LOCK_S + 1)
    assert await store.peek_markers([key_of("lock", "recover_all")]) == {}


#: A worker's store-wait back-off: 10 s, doubled each try, capped at ten times stale_after_s (100 s), five tries.
STORE_WAITS = WorkerSettings(store_retries=5, store_retry_s=10.0, stale_after_s=10.0, recover_interval_s=60.0)


@pytest.mark.parametrize("store_setup", MARKER_SETUPS, indirect=True)
async def test_a_store_wait_marker_lasts_no_longer_than_the_workers_back_off_allows(store_setup: StoreSetup) -> None:
    store = store_setup.open()
    markers = worker_markers(store, Sealer(KEY), STORE_WAITS)
    # Given the longest a worker with these settings waits before a superstep's next try (its last
    # back-off: 100 s, longer than recover_all's 70 s), and two leases more
    longest = 100.0 + 2 * STORE_WAITS.lease_s
    assert markers.longest(STORE_WAIT) == longest
    # Then the marker it leaves for any of its tries, or for recover_all, is within that
    assert max(store_wait_ttl_s(STORE_WAITS, STORE_WAITS.store_backoff_s(r)) for r in range(5)) == longest
    assert store_wait_ttl_s(STORE_WAITS, None) < longest
    await note_store_wait(markers, "r1", 3, "not acknowledged", time.time() + 100.0, longest)
    assert (await read_store_wait(store, Sealer(KEY), "r1", 3)) is not None
    # When a store-wait marker signed under the workers' key for a day is written back, kept as long
    day = 24 * 3600.0
    _, value = marker_value(Sealer(KEY), STORE_WAIT, "r2", {"step": 3, "why": "?", "retry_at": None}, day)
    await store_setup.rows.put_marker(key_of(STORE_WAIT, "r2"), value, "forged-token", time.time() + day)
    # Then it does not count for the worker, and is removed
    assert await markers.peek(STORE_WAIT, ["r2"]) == {}
    assert await store.peek_markers([key_of(STORE_WAIT, "r2")]) == {}
