"""Run leases (`agentflow.exec.run.lease`): renewed from a timer while a block holds the run,
released when it ends, never taken from a live holder, and never a reason to break the block.

Renewal and release run on every store set-up (`any_store`); the failure cases on the memory store.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

import pytest
from _kit.poll import until

from agentflow import Executor, FlowRunner, Registry
from agentflow._errors import RunHeld
from agentflow.exec.checkpoints import CheckpointStore, MemoryCheckpointStore
from agentflow.exec.run.lease import Ownership, held_by, holding, take

RUN = "lease-run-1"
ME = Ownership("me@host:1", lease_s=0.3)
RIVAL = Ownership("rival@host:2", lease_s=30.0)


async def expiry(store: CheckpointStore, run_id: str = RUN) -> float | None:
    """When the run's live lease ends, or None if nobody holds it."""
    lease = (await store.leases([run_id])).get(run_id)
    return None if lease is None else lease.expires_at


class ReleaseFails(MemoryCheckpointStore):
    """A memory store whose release cannot reach the server."""

    async def release_lease(self, run_id: str, token: str) -> bool:
        raise ConnectionError("the store went away")


class RenewalFails(MemoryCheckpointStore):
    """A memory store whose renewals cannot reach the server."""

    async def renew_lease(self, run_id: str, token: str, ttl_s: float) -> None:
        raise ConnectionError("the store went away")


async def test_a_lease_held_past_its_term_is_renewed_from_a_timer(any_store):
    # Given a run held with a lease of 0.3 s
    async with holding(any_store, RUN, ME) as tenure:
        lease = tenure.lease
        first = lease.expires_at
        assert await expiry(any_store) == pytest.approx(first)
        # When the block works on past the end of that first term
        renewed: list[float] = []

        async def outlived() -> bool:
            now_ends = await expiry(any_store)
            assert now_ends is not None, "the lease lapsed while the block still held it"
            renewed.append(now_ends)
            return time.time() > first + ME.lease_s

        await until(outlived, "the block outlives its first term by a whole term")
    # Then the lease stayed live all along, its end moving forward with each renewal
    assert renewed[-1] > first + ME.lease_s / 2, renewed
    assert renewed == sorted(renewed)


async def test_a_short_hold_starts_no_task():
    # Given a lease far longer than the work done under it
    store = MemoryCheckpointStore()
    before = asyncio.all_tasks()
    async with holding(store, RUN, Ownership("me@host:1", lease_s=30.0)):
        # Then the renewal waits on a timer: no task was started for it
        assert asyncio.all_tasks() == before


async def test_the_lease_is_released_when_the_block_ends(any_store):
    # Given a run held for a block
    async with holding(any_store, RUN, ME):
        assert RUN in await held_by(any_store, [RUN])
    # When the block returned, Then nobody holds the run, and another takes it at once
    assert await held_by(any_store, [RUN]) == {}
    assert (await take(any_store, RUN, RIVAL)).owner == RIVAL.owner


async def test_the_lease_is_released_when_the_block_raises(any_store):
    # When the block raises
    with pytest.raises(ValueError, match="the block failed"):
        async with holding(any_store, RUN, ME):
            raise ValueError("the block failed")
    # Then its error went through, and nobody holds the run
    assert await held_by(any_store, [RUN]) == {}


async def test_a_live_lease_is_refused_with_run_held_naming_the_holder_and_its_end():
    # Given a run a rival holds
    store = MemoryCheckpointStore()
    ran = False
    async with holding(store, RUN, RIVAL) as held:
        theirs = held.lease
        # When another runner tries to hold it
        with pytest.raises(RunHeld) as refused:
            async with holding(store, RUN, ME):
                ran = True
        # Then it is refused before its block runs, naming the holder and when its lease ends
        assert not ran
        assert (refused.value.owner, refused.value.expires_at) == (RIVAL.owner, theirs.expires_at)
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(theirs.expires_at))
        assert RIVAL.owner in str(refused.value) and when in str(refused.value)
        # and the holder's lease is untouched
        assert (await store.leases([RUN]))[RUN].token == theirs.token


async def test_a_renewal_that_finds_the_lease_lost_logs_a_warning_and_the_block_goes_on(caplog):
    caplog.set_level(logging.WARNING, logger="agentflow.lease")
    store = MemoryCheckpointStore()
    went_on = False
    # Given a run held with a lease of 0.3 s
    async with holding(store, RUN, ME) as held:
        mine = held.lease
        # When its lease is taken from it (it lapsed meanwhile, say, and a rival took the run)
        assert await store.release_lease(RUN, mine.token)
        rival = await take(store, RUN, RIVAL)

        async def warned() -> bool:
            return any("lost its lease" in r.getMessage() for r in caplog.records)

        # Then the next renewal says so at WARNING
        await until(warned, "a warning that the lease was lost")
        went_on = True
    # and the block went on to its end, and leaving it did not release the rival's lease
    assert went_on
    lost = [r for r in caplog.records if "lost its lease" in r.getMessage()]
    assert len(lost) == 1 and lost[0].levelno == logging.WARNING and ME.owner in lost[0].getMessage()
    assert (await store.leases([RUN]))[RUN].token == rival.token


async def test_a_renewal_that_fails_is_logged_and_the_block_goes_on(caplog):
    caplog.set_level(logging.WARNING, logger="agentflow.lease")
    store = RenewalFails()
    # Given a run held on a store that cannot renew
    async with holding(store, RUN, ME):
        # When a renewal comes due, Then its failure is logged at WARNING
        async def warned() -> bool:
            return any("could not renew" in r.getMessage() for r in caplog.records)

        await until(warned, "a warning that the renewal failed")
    # and the block ended normally (its lease lapsed unrenewed: nobody holds the run)
    assert await store.leases([RUN]) == {}


async def test_a_release_that_fails_is_logged_not_raised(caplog):
    caplog.set_level(logging.WARNING, logger="agentflow.lease")
    store = ReleaseFails()
    # When a block ends on a store that cannot release the lease
    async with holding(store, RUN, Ownership("me@host:1", lease_s=30.0)):
        pass
    # Then nothing was raised; the failure is logged at WARNING, saying when the lease lapses
    warned = [r for r in caplog.records if "could not release" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING
    assert "lapses in 30.0 s" in warned[0].getMessage() and "the store went away" in warned[0].getMessage()


async def test_a_release_failure_does_not_hide_the_blocks_own_error(caplog):
    caplog.set_level(logging.WARNING, logger="agentflow.lease")
    # When a block raises on a store that cannot release the lease
    with pytest.raises(ValueError, match="the block failed"):
        async with holding(ReleaseFails(), RUN, ME):
            raise ValueError("the block failed")
    # Then the block's error is the one raised, and the release failure is logged
    assert any("could not release" in r.getMessage() for r in caplog.records)


async def test_a_later_life_of_an_identity_takes_over_an_earlier_ones_lease_and_never_the_reverse() -> None:
    store = MemoryCheckpointStore()
    earlier = Ownership.restartable("billing-api", lease_s=60.0)
    await take(store, "r1", earlier)
    # Given a later life of the same name (a restart), a process of another name, and the earlier life itself
    later = dataclasses.replace(earlier, owner=f"billing-api#{earlier.life + 1}", life=earlier.life + 1)
    other = Ownership.restartable("billing-api-2", lease_s=60.0)
    # Then the other name is refused, the later life takes the run at once, and the earlier life is refused it back
    with pytest.raises(RunHeld):
        await take(store, "r1", other)
    assert (await take(store, "r1", later)).owner == later.owner
    with pytest.raises(RunHeld):
        await take(store, "r1", earlier)


def test_an_identity_is_a_plain_name_and_excludes_an_owner() -> None:
    with pytest.raises(ValueError, match="without '#'"):
        Ownership.restartable("api#2")
    with pytest.raises(ValueError, match="an owner or an identity, not both"):
        FlowRunner(Executor(Registry()), owner="a", identity="b")
