"""On Redis Cluster too, a cut tail before a recovery claim is corrupt and nothing charges twice."""

from __future__ import annotations

import pytest
import redis.asyncio
from _kit.faults import FaultyStore, body
from _kit.stores import RedisRows
from _kit.tickets import KEY, ORDER, Crash, make_tickets
from test_claim_pins import BUY

from agentflow import Executor, FlowRunner
from agentflow.exec.checkpoints import CheckpointStoreCorrupt, RedisCheckpointStore


@pytest.mark.redis
@pytest.mark.slow
async def test_a_cut_tail_before_a_recovery_claim_is_corrupt_on_redis_cluster(redis_cluster):
    def connect() -> redis.asyncio.RedisCluster:
        return redis.asyncio.RedisCluster(host="127.0.0.1", port=redis_cluster[0])

    tickets = make_tickets()

    def worker() -> tuple[FlowRunner, FaultyStore]:
        store = FaultyStore(RedisCheckpointStore(connect, prefix="pins"))
        return FlowRunner(Executor(tickets.registry), checkpoints=store, checkpoint_key=KEY), store

    # Given a run cut inside `buy` (charge_card finished, email_tickets in doubt)
    first, store = worker()
    store.crash("started", when="after", tool="email_tickets")
    with pytest.raises(Crash):
        await first.run(BUY, ORDER, run_id="order-c")
    last = (await store.history("order-c"))[-1]
    kept = body(last)["log"][1]
    # and a recovery that claimed it and died right after its claim
    second, store2 = worker()
    store2.crash("save", when="after", step=last.step + 1)
    with pytest.raises(Crash):
        await second.recover(BUY, "order-c", rerun_in_doubt=True)
    # When segment 0's records after the last checkpoint are deleted
    rows = RedisRows(connect, "pins")
    for rec in reversed([r for r in await store.calls("order-c") if r.segment == 0 and r.seq >= kept]):
        await rows.drop_call(rec)
    # Then recovery refuses, and the card was charged once
    third, _ = worker()
    with pytest.raises(CheckpointStoreCorrupt, match="segment 0 has .* records"):
        await third.recover(BUY, "order-c", rerun_in_doubt=True)
    assert tickets.counts()["charge_card"] == 1
    for each in (store, store2):
        await each.aclose()
