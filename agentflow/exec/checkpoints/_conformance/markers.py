"""Conformance checks of markers (`MarkerStore`): one token per key at a time, lapsing, kept apart from leases.

Each check takes a store and raises `AssertionError` naming the rule the store breaks;
`conformance` collects them into `CHECKS`. Every check uses fresh keys and tokens. As for
leases, expiry is judged on the store's clock: where a marker must lapse, the check polls
`peek_markers` until it is gone, with a deadline.
"""

from __future__ import annotations

import asyncio
import uuid

from agentflow.exec.checkpoints._conformance.base import _expect, _expect_raises, _ids
from agentflow.exec.checkpoints._conformance.calls import RACERS
from agentflow.exec.checkpoints._conformance.leases import LONG, SHORT, _token, until_lapsed
from agentflow.exec.checkpoints.protocol import CheckpointStore, MarkerStore
from agentflow.exec.checkpoints.records import Marker


def _markers(store: CheckpointStore) -> MarkerStore:
    _expect(
        isinstance(store, MarkerStore),
        f"{type(store).__name__} has no markers (put_marker, peek_markers, take_marker): "
        "cancel requests and recover_all's bookkeeping live there",
    )
    assert isinstance(store, MarkerStore)  # for mypy: _expect raised otherwise
    return store


def _key() -> str:
    return f"check/{uuid.uuid4().hex}"


def _expect_marker(marker: Marker, key: str, value: str, token: str, what: str) -> Marker:
    """Fail unless `marker` is a `Marker` of `key` with this value and token; return it."""
    _expect(isinstance(marker, Marker), f"{what}: expected a Marker, got {marker!r}")
    got = (marker.key, marker.value, marker.token)
    _expect(got == (key, value, token), f"{what}: got the marker {got}, expected {(key, value, token)}")
    _expect(isinstance(marker.expires_at, float), f"{what}: expires_at is {marker.expires_at!r}, not a float")
    return marker


async def _expect_shown(store: MarkerStore, key: str, marker: Marker | None, what: str) -> None:
    shown = dict(await store.peek_markers([key]))
    want = {} if marker is None else {key: marker}
    _expect(shown == want, f"{what}: peek_markers() shows {shown}, expected {want}")


async def _wait_lapsed(store: MarkerStore, key: str, what: str) -> None:
    await until_lapsed(store.peek_markers, key, what)


async def check_marker_stands_for_its_token(store: CheckpointStore) -> None:
    """A live marker keeps another token's put out (returned unchanged); its own token's put replaces it."""
    markers = _markers(store)
    key, a, b = _key(), _token(), _token()
    first = _expect_marker(await markers.put_marker(key, "one", a, 1.0), key, "one", a, "a put on a free key")
    other = await markers.put_marker(key, "two", b, LONG)
    _expect(other == first, f"another token's put on a live marker returned {other!r}, expected {first!r}")
    await _expect_shown(markers, key, first, "after a refused put")
    again = _expect_marker(await markers.put_marker(key, "three", a, LONG), key, "three", a, "its token's put")
    _expect(again.expires_at > first.expires_at, f"a renewal kept expires_at {again.expires_at}")
    await _expect_shown(markers, key, again, "after its token's put")
    free = _key()
    both = dict(await markers.peek_markers([key, free]))
    _expect(both == {key: again}, f"peek_markers() of a set and a free key shows {both}")


async def check_marker_lapses(store: CheckpointStore) -> None:
    """A marker not put again lapses: another token sets the key, and the old token takes nothing."""
    markers = _markers(store)
    key, a, b = _key(), _token(), _token()
    await markers.put_marker(key, "old", a, SHORT)
    await _wait_lapsed(markers, key, "a short marker")
    taken = _expect_marker(await markers.put_marker(key, "new", b, LONG), key, "new", b, "a put on a lapsed key")
    _expect(not await markers.take_marker(key, a), "the lapsed marker's token took the marker another put")
    await _expect_shown(markers, key, taken, "after the old token's take")
    alone = _key()
    await markers.put_marker(alone, "old", a, SHORT)
    await _wait_lapsed(markers, alone, "a second short marker")
    _expect(not await markers.take_marker(alone, a), "a take of a lapsed marker must return False")


async def check_marker_taken_by_its_token_only(store: CheckpointStore) -> None:
    """Only the token that put a marker takes it; then the key is free."""
    markers = _markers(store)
    key, a, b = _key(), _token(), _token()
    _expect(not await markers.take_marker(key, a), "a take of a key nobody set must return False")
    held = await markers.put_marker(key, "mine", a, LONG)
    _expect(not await markers.take_marker(key, b), "another token took the marker")
    await _expect_shown(markers, key, held, "after another token's take")
    _expect(await markers.take_marker(key, a), "its token's take of a live marker must return True")
    await _expect_shown(markers, key, None, "after its token's take")
    _expect(not await markers.take_marker(key, a), "a second take must return False")
    _expect_marker(await markers.put_marker(key, "next", b, LONG), key, "next", b, "a put after the take")


async def check_marker_race_of_puts(store: CheckpointStore) -> None:
    """Of 20 coroutines putting one free key together, exactly one sets it, and every one sees that one."""
    markers = _markers(store)
    key = _key()
    tokens = [_token() for _ in range(RACERS)]
    got = await asyncio.gather(*(markers.put_marker(key, f"racer-{i}", t, LONG) for i, t in enumerate(tokens)))
    winners = [m for m, token in zip(got, tokens, strict=True) if m.token == token]
    _expect(len(winners) == 1, f"{len(winners)} of {RACERS} racers set the marker, expected exactly one")
    _expect({m.token for m in got} == {winners[0].token}, "the losers saw another marker than the winner's")
    await _expect_shown(markers, key, winners[0], "after the race")


async def check_markers_are_not_leases(store: CheckpointStore) -> None:
    """A marker and a lease of the same name are apart: neither shows, keeps out or frees the other."""
    markers = _markers(store)
    run_id, _ = _ids()
    a, b = _token(), _token()
    marker = await markers.put_marker(run_id, "a note", a, LONG)
    _expect(dict(await store.leases([run_id])) == {}, "a marker shows as a lease of the run of its name")
    lease = await store.take_lease(run_id, "B", b, LONG)
    _expect(lease.token == b, f"a marker kept the lease of the run of its name from being taken: {lease!r}")
    _expect(not await store.release_lease(run_id, a), "the marker's token released a lease")
    _expect(not await markers.take_marker(run_id, b), "the lease's token took a marker")
    await _expect_shown(markers, run_id, marker, "beside a lease of the same name")
    await store.release_lease(run_id, b)
    await _expect_shown(markers, run_id, marker, "after the lease of the same name was released")


async def check_marker_arguments(store: CheckpointStore) -> None:
    """A put needs a non-empty key, value and token and a positive ttl (ValueError), and sets nothing otherwise."""
    markers = _markers(store)
    key = _key()
    for k, value, token, ttl, what in (
        (key, "v", _token(), 0.0, "ttl 0"),
        (key, "v", _token(), -1.0, "a negative ttl"),
        (key, "", _token(), LONG, "an empty value"),
        (key, "v", "", LONG, "an empty token"),
        ("", "v", _token(), LONG, "an empty key"),
    ):
        await _expect_raises(ValueError, markers.put_marker(k, value, token, ttl), f"a put with {what}")
    await _expect_shown(markers, key, None, "after refused puts")
