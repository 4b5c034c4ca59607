"""Conformance checks of run leases: one holder at a time, its token alone renews or releases, leases lapse.

Each check takes a store and raises `AssertionError` naming the rule the store breaks;
`conformance` collects them into `CHECKS`. Every check uses fresh run ids and tokens.

The store judges expiry on its own clock, which may differ from this host's: no check
compares ``expires_at`` with the local time. Where a lease must lapse, the check polls
`leases` until it is gone (with a deadline) instead of sleeping for a guessed time.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Final

from agentflow._errors import CheckpointNotFound
from agentflow.exec.checkpoints._conformance.base import _checkpoint, _expect, _expect_raises, _ids
from agentflow.exec.checkpoints._conformance.calls import RACERS
from agentflow.exec.checkpoints.protocol import CheckpointStore
from agentflow.exec.checkpoints.records import Lease

#: A lease that outlives any check (seconds).
LONG: Final = 60.0
#: A lease meant to lapse during the check (seconds).
SHORT: Final = 0.05
#: How long a check waits for a short lease to lapse before it fails (seconds).
LAPSE_DEADLINE_S: Final = 5.0


def _token() -> str:
    return f"token-{uuid.uuid4().hex}"


def _expect_lease(lease: Lease | None, run_id: str, owner: str, token: str, what: str) -> Lease:
    """Fail unless `lease` is a `Lease` of the run with this owner and token; return it."""
    if not isinstance(lease, Lease):
        raise AssertionError(f"{what}: expected a Lease, got {lease!r}")
    got = (lease.run_id, lease.owner, lease.token)
    _expect(got == (run_id, owner, token), f"{what}: got the lease {got}, expected {(run_id, owner, token)}")
    _expect(isinstance(lease.expires_at, float), f"{what}: expires_at is {lease.expires_at!r}, not a float")
    return lease


async def _expect_held(store: CheckpointStore, run_id: str, lease: Lease | None, what: str) -> None:
    """Fail unless `leases` shows exactly `lease` for the run (None: no live lease)."""
    shown = dict(await store.leases([run_id]))
    want = {} if lease is None else {run_id: lease}
    _expect(shown == want, f"{what}: leases() shows {shown}, expected {want}")


async def until_lapsed(read: Callable[[list[str]], Awaitable[Mapping[str, object]]], key: str, what: str) -> None:
    """Poll `read` (the live leases, or markers, among some keys) until `key` is not among them.

    Raises:
        AssertionError: it still was after `LAPSE_DEADLINE_S`.
    """
    deadline = time.monotonic() + LAPSE_DEADLINE_S
    while key in await read([key]):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: a {SHORT} s one is still live after {LAPSE_DEADLINE_S} s")
        await asyncio.sleep(0.01)


async def _wait_lapsed(store: CheckpointStore, run_id: str, what: str) -> None:
    """Poll `leases` until the run has no live lease; fail after `LAPSE_DEADLINE_S`."""
    await until_lapsed(store.leases, run_id, what)


async def check_lease_is_exclusive(store: CheckpointStore) -> None:
    """A live lease has one holder: another token's take gets the holder's lease back, unchanged."""
    run_id, _ = _ids()
    a, b = _token(), _token()
    held = _expect_lease(await store.take_lease(run_id, "A", a, LONG), run_id, "A", a, "a take of a free lease")
    other = await store.take_lease(run_id, "B", b, LONG)
    _expect(
        other == held, f"a take of a held lease by another token returned {other!r}, expected the holder's {held!r}"
    )
    await _expect_held(store, run_id, held, "after a refused take")
    unrelated, _ = _ids()
    await _expect_held(store, unrelated, None, "a run nobody took")
    both = dict(await store.leases([run_id, unrelated]))
    _expect(both == {run_id: held}, f"leases() of a held and a free run shows {both}")


async def check_lease_take_again_by_holder_renews(store: CheckpointStore) -> None:
    """Taking a lease again with the token that holds it renews it (and it stays held against others)."""
    run_id, _ = _ids()
    a = _token()
    first = await store.take_lease(run_id, "A", a, 1.0)
    again = _expect_lease(await store.take_lease(run_id, "A", a, LONG), run_id, "A", a, "the holder's second take")
    _expect(
        again.expires_at > first.expires_at,
        f"the holder's take with a longer ttl kept expires_at {again.expires_at}, first {first.expires_at}",
    )
    await _expect_held(store, run_id, again, "after the holder took its lease again")
    other = await store.take_lease(run_id, "B", _token(), LONG)
    _expect(other == again, f"another token's take after the renewal returned {other!r}")


async def check_lease_renewed_by_holder_only(store: CheckpointStore) -> None:
    """Only the holder's token renews a live lease; another token's renewal changes nothing."""
    run_id, _ = _ids()
    a, b = _token(), _token()
    _expect(await store.renew_lease(run_id, a, LONG) is None, "renew of a lease nobody took must return None")
    await _expect_held(store, run_id, None, "after renewing a free lease")
    held = await store.take_lease(run_id, "A", a, 1.0)
    _expect(await store.renew_lease(run_id, b, LONG) is None, "another token renewed the lease")
    await _expect_held(store, run_id, held, "after another token's renewal")
    renewed = _expect_lease(await store.renew_lease(run_id, a, LONG), run_id, "A", a, "the holder's renewal")
    _expect(renewed.expires_at > held.expires_at, f"renewal kept expires_at at {renewed.expires_at}")
    await _expect_held(store, run_id, renewed, "after the holder's renewal")


async def check_lease_lapses(store: CheckpointStore) -> None:
    """A lease not renewed lapses: it is free to take, and its old token neither renews nor releases it."""
    run_id, _ = _ids()
    a, b = _token(), _token()
    await store.take_lease(run_id, "A", a, SHORT)
    await _wait_lapsed(store, run_id, "a short lease")
    taken = await store.take_lease(run_id, "B", b, LONG)
    _expect_lease(taken, run_id, "B", b, "a take of a lapsed lease")
    _expect(await store.renew_lease(run_id, a, LONG) is None, "the lapsed holder renewed the lease another took")
    _expect(not await store.release_lease(run_id, a), "the lapsed holder released the lease another took")
    await _expect_held(store, run_id, taken, "after the lapsed holder tried to renew and release")
    # A lapsed lease nobody took again: its holder cannot renew it, and releasing it says False.
    alone, _ = _ids()
    await store.take_lease(alone, "A", a, SHORT)
    await _wait_lapsed(store, alone, "a second short lease")
    _expect(await store.renew_lease(alone, a, LONG) is None, "a lapsed lease was renewed")
    _expect(not await store.release_lease(alone, a), "release of a lapsed lease must return False")
    await _expect_held(store, alone, None, "after the lapsed lease was released")
    _expect_lease(await store.take_lease(alone, "B", b, LONG), alone, "B", b, "a take after the release")


async def check_lease_released_by_holder_only(store: CheckpointStore) -> None:
    """Only the holder's token releases a live lease; then it is free."""
    run_id, _ = _ids()
    a, b = _token(), _token()
    _expect(not await store.release_lease(run_id, a), "release of a lease nobody took must return False")
    held = await store.take_lease(run_id, "A", a, LONG)
    _expect(not await store.release_lease(run_id, b), "another token released the lease")
    await _expect_held(store, run_id, held, "after another token's release")
    _expect(await store.release_lease(run_id, a), "the holder's release of its live lease must return True")
    await _expect_held(store, run_id, None, "after the holder's release")
    _expect(not await store.release_lease(run_id, a), "a second release must return False")
    _expect_lease(await store.take_lease(run_id, "B", b, LONG), run_id, "B", b, "a take after the release")


async def _race_takes(store: CheckpointStore, run_id: str, what: str) -> Lease:
    """Race `RACERS` takes with distinct tokens; fail unless exactly one wins and every racer sees it."""
    tokens = [_token() for _ in range(RACERS)]
    got = await asyncio.gather(*(store.take_lease(run_id, f"racer-{i}", t, LONG) for i, t in enumerate(tokens)))
    winners = [i for i, (lease, token) in enumerate(zip(got, tokens, strict=True)) if lease.token == token]
    _expect(len(winners) == 1, f"{what}: {len(winners)} of {RACERS} racers took the lease, expected exactly one")
    winner = got[winners[0]]
    seen = {lease.token for lease in got}
    _expect(seen == {winner.token}, f"{what}: the losers saw {len(seen) - 1} other holders than the winner")
    await _expect_held(store, run_id, winner, what)
    return winner


async def check_lease_race_of_takers(store: CheckpointStore) -> None:
    """Of 20 coroutines taking one free lease together, exactly one gets it; all see that one. Again once lapsed."""
    run_id, _ = _ids()
    await _race_takes(store, run_id, "racing for a free lease")
    lapsing, _ = _ids()
    await store.take_lease(lapsing, "A", _token(), SHORT)
    await _wait_lapsed(store, lapsing, "a short lease")
    await _race_takes(store, lapsing, "racing for a lapsed lease")


async def check_lease_needs_no_checkpoint_and_delete_forgets_it(store: CheckpointStore) -> None:
    """A run is held before any checkpoint is saved (no row appears); `delete` forgets its lease."""
    run_id, flow = _ids()
    a, b = _token(), _token()
    held = _expect_lease(await store.take_lease(run_id, "A", a, LONG), run_id, "A", a, "a take of a run with no rows")
    await _expect_raises(CheckpointNotFound, store.latest(run_id), "latest of a run that is only held")
    _expect(list(await store.history(run_id)) == [], "a lease made a checkpoint row appear")
    # The held run starts, and the lease is unchanged by the save.
    await store.save(run_id, 0, _checkpoint(run_id, 0, flow))
    await _expect_held(store, run_id, held, "after step 0 of the held run")
    await store.delete(run_id)
    await _expect_held(store, run_id, None, "after delete")
    _expect_lease(await store.take_lease(run_id, "B", b, LONG), run_id, "B", b, "a take after delete")
    # A run that never had a checkpoint is deleted with its lease too.
    bare, _ = _ids()
    await store.take_lease(bare, "A", a, LONG)
    await store.delete(bare)
    await _expect_held(store, bare, None, "after delete of a run with a lease only")


async def check_lease_arguments(store: CheckpointStore) -> None:
    """A take needs a positive ttl and a non-empty owner and token (ValueError), and takes nothing otherwise."""
    run_id, _ = _ids()
    for owner, token, ttl, what in (
        ("A", _token(), 0.0, "ttl 0"),
        ("A", _token(), -1.0, "a negative ttl"),
        ("", _token(), LONG, "an empty owner"),
        ("A", "", LONG, "an empty token"),
    ):
        await _expect_raises(ValueError, store.take_lease(run_id, owner, token, ttl), f"a take with {what}")
    await _expect_held(store, run_id, None, "after refused takes")
