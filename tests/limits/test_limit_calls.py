"""Limits as calls see them: tool calls through the executor, flows (Call nodes and handles), tool loops."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import pytest
from _kit.poll import until
from pydantic import BaseModel

from agentflow import Call, Event, Events, Executor, Flow, FlowRunner, RunContext
from agentflow.errors import RateLimited, RunHeld
from agentflow.exec import Registry, run_tool_loop
from agentflow.exec.checkpoints import SQLiteCheckpointStore
from agentflow.exec.limits import Limit, LocalLimits
from agentflow.exec.run.events import read_events
from agentflow.models import Message, ScriptedModel, ToolCall

KEY = b"k" * 32


class Meter:
    """Counts calls in flight and keeps each call's start time."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0
        self.starts: list[float] = []

    async def run(self, seconds: float) -> None:
        self.now += 1
        self.most = max(self.most, self.now)
        self.starts.append(time.monotonic())
        try:
            await asyncio.sleep(seconds)
        finally:
            self.now -= 1


def hub(names: list[str]) -> tuple[Events, list[Event]]:
    events: list[Event] = []
    made = Events()
    made.subscribe(events.append, names)
    return made, events


async def test_no_more_calls_than_the_concurrency_run_at_once():
    # Given a tool limited to 3 calls in flight
    registry = Registry()
    meter = Meter()

    @registry.tool(limits=[Limit(concurrency=3)])
    async def fetch(n: int) -> int:
        await meter.run(0.05)
        return n

    # When 10 calls are made at once
    results = await asyncio.gather(*(Executor(registry).run("fetch", {"n": n}) for n in range(10)))

    # Then all ran, never more than 3 at a time
    assert results == list(range(10))
    assert meter.most == 3


async def test_no_window_holds_more_starts_than_the_rate():
    # Given a tool limited to 5 starts per 0.4 s
    registry = Registry()
    registry.limit(Limit("api", rate=5, interval_s=0.4))
    meter = Meter()

    @registry.tool(limits=["api"])
    async def fetch(n: int) -> int:
        await meter.run(0)
        return n

    # When 12 calls are made at once
    await asyncio.gather(*(Executor(registry).run("fetch", {"n": n}) for n in range(12)))

    # Then no 0.4 s window saw more than 5 starts, and the last started in the third window
    starts = sorted(meter.starts)
    assert all(later - starts[i] >= 0.4 - 0.01 for i, later in enumerate(starts[5:])), starts
    assert starts[-1] - starts[0] >= 0.8 - 0.01


async def test_a_waiting_call_says_so_and_says_when_it_starts():
    # Given a limit of one call in flight, held by a slow call
    events_hub, events = hub(["call.waiting", "call.admitted", "tool.started"])
    registry = Registry()
    registry.limit("api", concurrency=1)

    @registry.tool(limits=["api"])
    async def fetch(seconds: float) -> None:
        await asyncio.sleep(seconds)

    executor = Executor(registry, events=events_hub)
    slow = asyncio.create_task(executor.run("fetch", {"seconds": 0.2}))
    await until(lambda: any(e.name == "tool.started" for e in events), "the slow call starting")

    # When a second call is made
    await executor.run("fetch", {"seconds": 0})
    await slow

    # Then it was reported waiting for a slot, then admitted, then started
    names = [(e.name, e.data.get("why")) for e in events]
    assert names == [("tool.started", None), ("call.waiting", "concurrency"), ("call.admitted", None)] + [
        ("tool.started", None)
    ]
    assert events[1].data["limit"] == "api" and events[1].data["tool"] == "fetch"
    assert events[2].data["waited_s"] >= 0.1


async def test_a_429_closes_the_limit_then_the_call_is_tried_again_after_the_back_off():
    # Given a tool whose provider answers 429 (retry after 0.3 s) to the first call
    events_hub, events = hub(["limit.closed", "call.waiting", "tool.started"])
    registry = Registry()
    registry.limit("api", concurrency=2)
    tries: list[float] = []

    @registry.tool(limits=["api"])
    async def search(q: str) -> str:
        tries.append(time.monotonic())
        if len(tries) == 1:
            raise RateLimited("429 Too Many Requests", 0.3)
        return f"found {q}"

    # When it is called
    result = await Executor(registry, events=events_hub).run("search", {"q": "x"})

    # Then the limit was closed for 0.3 s, and the second try came after it
    assert result == "found x"
    assert tries[1] - tries[0] >= 0.3
    assert [e.name for e in events] == ["tool.started", "limit.closed", "call.waiting", "tool.started"]
    assert events[1].data["retry_after_s"] == 0.3 and events[2].data["why"] == "closed"


async def test_a_call_that_keeps_getting_429_fails_after_its_retries():
    registry = Registry()
    registry.limit(Limit("api", concurrency=1, retries_429=2, jitter=0))
    tries: list[float] = []

    @registry.tool(limits=["api"])
    async def search(q: str) -> str:
        tries.append(time.monotonic())
        raise RateLimited("429", 0.05)

    with pytest.raises(RateLimited) as caught:
        await Executor(registry).run("search", {"q": "x"})
    assert len(tries) == 3 and caught.value.retry_after_s == 0.05
    assert type(caught.value)(*caught.value.args).retry_after_s == 0.05  # rebuilt from its args (Celery)


async def test_a_429_without_a_limit_is_retried_as_the_tool_says_waiting_as_asked():
    registry = Registry()
    tries: list[float] = []

    @registry.tool(retries=1, backoff_s=0)
    async def search(q: str) -> str:
        tries.append(time.monotonic())
        if len(tries) == 1:
            raise RateLimited("429", 0.2)
        return q

    assert await Executor(registry).run("search", {"q": "x"}) == "x"
    assert tries[1] - tries[0] >= 0.2


async def test_each_tenant_gets_its_own_slots_by_argument_or_by_the_runs_identity():
    # Given one call in flight per tenant: the tenant named in the arguments, else the run's user
    registry = Registry()
    registry.limit("api", concurrency=1, key=lambda args, ctx: str(args.get("tenant") or (ctx.user if ctx else "")))
    meter = Meter()

    @registry.tool(limits=["api"])
    async def fetch(tenant: str | None = None) -> None:
        await meter.run(0.1)

    executor = Executor(registry)

    # When two tenants call at once, twice each
    calls = [executor.run("fetch", {"tenant": t}) for t in ("a", "b", "a", "b")]
    calls += [executor.run("fetch", {}, ctx=RunContext(user=u)) for u in ("c", "d")]
    await asyncio.gather(*calls)

    # Then tenants ran side by side, each tenant's calls one at a time
    assert meter.most == 4
    by_a = sorted(meter.starts)
    assert by_a[-1] - by_a[0] >= 0.1


class Pages(BaseModel):
    urls: list[str] = ["a", "b", "c", "d", "e", "f"]
    pages: list[str] = []
    first: str = ""


async def test_a_flows_call_nodes_and_handle_calls_take_the_limit():
    # Given a flow whose Call node and whose function node (six calls at once) use a tool limited to 2
    registry = Registry(limit_backend=LocalLimits())
    meter = Meter()

    @registry.tool(limits=[Limit(concurrency=2)])
    async def fetch(url: str) -> str:
        await meter.run(0.02)
        return url.upper()

    async def fetch_all(state: Pages, handle: Any) -> dict[str, Any]:
        return {"pages": list(await asyncio.gather(*(handle.call("fetch", url=u) for u in state.urls)))}

    flow = (
        Flow("pages", state=Pages)
        .node("first", Call("fetch", args=lambda s: {"url": s.urls[0]}, into="first"))
        .node("all", fetch_all)
        .edge("first", "all")
        .end("all")
    )

    # When it runs
    result = await FlowRunner(Executor(registry)).run(flow, {})

    # Then every call went through the limit
    assert result.status == "done" and result.state.pages == ["A", "B", "C", "D", "E", "F"]
    assert meter.most == 2 and len(meter.starts) == 7


async def test_a_run_waiting_for_a_slot_keeps_its_lease(tmp_path):
    # Given a limit closed for 1.5 s (a 429 elsewhere), and runners whose leases last 0.3 s
    backend = LocalLimits()
    registry = Registry(limit_backend=backend)
    lim = registry.limit("api", concurrency=1)

    @registry.tool(limits=["api"])
    async def fetch(url: str) -> str:
        return url

    flow = Flow("one", state=Pages).node("get", Call("fetch", args=lambda s: {"url": "u"}, into="first")).end("get")
    events_hub, events = hub(["call.waiting", "lease.lost"])
    events_hub.record = True  # as the Celery workers' hub: the run's events go to its stream in the store
    store = SQLiteCheckpointStore(tmp_path / "runs.db")
    runner = FlowRunner(Executor(registry, events=events_hub), checkpoints=store, checkpoint_key=KEY, lease_s=0.3)
    other = FlowRunner(Executor(registry), checkpoints=store, checkpoint_key=KEY, lease_s=0.3)
    await backend.close(lim, "", 1.5)

    # When a run's call waits for the limit, and another worker tries to recover the run meanwhile
    run = asyncio.create_task(runner.run(flow, {}, run_id="waits"))
    await until(lambda: events, "the call waiting")
    refusals = 0

    async def finished_while_held() -> bool:
        nonlocal refusals
        if run.done():
            return True
        with pytest.raises(RunHeld):
            await other.recover(flow, "waits")
        refusals += 1
        return False

    await until(finished_while_held, "the waiting run finishing", timeout_s=30, every=0.1)
    result = await run

    # Then the lease was renewed all along: the run was never taken from it, and it finished
    assert result.status == "done" and result.state.first == "u"
    assert refusals >= 8
    assert [e.name for e in events] == ["call.waiting"]
    # and the wait is in the run's event stream, for any process to show
    assert runner.sealer is not None
    stream = [e for e in await read_events(store, runner.sealer, "waits") if e.name.startswith("call.")]
    assert [(e.name, e.data.get("why")) for e in stream] == [("call.waiting", "closed"), ("call.admitted", None)]


async def test_a_tool_loops_model_calls_take_the_limit_named_after_the_provider():
    # Given a loop whose model (provider "acme") answers 429 once, under a limit "acme"
    events_hub, events = hub(["limit.closed", "call.waiting", "call.admitted"])
    registry = Registry()
    registry.limit("acme", concurrency=1)

    @registry.tool(limits=["acme"])
    async def lookup(city: str) -> str:
        return f"sunny in {city}"

    replies = [
        Message.assistant(tool_calls=[ToolCall(id="c1", name="lookup", arguments={"city": "Oslo"})]),
        Message.assistant("it is sunny"),
    ]
    model = ScriptedModel(replies)
    model.provider = "acme"  # type: ignore[attr-defined]
    asked = 0
    complete = model.complete

    async def complete_after_a_429(messages: Any, tools: Any) -> Message:
        nonlocal asked
        asked += 1
        if asked == 1:
            raise RateLimited("429", 0.2)
        return await complete(messages, tools)

    model.complete = complete_after_a_429  # type: ignore[method-assign]

    # When the loop runs
    result = await run_tool_loop(model, registry, [Message.user("weather?")], events=events_hub)

    # Then the model call backed off under the provider's limit, and the loop finished
    assert result.status == "done" and result.text == "it is sunny"
    assert [(e.name, e.data.get("model")) for e in events][:3] == [
        ("limit.closed", "acme"),
        ("call.waiting", "acme"),
        ("call.admitted", "acme"),
    ]


async def test_a_flows_calls_are_keyed_by_the_runs_identity():
    # Given a limit keyed by the run's user, and a flow calling a tool under it
    seen: list[tuple[str, str | None]] = []

    def by_user(args: Mapping[str, Any], ctx: RunContext | None) -> str:
        seen.append((str(args["url"]), ctx.user if ctx else None))
        return ctx.user if ctx and ctx.user else ""

    registry = Registry()
    registry.limit("api", concurrency=1, key=by_user)

    @registry.tool(limits=["api"])
    async def fetch(url: str) -> str:
        return url

    flow = Flow("one", state=Pages).node("get", Call("fetch", args=lambda s: {"url": "u"}, into="first")).end("get")

    # When runs for two users go through it
    for user in ("ann", "bob"):
        await FlowRunner(Executor(registry)).run(flow, {}, ctx=RunContext(user=user, thread="t"))

    # Then each call's key came from its own run's identity
    assert seen == [("u", "ann"), ("u", "bob")]
