"""`Map`: one logged call per element, bounded concurrency, results in input order, replayed after a crash.

Every rule that touches storage runs on every store set-up (the ``workers`` fixture).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from _kit.tickets import Crash
from _kit.workers import faulty
from pydantic import BaseModel

from agentflow import Map, Registry, RunStatus
from agentflow.errors import FlowError, RecoveryNeedsDecision
from agentflow.flow import Flow


class Pages(BaseModel):
    urls: list[str]
    pages: list[Any] = []
    failed: dict[str, str] = {}


def pages_flow(tool: str, **options: Any) -> Flow[Pages]:
    return (
        Flow(f"map_{tool}", state=Pages)
        .node("fetch", Map(tool, over=lambda s: s.urls, args=lambda url: {"url": url}, into="pages", **options))
        .end("fetch")
    )


def urls(n: int) -> list[str]:
    return [f"https://example.org/{i}" for i in range(n)]


def add_tools(workers: Any, together: int = 1) -> dict[str, Any]:
    """fetch (idempotent, tracks how many run at once), post (not idempotent), flaky (fails on odd pages).

    fetch waits for `together` calls of it to be in flight before any goes on (a barrier): a
    bound below that would never let them all in.
    """
    registry: Registry = workers.tickets.registry
    seen = {"now": 0, "most": 0}
    barrier = asyncio.Barrier(together)

    @registry.tool(idempotent=True)
    async def fetch(url: str) -> str:
        seen["now"] += 1
        seen["most"] = max(seen["most"], seen["now"])
        await barrier.wait()
        workers.tickets.effect("fetch")
        seen["now"] -= 1
        return f"page of {url}"

    @registry.tool
    async def post(url: str) -> str:
        workers.tickets.effect("post")
        return f"posted {url}"

    @registry.tool
    async def flaky(url: str) -> str:
        if int(url.rsplit("/", 1)[1]) % 2:
            raise ConnectionError(f"{url} did not answer")
        return f"page of {url}"

    return seen


async def test_a_map_calls_once_per_element_in_order_with_at_most_max_concurrency_at_once(workers):
    seen = add_tools(workers, together=3)  # 12 elements: four rounds of three
    flow = pages_flow("fetch", max_concurrency=3)
    result = await workers.runner().run(flow, Pages(urls=urls(12)), run_id="map-1")
    assert result.status == RunStatus.DONE
    assert result.state.pages == [f"page of https://example.org/{i}" for i in range(12)]
    assert seen["most"] == 3
    started = [c for c in await workers.calls("map-1") if c.kind == "started"]
    assert len(started) == 12 and workers.ran("map-1") == {"fetch": 12}


async def test_a_crash_in_the_middle_replays_the_finished_elements_and_reruns_only_the_rest(workers):
    add_tools(workers)
    flow = pages_flow("fetch", max_concurrency=4)
    # Given a worker that dies before logging the 7th element's result (nothing starts after that)
    runner = workers.runner()
    faulty(runner).crash("done", tool="fetch", nth=7)
    with pytest.raises(Crash):
        await runner.run(flow, Pages(urls=urls(20)), run_id="map-1")
    finished = sum(1 for c in await workers.calls("map-1") if c.kind == "done")
    ran_before = workers.ran("map-1")["fetch"]
    # When another worker recovers it
    result = await workers.runner().recover(flow, "map-1")
    # Then every finished element replayed, and the rest ran: 20 results in order
    assert result.status == RunStatus.DONE and len(result.state.pages) == 20
    assert len(result.replayed) == finished and 6 <= finished < 20  # 6, and any in flight when it died
    assert workers.ran("map-1")["fetch"] == ran_before + (20 - finished)


async def test_elements_in_doubt_of_a_tool_that_is_not_idempotent_are_surfaced_not_rerun(workers):
    add_tools(workers)
    flow = pages_flow("post", max_concurrency=1)
    runner = workers.runner()
    faulty(runner).crash("done", tool="post", nth=3)
    with pytest.raises(Crash):
        await runner.run(flow, Pages(urls=urls(5)), run_id="map-1")
    with pytest.raises(RecoveryNeedsDecision) as doubt:
        await workers.runner().recover(flow, "map-1")
    assert len(doubt.value.call_ids) == 1 and doubt.value.call_ids[0].startswith("0/fetch/2/")
    assert workers.ran("map-1") == {"post": 3}


async def test_one_failing_element_fails_the_node_unless_it_collects_errors(workers):
    add_tools(workers)
    failing = await workers.runner().run(pages_flow("flaky"), Pages(urls=urls(4)), run_id="map-1")
    assert failing.status == RunStatus.FAILED and "https://example.org/1 did not answer" in (failing.error or "")
    collecting = pages_flow("flaky", collect_errors=True, errors_into="failed")
    result = await workers.runner().run(collecting, Pages(urls=urls(4)), run_id="map-2")
    assert result.status == RunStatus.DONE
    assert result.state.pages == ["page of https://example.org/0", None, "page of https://example.org/2", None]
    assert set(result.state.failed) == {"1", "3"} and "ConnectionError" in result.state.failed["1"]


@pytest.mark.slow  # long maps
@pytest.mark.parametrize(
    "store_setup", ["memory", "sqlite", pytest.param("redis", marks=pytest.mark.redis)], indirect=True
)
async def test_what_a_map_stores_per_element_does_not_grow_with_the_list(workers):
    add_tools(workers)
    flow = pages_flow("fetch", max_concurrency=10)
    sizes = {}
    for n in (50, 500):
        await workers.runner().run(flow, Pages(urls=urls(n)), run_id=f"map-{n}")
        calls = sum(len(c.payload) for c in await workers.calls(f"map-{n}"))
        checkpoints = sum(len(c.payload) for c in await workers.history(f"map-{n}"))
        sizes[n] = (calls + checkpoints) / n
    assert sizes[500] < sizes[50] * 1.15, sizes


def test_a_map_names_fields_the_state_has_and_a_bound_of_one_or_more():
    with pytest.raises(FlowError, match="does not have"):
        Flow("m", state=Pages).node("f", Map("fetch", over=lambda s: s.urls, into="nope"))
    with pytest.raises(FlowError, match="max_concurrency"):
        Map("fetch", over=lambda s: s.urls, max_concurrency=0)
    with pytest.raises(FlowError, match="collect_errors"):
        Map("fetch", over=lambda s: s.urls, errors_into="failed")
