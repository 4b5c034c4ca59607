"""A distributed superstep reads only what it uses: after a clean handoff, the run's head.

`FlowRunner.advance` on a store that counts records per segment (Redis) reads the latest
checkpoint and those counts in one round trip. When they show that nothing was logged
since the checkpoint, the call log is not read at all; otherwise it is read and checked
in full, as in any recovery.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio
from pydantic import BaseModel

from agentflow import Call, Executor, Flow, FlowRunner, Registry
from agentflow.exec._durable import Journal
from agentflow.exec._durable_seal import Sealer
from agentflow.exec.checkpoints import RedisCheckpointStore

KEY = b"advance-head-test-key-0123456789ab"


class Count(BaseModel):
    n: int = 0


registry = Registry()


@registry.tool(idempotent=True)
async def bump(n: int) -> int:
    return n + 1


FLOW = (
    Flow("bumps", state=Count)
    .node("one", Call("bump", args=lambda c: {"n": c.n}, into="n"))
    .node("two", Call("bump", args=lambda c: {"n": c.n}, into="n"))
    .edge("one", "two")
    .end("two")
)


class LogReads(RedisCheckpointStore):
    """The Redis store, counting how often the whole call log is read."""

    log_reads = 0

    async def calls(self, run_id: str):  # type: ignore[no-untyped-def]
        self.log_reads += 1
        return await super().calls(run_id)


@pytest.fixture
async def store(redis_url: str) -> AsyncIterator[LogReads]:
    prefix = f"test-head-{uuid.uuid4().hex[:8]}"
    made = LogReads(lambda: redis.asyncio.Redis.from_url(redis_url), prefix=prefix)
    yield made
    client = redis.asyncio.Redis.from_url(redis_url)
    keys = [k async for k in client.scan_iter(match=f"{prefix}*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()
    await made.aclose()


def runner(store: RedisCheckpointStore) -> FlowRunner:
    return FlowRunner(Executor(registry), checkpoints=store, checkpoint_key=KEY)


async def test_a_clean_handoff_continues_without_reading_the_call_log(store):
    # Given a run whose step 0 is saved, advanced one superstep at a time
    await runner(store).run(FLOW, {}, run_id="r1", max_supersteps=0)

    # When two workers in turn take clean handoffs
    await runner(store).advance(FLOW, "r1", expected_step=0, handoff=True)
    result = await runner(store).advance(FLOW, "r1", expected_step=1, handoff=True)

    # Then the run is done in one segment, and no worker read the call log
    assert (result.status, result.state.n) == ("done", 2)
    assert [(c.step, c.segment) for c in await store.history("r1")] == [(0, 0), (1, 0), (2, 0)]
    assert store.log_reads == 0


async def test_a_handoff_after_a_record_was_logged_reads_the_log_and_claims(store):
    # Given a run after superstep 0, whose next worker logged `started` for bump and died
    await runner(store).run(FLOW, {}, run_id="r1", max_supersteps=1)
    cut_off = Journal(store, Sealer(KEY), "r1", segment=0, next_seq=2)
    await cut_off.write("started", {"call_id": "1/two/0/x", "superstep": 1, "tool": "bump", "node": "two", "args": {}})

    # When a worker takes the handoff message for step 1
    result = await runner(store).advance(FLOW, "r1", expected_step=1, handoff=True)

    # Then the counts gave it away: the log was read and checked, and the run claimed anew
    assert store.log_reads == 1
    history = await store.history("r1")
    assert [(c.step, c.segment) for c in history] == [(0, 0), (1, 0), (2, 2), (3, 2)]
    assert result.status == "done"
