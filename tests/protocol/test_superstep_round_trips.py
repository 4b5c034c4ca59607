"""What a worker's superstep asks of the Redis store, round trip by round trip (real Redis).

- A handed-over superstep makes three round trips: the lease's take with the run's head
  and its cancel marker (one script), ``started``, and ``done`` with the checkpoint, the
  lease given up and the superstep's events (one script), which are all in the stream when
  it returns. (It made six before: the cancel look, the release and the events' append
  were round trips of their own.)
- The cancel marker read with the take is the watch's first look: a request posted
  before the superstep ends the run before any call, without another read; a marker
  that does not check, read that way, is reported and removed, never obeyed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from _kit.tickets import KEY
from pydantic import BaseModel

from agentflow import Call, Flow, FlowApp, Registry, RunStatus
from agentflow._events import Events
from agentflow.exec.checkpoints.redis import RedisCheckpointStore
from agentflow.exec.run.cancel import CancelRequest, post
from agentflow.exec.run.events import read_events
from agentflow.exec.seal import Sealer

pytestmark = [pytest.mark.redis, pytest.mark.usefixtures("redis_url")]


def recording(url: str, log: list[str]) -> Callable[[], Any]:
    """A client factory whose clients note each round trip: a command's name, or ``pipeline``."""

    class Recording(aioredis.Redis):
        async def execute_command(self, *args: Any, **options: Any) -> Any:
            name = str(args[0])
            log.append(f"{name} {args[3]}" if name == "EVALSHA" else name)  # a script by its first key
            return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]

        def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
            log.append("pipeline")
            return super().pipeline(transaction, shard_hint)

    return lambda: Recording.from_url(url)


class Count(BaseModel):
    n: int = 0


def counting(ran: list[int]) -> tuple[FlowApp, str]:
    registry = Registry()

    @registry.tool(idempotent=True)
    async def bump(n: int) -> int:
        ran.append(n)
        return n + 1

    flow = Flow("count", state=Count)
    for node in "abc":
        flow = flow.node(node, Call("bump", args=lambda c: {"n": c.n}, into="n"))
    flow = flow.edge("a", "b").edge("b", "c").end("c")
    return FlowApp(registry, [flow]), "count"


async def test_a_handed_over_superstep_makes_three_round_trips(redis_url: str, unique_prefix: Any) -> None:
    log: list[str] = []
    prefix = unique_prefix()
    ran: list[int] = []
    app, name = counting(ran)
    async with RedisCheckpointStore(recording(redis_url, log), prefix=prefix) as store:
        runner = app.runner(store, KEY, events=Events(record=True))
        flows = app.flow_versions(name)
        out = await runner.start(flows, {}, run_id="r-1")
        # When a worker runs the next superstep, handed over cleanly
        log.clear()
        out = await runner.advance(flows, "r-1", expected_step=out.step, handoff=True)
        stored = await read_events(store, Sealer(KEY), "r-1")
    # Then it made three round trips, in this order
    assert out.status == RunStatus.RUNNING and ran == [0]
    lease, calls, events = (f"{prefix}:run:{{r-1}}:{part}" for part in ("lease", "cp", "events"))
    read = log.index(f"EVALSHA {events}")  # the test's own read of the stream (`read_events.lua`)
    assert log[:read] == [f"EVALSHA {lease}", f"EVALSHA {calls}", f"EVALSHA {calls}"], log
    # And the superstep's events, its checkpoint.saved last, were stored with its save, each once
    names = [e.name for e in stored]
    assert [e.problem for e in stored] == [None] * len(stored), stored
    assert names[names.index("node.started") :] == [
        "node.started",
        "tool.started",
        "tool.finished",
        "node.finished",
        "checkpoint.saved",
    ], names
    assert stored[-1].data["step"] == 1 and names.count("checkpoint.saved") == 2, stored


async def test_a_cancel_request_read_with_the_take_ends_the_run_before_any_call(
    redis_url: str, unique_prefix: Any
) -> None:
    log: list[str] = []
    ran: list[int] = []
    app, name = counting(ran)
    prefix = unique_prefix()
    async with RedisCheckpointStore(recording(redis_url, log), prefix=prefix) as store:
        runner = app.runner(store, KEY)
        flows = app.flow_versions(name)
        out = await runner.start(flows, {}, run_id="r-1")
        # Given a cancel request left between two supersteps
        await post(store, Sealer(KEY), CancelRequest("r-1", "wrong customer", "alice", time.time()))
        # When a worker takes the next superstep
        log.clear()
        out = await runner.advance(flows, "r-1", expected_step=out.step, handoff=True)
    # Then the run ended cancelled, naming the request, and no call started
    assert out.status == RunStatus.CANCELLED and out.error == "cancelled by alice: wrong customer"
    assert ran == []
    # And the request was read with the take, not by a look of its own before the cancel claim was saved
    # (the HMGET after it is the spent request's removal)
    before_claim = log[: log.index(f"EVALSHA {prefix}:run:{{r-1}}:cp")]
    assert before_claim[0] == f"EVALSHA {prefix}:run:{{r-1}}:lease" and "HMGET" not in before_claim, log


async def test_a_forged_cancel_marker_read_with_the_take_is_removed_and_not_obeyed(
    redis_url: str, unique_prefix: Any, caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[int] = []
    app, name = counting(ran)
    async with RedisCheckpointStore(lambda: aioredis.Redis.from_url(redis_url), prefix=unique_prefix()) as store:
        runner = app.runner(store, KEY)
        flows = app.flow_versions(name)
        out = await runner.start(flows, {}, run_id="r-1")
        # Given a cancel marker written by someone without the key
        forged = CancelRequest("r-1", "forged", "mallory", time.time())
        await post(store, Sealer(b"another key, not the run's " * 2), forged)
        assert await store.peek_markers(["cancel/r-1"])
        # When a worker takes the next superstep (the marker comes with the take)
        out = await runner.advance(flows, "r-1", expected_step=out.step, handoff=True)
        # Then the run went on, the marker is gone, and the refusal was reported
        assert out.status == RunStatus.RUNNING and ran == [0]
        assert await store.peek_markers(["cancel/r-1"]) == {}
    assert any(
        "cancel" in r.getMessage() and "r-1" in r.getMessage() for r in caplog.records if r.levelname == "WARNING"
    )
