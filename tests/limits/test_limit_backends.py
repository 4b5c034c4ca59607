"""The semaphore and the sliding window of each limits backend (local; Redis real and fakeredis)."""

from __future__ import annotations

import asyncio
import time

import pytest
from _kit.poll import until

from agentflow.exec.limits import Limit, LimitBackend

#: How far the backend's clock (PostgreSQL's, Redis's) and this process's may drift apart in a test.
CLOCKS_S = 0.02


async def test_a_full_set_of_slots_refuses_until_one_is_given_back(backend: LimitBackend) -> None:
    # Given a limit of 2 calls in flight, both held
    lim = Limit("api", concurrency=2)
    assert await backend.take(lim, "", "a") is None
    assert await backend.take(lim, "", "b") is None

    # When a third call asks, then one holder gives its slot back
    refused = await backend.take(lim, "", "c")
    await backend.release(lim, "", "a")

    # Then the third was told to wait for a slot, and gets one now
    assert refused is not None and refused.why == "concurrency"
    assert await backend.take(lim, "", "c") is None
    assert (await backend.take(lim, "", "d")) is not None


async def test_the_window_refuses_the_start_past_the_rate_and_says_when_it_has_room(backend: LimitBackend) -> None:
    # Given a limit of 3 starts per 0.5 s, used up
    lim = Limit("api", rate=3, interval_s=0.5, margin_s=0)
    began = time.monotonic()
    for token in "abc":
        assert await backend.take(lim, "", token) is None

    # When a fourth asks
    refused = await backend.take(lim, "", "d")

    # Then it waits until the oldest start leaves the window, and not longer (that start was
    # made after `began`: however slow the machine, the window still holds it this long)
    assert refused is not None and refused.why == "rate"
    assert 0.5 - (time.monotonic() - began) - CLOCKS_S < refused.seconds <= 0.5

    async def taken() -> bool:
        return await backend.take(lim, "", "d") is None

    await until(taken, "room in the window", timeout_s=2)
    assert time.monotonic() - began >= 0.45


async def test_a_refused_take_takes_nothing(backend: LimitBackend) -> None:
    # Given a limit of 1 in flight and 1 start per 0.3 s, whose start is used by a finished call
    lim = Limit("api", concurrency=1, rate=1, interval_s=0.3, margin_s=0)
    assert await backend.take(lim, "", "a") is None
    await backend.release(lim, "", "a")

    # When a call is refused by the window (while the slot is free)
    refused = await backend.take(lim, "", "b")
    assert refused is not None and refused.why == "rate"

    # Then it holds no slot: once the window has room, the next call gets the slot
    async def next_call() -> bool:
        return await backend.take(lim, "", "c") is None

    await until(next_call, "the next call's start", timeout_s=2)
    assert (await backend.take(lim, "", "d")) is not None  # and now c holds the one slot


async def test_a_holder_that_stops_renewing_loses_its_slot_after_its_hold(backend: LimitBackend) -> None:
    # Given the one slot held by a caller that never renews nor gives it back (it died)
    lim = Limit("api", concurrency=1, hold_s=0.3)
    began = time.monotonic()  # before the take: its hold starts after this
    assert await backend.take(lim, "", "dead") is None

    # When another caller asks until it gets the slot
    first = await backend.take(lim, "", "next")

    async def taken() -> bool:
        return await backend.take(lim, "", "next") is None

    await until(taken, "the dead holder's slot coming back", timeout_s=3)

    # Then it was refused at first, and got the slot once the hold lapsed
    assert first is not None and first.why == "concurrency" and first.seconds <= 0.3
    assert time.monotonic() - began >= 0.3 - CLOCKS_S
    assert not await backend.renew(lim, "", "dead")


async def test_a_renewed_slot_is_kept_past_its_hold(backend: LimitBackend) -> None:
    lim = Limit("api", concurrency=1, hold_s=0.2)
    assert await backend.take(lim, "", "a") is None
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        assert await backend.renew(lim, "", "a")
        assert (await backend.take(lim, "", "b")) is not None
        await asyncio.sleep(0.05)


async def test_a_closed_limit_refuses_everyone_until_the_back_off_ends(backend: LimitBackend) -> None:
    # Given a limit closed for 0.4 s (a 429), then closed again for less
    lim = Limit("api", concurrency=5, rate=100)
    began = time.monotonic()
    assert await backend.close(lim, "", 0.4) == pytest.approx(0.4, abs=0.05)
    assert await backend.close(lim, "", 0.1) == pytest.approx(0.4, abs=0.05)  # a shorter one never shortens it

    # When a call asks
    refused = await backend.take(lim, "", "a")

    # Then it waits out the whole back-off (what is left of it since it was closed)
    assert refused is not None and refused.why == "closed"
    assert 0.4 - (time.monotonic() - began) - CLOCKS_S < refused.seconds <= 0.4

    async def taken() -> bool:
        return await backend.take(lim, "", "a") is None

    await until(taken, "the back-off ending", timeout_s=2)


async def test_each_tenant_key_has_its_own_slots(backend: LimitBackend) -> None:
    lim = Limit("api", concurrency=1, rate=1, interval_s=10)
    assert await backend.take(lim, "tenant-a", "a") is None
    assert await backend.take(lim, "tenant-b", "b") is None
    assert (await backend.take(lim, "tenant-a", "c")) is not None


async def test_limits_of_other_names_are_apart(backend: LimitBackend) -> None:
    assert await backend.take(Limit("one", concurrency=1), "", "a") is None
    assert await backend.take(Limit("two", concurrency=1), "", "b") is None


async def test_the_margin_widens_the_window(backend: LimitBackend) -> None:
    lim = Limit("api", rate=1, interval_s=0.2, margin_s=0.3)
    assert await backend.take(lim, "", "a") is None
    refused = await backend.take(lim, "", "b")
    assert refused is not None and 0.4 < refused.seconds <= 0.5


async def test_a_start_counts_from_when_the_call_says_it_starts(backend: LimitBackend) -> None:
    # Given a limit of 1 start per 0.5 s, granted to a call that starts a while later (its started record was written)
    lim = Limit("api", concurrency=2, rate=1, interval_s=0.5, margin_s=0)
    assert await backend.take(lim, "", "a") is None
    granted = time.monotonic()
    await asyncio.sleep(0.2)  # the time between the grant and the start (the stimulus, not a wait for a condition)

    # When the call says it starts now
    await backend.start(lim, "", "a")
    started = time.monotonic()

    # Then the window counts the start from now: the next call waits a whole window from it, not from the grant
    refused = await backend.take(lim, "", "b")
    assert refused is not None and refused.why == "rate"
    assert refused.seconds > 0.5 - (time.monotonic() - started) - 0.05
    assert refused.seconds > 0.5 - (started - granted) + 0.1


async def test_a_start_that_left_the_window_is_not_counted_again(backend: LimitBackend) -> None:
    # Given a call granted the one start of a 1 s window, which has passed (a window long
    # enough that a loaded machine cannot let the probe's own start leave it before "b" asks)
    lim = Limit("api", rate=1, interval_s=1.0, margin_s=0)
    assert await backend.take(lim, "", "a") is None

    async def room() -> bool:
        return await backend.take(lim, "", "probe") is None

    await until(room, "the start leaving the window", timeout_s=5)
    await backend.release(lim, "", "probe")

    # When the first call says it starts now, then another asks
    await backend.start(lim, "", "a")

    # Then the late start counts nothing: only the probe's start is in the window
    refused = await backend.take(lim, "", "b")
    assert refused is not None and refused.seconds <= 1.0
