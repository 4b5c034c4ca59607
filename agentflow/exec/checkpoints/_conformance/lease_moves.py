"""Conformance checks of leases moved with a write (`LeaseMoving`): both happen, or neither does.

A store without the optional `LeaseMoving` part passes them trivially: the run protocol
then takes and gives back leases with round trips of their own, and never asks it to move
one with a write.
"""

from __future__ import annotations

import uuid

from agentflow._errors import CheckpointConflict, RunHeld
from agentflow.exec.checkpoints._conformance.base import _call, _checkpoint, _expect, _expect_raises, _ids
from agentflow.exec.checkpoints._conformance.events import _events, _numbers
from agentflow.exec.checkpoints.protocol import CheckpointStore, EventStore, LeaseMoving
from agentflow.exec.checkpoints.records import LeaseMove

#: A lease that outlives any check (seconds).
_LONG = 60.0


def _token() -> str:
    return f"token-{uuid.uuid4().hex}"


async def _holder(store: CheckpointStore, run_id: str) -> tuple[str, str] | None:
    lease = (await store.leases([run_id])).get(run_id)
    return None if lease is None else (lease.owner, lease.token)


async def check_record_moves_the_lease_of_its_bearer(store: CheckpointStore) -> None:
    """A record moving the lease: taken from its bearer (or a free lease) and the record stored, together."""
    if not isinstance(store, LeaseMoving):
        return
    run_id, flow = _ids()
    await store.save(run_id, 0, _checkpoint(run_id, 0, flow))
    baton, own = _token(), _token()
    await store.take_lease(run_id, "saver", baton, _LONG)
    # The bearer of the baton takes the lease as its own token with its first record.
    await store.record_call_moving(run_id, _call(run_id, 0, 0), LeaseMove(baton, own, "next", _LONG))
    _expect(
        await _holder(store, run_id) == ("next", own), "a record moved the lease, yet the new token does not hold it"
    )
    _expect(len(await store.calls(run_id)) == 1, "a record that moved the lease was not stored")
    # A free lease is taken by any bearer (the baton lapsed, nobody took it since).
    other, flow2 = _ids()
    await store.save(other, 0, _checkpoint(other, 0, flow2))
    await store.record_call_moving(other, _call(other, 0, 0), LeaseMove(_token(), own, "late", _LONG))
    _expect(await _holder(store, other) == ("late", own), "a record did not take a free lease")


async def check_record_refused_by_another_holder_writes_nothing(store: CheckpointStore) -> None:
    """Another token's live lease refuses a moving record with `RunHeld`; neither the record nor the lease changes."""
    if not isinstance(store, LeaseMoving):
        return
    run_id, flow = _ids()
    await store.save(run_id, 0, _checkpoint(run_id, 0, flow))
    holder = _token()
    await store.take_lease(run_id, "holder", holder, _LONG)
    move = LeaseMove(_token(), _token(), "late", _LONG)
    await _expect_raises(RunHeld, store.record_call_moving(run_id, _call(run_id, 0, 0), move), "a stale baton's record")
    _expect(await store.calls(run_id) == [], "a record refused for the lease was stored")
    _expect(await _holder(store, run_id) == ("holder", holder), "a refused record moved the lease")
    # And a record the log refuses (out of sequence) moves no lease either.
    mine = LeaseMove(holder, _token(), "next", _LONG)
    await _expect_raises(CheckpointConflict, store.record_call_moving(run_id, _call(run_id, 0, 3), mine), "a gap")
    _expect(await _holder(store, run_id) == ("holder", holder), "a record refused for its position moved the lease")


async def check_save_hands_the_lease_on_or_gives_it_up(store: CheckpointStore) -> None:
    """A moving save hands the lease to a new token or gives it up; a refused save (its step taken) moves nothing."""
    if not isinstance(store, LeaseMoving):
        return
    run_id, flow = _ids()
    await store.save(run_id, 0, _checkpoint(run_id, 0, flow))
    mine, baton = _token(), _token()
    await store.take_lease(run_id, "worker", mine, _LONG)
    step1 = _checkpoint(run_id, 1, flow)
    handed = LeaseMove(mine, baton, "handed", _LONG)
    await store.save_after_calls_moving(run_id, 1, step1, [_call(run_id, 0, 0)], handed)
    _expect(await store.latest(run_id) == step1, "a save that handed the lease on was not stored")
    _expect(await _holder(store, run_id) == ("handed", baton), "a save did not hand the lease to the baton")
    stale = _checkpoint(run_id, 1, flow)
    await _expect_raises(
        CheckpointConflict,
        store.save_after_calls_moving(run_id, 1, stale, [], LeaseMove(baton, None, "x", _LONG)),
        "a save of a step that is taken",
    )
    _expect(await _holder(store, run_id) == ("handed", baton), "a refused save moved the lease")
    other = _token()
    await _expect_raises(
        RunHeld,
        store.save_after_calls_moving(run_id, 2, _checkpoint(run_id, 2, flow), [], LeaseMove(other, None, "x", _LONG)),
        "a save by another than the baton's bearer",
    )
    _expect((await store.latest(run_id)).step == 1, "a save refused for the lease was stored")
    done = _checkpoint(run_id, 2, flow, "done")
    await store.save_after_calls_moving(run_id, 2, done, [], LeaseMove(baton, None, "x", _LONG))
    _expect(await _holder(store, run_id) is None, "a save that gave the lease up left it held")


async def check_save_carries_events_only_when_stored(store: CheckpointStore) -> None:
    """A moving save's events join the run's stream, after those before them, when it is stored; never when refused."""
    if not isinstance(store, LeaseMoving) or not isinstance(store, EventStore):
        return
    run_id, flow = _ids()
    await store.save(run_id, 0, _checkpoint(run_id, 0, flow))
    await store.append_events(run_id, _events(run_id, 0, 2))
    mine = _token()
    await store.take_lease(run_id, "worker", mine, _LONG)
    other = LeaseMove(_token(), None, "x", _LONG)
    await _expect_raises(
        RunHeld,
        store.save_after_calls_moving(run_id, 1, _checkpoint(run_id, 1, flow), [], other, _events(run_id, 10, 1)),
        "a save by another than the lease's holder",
    )
    _expect(await _numbers(store, run_id) == [0, 1], "a save refused for the lease stored its events")
    gives_up = LeaseMove(mine, None, "worker", _LONG)
    await _expect_raises(
        CheckpointConflict,
        store.save_after_calls_moving(run_id, 2, _checkpoint(run_id, 2, flow), [], gives_up, _events(run_id, 20, 1)),
        "a save of a step that is not next",
    )
    _expect(await _numbers(store, run_id) == [0, 1], "a save refused for its step stored its events")
    await store.save_after_calls_moving(run_id, 1, _checkpoint(run_id, 1, flow), [], gives_up, _events(run_id, 2, 2))
    _expect(await _numbers(store, run_id) == [0, 1, 2, 3], "a stored save's events are not in the stream, in order")
    _expect(await _holder(store, run_id) is None, "a save that carried events did not give the lease up")
