"""Run leases: renewed while held, released at the end, never taken twice."""

from __future__ import annotations

import asyncio

import fakeredis

from agentflow.celery import Leases


def leases(lease_s: float) -> tuple[Leases, fakeredis.FakeAsyncRedis]:
    server = fakeredis.FakeServer()
    probe = fakeredis.FakeAsyncRedis(server=server)
    return Leases(lambda: fakeredis.FakeAsyncRedis(server=server), prefix="t", lease_s=lease_s), probe


async def test_a_lease_held_longer_than_its_term_is_renewed_and_then_released():
    # Given a lease term of 0.3 s
    made, probe = leases(0.3)
    async with made.hold("r1") as held:
        assert held is not None
        # When the holder works for three terms
        await asyncio.sleep(0.9)
        # Then the lease is still there (renewed), and a second holder is refused
        assert await probe.exists("t:lease:{r1}")
        async with made.hold("r1") as second:
            assert second is None
    # And it is gone once the block ends
    assert not await probe.exists("t:lease:{r1}")


async def test_releasing_with_clear_decision_forgets_the_decision_marker():
    # Given a run that waited for a decision
    made, probe = leases(5)
    await made.mark_decision("r1", [("charge", "in doubt")])
    # When a holder moves the run on and says so
    async with made.hold("r1") as held:
        assert held is not None
        held.clear_decision = True
    # Then the lease and the marker are gone together
    assert not await probe.exists("t:lease:{r1}")
    assert await made.decision("r1") is None
