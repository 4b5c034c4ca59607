"""Taking a run's lease and reading its head together (`run.lease.take_reading_head`).

On a store with a lease take that reads the head (Redis) they are one round trip; on the
others the head is read beside the take. Either way the head that comes back is the store's,
and a take refused by a live holder leaves no read behind.
"""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

import pytest
from _kit.tickets import KEY

from agentflow._errors import CheckpointNotFound, RunHeld
from agentflow.exec.checkpoints import MemoryCheckpointStore, SealedCheckpoint
from agentflow.exec.run.lease import Ownership, holding_reading_head, take
from agentflow.exec.seal import Sealer


def row(run_id: str) -> SealedCheckpoint:
    return Sealer(KEY).seal_checkpoint(run_id, 0, "orders", "running", 0, time.time(), {"state": {}})


async def test_a_store_without_the_fused_take_reads_the_head_beside_it() -> None:
    store = MemoryCheckpointStore()
    assert not hasattr(store, "take_lease_reading_head")
    await store.save("r-1", 0, row("r-1"))
    # When a holder takes the run with its head
    async with holding_reading_head(store, "r-1", Ownership("w1")) as (tenure, head, _):
        # Then it holds the lease, and the head is the store's
        assert (await store.leases(["r-1"]))["r-1"].token == tenure.lease.token
        assert await head == await store.head("r-1")
    # and the lease is given back afterwards
    assert await store.leases(["r-1"]) == {}


async def test_a_run_with_nothing_stored_is_not_found_when_its_head_is_awaited() -> None:
    store = MemoryCheckpointStore()
    async with holding_reading_head(store, "r-9", Ownership("w1")) as (_, head, _):
        with pytest.raises(CheckpointNotFound):
            await head


async def test_a_take_refused_by_a_live_holder_leaves_no_read_behind() -> None:
    store = MemoryCheckpointStore()
    await store.save("r-1", 0, row("r-1"))
    lost: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: lost.append(context))

    reads: list[str] = []

    async def broken_head(run_id: str) -> Any:
        reads.append(run_id)
        raise CheckpointNotFound(f"no checkpoint is stored for run {run_id!r}")

    store.head = broken_head  # type: ignore[method-assign]  # a read that fails, which nobody awaits
    # Given another holder's live lease
    await take(store, "r-1", Ownership("other"))
    # When a second holder tries to take the run with its head
    with pytest.raises(RunHeld):
        async with holding_reading_head(store, "r-1", Ownership("w2")):
            pytest.fail("the block ran without the lease")
    # Then the head read it started ran to its end before the refusal came back (not cut
    # off half-way), and its failure is not reported as never retrieved
    assert reads == ["r-1"]
    gc.collect()
    assert lost == []
