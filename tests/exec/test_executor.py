"""Executor: running one call (threads, timeout, retries, events), the call context, and the approval port."""

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable

import pytest
from pydantic import BaseModel

from agentflow import Call, Executor, Flow, FlowRunner, Registry, _events
from agentflow._errors import ApprovalDenied, ToolTimeout
from agentflow._events import Event, Events
from agentflow.exec import ApprovalRequest, Approver, current_call, idempotency_key
from agentflow.flow import NodeHandle

FAST = 0.001  # backoff for retry tests: small enough to keep them quick


class Note(BaseModel):
    note: str = ""


def collect(executor: Executor) -> list[Event]:
    seen: list[Event] = []
    executor.events.subscribe(seen.append)
    return seen


# --- running a call ---------------------------------------------------------------------


async def test_an_async_tool_runs_and_returns_its_result():
    registry = Registry()

    @registry.tool
    async def hold_seats(show: str, seats: int) -> str:
        await asyncio.sleep(0)
        return f"{seats} seats held for {show}"

    result = await Executor(registry).run("hold_seats", {"show": "Hamlet", "seats": "2"})

    assert result == "2 seats held for Hamlet"


async def test_a_sync_tool_runs_off_the_event_loop():
    # Given a sync tool that records the thread it runs on
    registry = Registry()
    ran_on: list[int] = []

    @registry.tool
    def blocking(x: int) -> int:
        ran_on.append(threading.get_ident())
        return x + 1

    # When the executor runs it from the event loop
    result = await Executor(registry).run("blocking", {"x": 1})

    # Then it ran in another thread than the loop's
    assert result == 2
    assert ran_on and ran_on[0] != threading.get_ident()


async def test_a_sync_tool_runs_on_the_executor_the_caller_chose():
    registry = Registry()
    names: list[str] = []

    @registry.tool
    def where() -> str:
        names.append(threading.current_thread().name)
        return "ok"

    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tools-pool") as pool:
        await Executor(registry, sync_executor=pool).run("where", {})

    assert names[0].startswith("tools-pool")


async def test_the_executor_validates_arguments_before_the_tool_runs():
    registry = Registry()
    calls: list[int] = []

    @registry.tool
    async def charge_card(amount: int) -> str:
        calls.append(amount)
        return "ok"

    with pytest.raises(ValueError, match="'charge_card'.*amount"):
        await Executor(registry).run("charge_card", {"amount": "lots"})
    assert calls == []


async def test_an_async_tool_past_its_timeout_raises_tool_timeout():
    registry = Registry()

    @registry.tool(timeout_s=0.05)
    async def stuck() -> str:
        await asyncio.sleep(5)
        return "never"

    with pytest.raises(ToolTimeout, match=r"'stuck'.*0\.05s"):
        await Executor(registry).run("stuck", {})


async def test_a_sync_tool_past_its_timeout_raises_tool_timeout():
    # Given a sync tool that blocks until released
    registry = Registry()
    release = threading.Event()

    @registry.tool(timeout_s=0.05)
    def stuck() -> str:
        release.wait(5)
        return "late"

    # When it overruns its timeout, the call raises (the thread is abandoned, not stopped)
    try:
        with pytest.raises(ToolTimeout):
            await Executor(registry).run("stuck", {})
    finally:
        release.set()


async def test_a_failing_tool_is_retried_with_backoff_until_it_succeeds():
    # Given a tool that fails twice, then succeeds, and may take two retries
    registry = Registry()
    attempts: list[int] = []

    @registry.tool(retries=2, backoff_s=FAST)
    async def flaky() -> str:
        attempts.append(len(attempts) + 1)
        if len(attempts) < 3:
            raise ConnectionError("try later")
        return "ok"

    executor = Executor(registry)
    events = collect(executor)

    # When it is run
    result = await executor.run("flaky", {})

    # Then the third attempt's result comes back, after two retries whose delay grows
    assert result == "ok"
    assert attempts == [1, 2, 3]
    delays = [e.data["delay_s"] for e in events if e.name == "tool.retrying"]
    assert delays == [pytest.approx(FAST), pytest.approx(2 * FAST)]


async def test_retries_give_up_after_the_last_attempt_with_the_tools_error():
    registry = Registry()
    attempts: list[int] = []

    @registry.tool(retries=2, backoff_s=FAST)
    def always_down() -> str:
        attempts.append(1)
        raise ConnectionError(f"down #{len(attempts)}")

    with pytest.raises(ConnectionError, match="down #3"):
        await Executor(registry).run("always_down", {})
    assert len(attempts) == 3


async def test_a_timeout_is_retried_like_any_other_failure():
    registry = Registry()
    attempts: list[int] = []

    @registry.tool(retries=1, backoff_s=FAST, timeout_s=0.05)
    async def slow_then_fast() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            await asyncio.sleep(5)
        return "ok"

    assert await Executor(registry).run("slow_then_fast", {}) == "ok"
    assert len(attempts) == 2


async def test_retry_on_limits_which_errors_are_retried():
    # Given a tool that retries only ConnectionError
    registry = Registry()
    attempts: list[str] = []

    @registry.tool(retries=3, backoff_s=FAST, retry_on=(ConnectionError,))
    def picky(kind: str) -> str:
        attempts.append(kind)
        if kind == "transient":
            raise ConnectionError("again")
        raise KeyError("no such seat")

    # When it raises something else, it fails at once
    with pytest.raises(KeyError):
        await Executor(registry).run("picky", {"kind": "permanent"})
    assert attempts == ["permanent"]

    # And a ConnectionError is retried until the attempts run out
    attempts.clear()
    with pytest.raises(ConnectionError):
        await Executor(registry).run("picky", {"kind": "transient"})
    assert attempts == ["transient"] * 4


async def test_current_call_exposes_the_attempt_number_on_retries():
    registry = Registry()
    seen: list[tuple[str, int]] = []

    @registry.tool(retries=2, backoff_s=FAST)
    def flaky() -> str:
        info = current_call()
        seen.append((info.tool, info.attempt))
        if info.attempt < 3:
            raise ConnectionError("again")
        return "ok"

    await Executor(registry).run("flaky", {})

    assert seen == [("flaky", 1), ("flaky", 2), ("flaky", 3)]


# --- events -----------------------------------------------------------------------------


async def test_a_successful_call_emits_tool_started_then_tool_finished():
    registry = Registry()

    @registry.tool
    async def ping() -> str:
        return "pong"

    executor = Executor(registry)
    events = collect(executor)

    await executor.run("ping", {})

    assert [e.name for e in events] == ["tool.started", "tool.finished"]
    assert events[0].data["tool"] == "ping" and events[0].data["attempt"] == 1
    assert events[1].data["tool"] == "ping" and events[1].data["ms"] >= 0


async def test_a_retried_then_failed_call_emits_retrying_and_failed():
    registry = Registry()

    @registry.tool(retries=1, backoff_s=FAST)
    async def broken() -> str:
        raise RuntimeError("boom")

    executor = Executor(registry)
    events = collect(executor)

    with pytest.raises(RuntimeError):
        await executor.run("broken", {})

    assert [e.name for e in events] == ["tool.started", "tool.retrying", "tool.started", "tool.failed"]
    assert [e.data.get("attempt") for e in events if e.name == "tool.started"] == [1, 2]
    assert events[1].data["attempt"] == 1
    assert "boom" in events[-1].data["error"]


async def test_unsubscribe_stops_delivery():
    registry = Registry()

    @registry.tool
    async def ping() -> str:
        return "pong"

    executor = Executor(registry)
    seen: list[str] = []
    unsubscribe = executor.events.subscribe(lambda e: seen.append(e.name))

    await executor.run("ping", {})
    delivered = len(seen)
    unsubscribe()
    await executor.run("ping", {})

    assert delivered == 2
    assert len(seen) == delivered


def test_a_subscriber_gets_only_the_events_it_names_and_the_hub_builds_no_other(monkeypatch):
    # Given a hub with a subscriber to tool.finished only, and one to everything that comes and goes
    hub = Events()
    finished: list[str] = []
    hub.subscribe(lambda e: finished.append(e.name), names={"tool.finished"})
    everything: list[str] = []
    unsubscribe = hub.subscribe(lambda e: everything.append(e.name))
    hub.emit("tool.started", "r1")
    hub.emit("tool.finished", "r1")
    unsubscribe()
    # When the subscriber to everything is gone, an event nobody names is not even built
    built: list[str] = []
    monkeypatch.setattr(_events, "Event", lambda name, run_id, data: built.append(name))
    hub.emit("tool.started", "r1")
    # Then each subscriber got what it asked for, and nothing was built for the unwanted event
    assert finished == ["tool.finished"]
    assert everything == ["tool.started", "tool.finished"]
    assert built == []


async def test_a_subscriber_that_raises_does_not_break_the_call(caplog: pytest.LogCaptureFixture) -> None:
    # Given a broken subscriber, subscribed before a working one
    registry = Registry()

    @registry.tool
    async def ping() -> str:
        return "pong"

    executor = Executor(registry)

    def broken(event: Event) -> None:
        raise RuntimeError("subscriber bug")

    executor.events.subscribe(broken)
    events = collect(executor)

    # When a call runs
    result = await executor.run("ping", {})

    # Then the call succeeds, later subscribers still get every event, and the failure is logged
    assert result == "pong"
    assert [e.name for e in events] == ["tool.started", "tool.finished"]
    assert "subscriber bug" in caplog.text


# --- idempotency_key() ------------------------------------------------------------------


def test_idempotency_key_outside_a_tool_raises_runtime_error():
    with pytest.raises(RuntimeError, match="inside a tool"):
        idempotency_key()


def test_current_call_outside_a_tool_raises_runtime_error():
    with pytest.raises(RuntimeError):
        current_call()


def key_flow(registry: Registry, keys: list[str], *, sync: bool) -> Flow[Note]:

    def charge_sync(amount: int) -> str:
        keys.append(idempotency_key())
        return "charged"

    async def charge_async(amount: int) -> str:
        keys.append(idempotency_key())
        return "charged"

    registry.add(charge_sync if sync else charge_async, name="charge_card")

    return (
        Flow("pay", state=Note)
        .node("first", Call("charge_card", args={"amount": 5}, into="note"))
        .node("second", Call("charge_card", args={"amount": 5}, into="note"))
        .edge("first", "second")
        .end("second")
    )


@pytest.mark.parametrize("sync", [False, True], ids=["async-tool", "sync-tool"])
async def test_idempotency_key_is_stable_per_run_and_call(sync: bool) -> None:
    # Given a flow that makes the same call (same tool, same arguments) from two nodes
    registry = Registry()
    keys: list[str] = []
    flow = key_flow(registry, keys, sync=sync)
    runner = FlowRunner(Executor(registry))

    # When it runs twice as run "order-7", then once as run "order-8"
    await runner.run(flow, Note(), run_id="order-7")
    await runner.run(flow, Note(), run_id="order-7")
    await runner.run(flow, Note(), run_id="order-8")

    # Then the same run and call get the same key; another call or another run gets another
    first_7, second_7, again_first_7, again_second_7, first_8, second_8 = keys
    assert first_7 == again_first_7 and second_7 == again_second_7
    assert first_7 != second_7
    assert {first_8, second_8}.isdisjoint({first_7, second_7})
    assert all(len(k) >= 20 for k in keys)


async def test_idempotency_key_is_the_same_on_every_attempt_of_a_call():
    registry = Registry()
    keys: list[str] = []

    @registry.tool(retries=2, backoff_s=FAST)
    async def charge_card(amount: int) -> str:
        keys.append(idempotency_key())
        if len(keys) < 3:
            raise ConnectionError("gateway busy")
        return "charged"

    flow = Flow("pay", state=Note).node("pay", Call("charge_card", args={"amount": 5}, into="note")).end("pay")

    result = await FlowRunner(Executor(registry)).run(flow, Note(), run_id="order-9")

    assert result.status == "done"
    assert len(keys) == 3 and len(set(keys)) == 1


# --- approval port ----------------------------------------------------------------------


def refund_flow(registry: Registry, refunded: list[int]) -> Flow[Note]:
    @registry.tool(approval=True)
    async def refund(amount: int) -> str:
        refunded.append(amount)
        return f"refunded {amount}"

    return Flow("refunds", state=Note).node("refund", Call("refund", args={"amount": 30}, into="note")).end("refund")


def sync_port(answer: bool, asked: list[ApprovalRequest]) -> Approver:
    def port(request: ApprovalRequest) -> bool:
        asked.append(request)
        return answer

    return port


def async_port(answer: bool, asked: list[ApprovalRequest]) -> Approver:
    async def port(request: ApprovalRequest) -> bool:
        await asyncio.sleep(0)
        asked.append(request)
        return answer

    return port


PORTS = pytest.mark.parametrize("make_port", [sync_port, async_port], ids=["sync-approver", "async-approver"])


@PORTS
async def test_an_approval_port_that_approves_lets_the_call_run(make_port: Callable[..., Approver]) -> None:
    # Given a tool that needs approval, and a port that approves
    registry = Registry()
    refunded: list[int] = []
    flow = refund_flow(registry, refunded)
    asked: list[ApprovalRequest] = []
    runner = FlowRunner(Executor(registry, approver=make_port(True, asked)))

    # When a run calls it
    result = await runner.run(flow, Note(), run_id="refund-1")

    # Then the port was asked about exactly that call, and the tool ran
    assert result.status == "done"
    assert result.state.note == "refunded 30"
    assert refunded == [30]
    assert [(r.tool, r.args, r.node) for r in asked] == [("refund", {"amount": 30}, "refund")]


@PORTS
async def test_an_approval_port_that_denies_fails_the_run_without_running_the_tool(
    make_port: Callable[..., Approver],
) -> None:
    # Given a tool that needs approval, and a port that denies
    registry = Registry()
    refunded: list[int] = []
    flow = refund_flow(registry, refunded)
    asked: list[ApprovalRequest] = []
    runner = FlowRunner(Executor(registry, approver=make_port(False, asked)))

    # When a run calls it
    result = await runner.run(flow, Note(), run_id="refund-2")

    # Then the node got ApprovalDenied, the run failed saying so, and the tool never ran
    assert result.status == "failed"
    assert result.error is not None
    assert "ApprovalDenied" in result.error and "denied" in result.error
    assert refunded == []
    assert len(asked) == 1


async def test_a_denied_call_raises_approval_denied_inside_the_node():
    # Given a node function that calls a tool needing approval, with a port that denies
    registry = Registry()
    refunded: list[int] = []
    refund_flow(registry, refunded)
    caught: list[BaseException] = []

    async def try_refund(state: Note, handle: NodeHandle) -> dict[str, str]:
        try:
            await handle.call("refund", amount=10)
        except ApprovalDenied as exc:
            caught.append(exc)
            return {"note": "refund refused"}
        return {"note": "refunded"}

    flow = Flow("refunds", state=Note).node("try", try_refund).end("try")
    runner = FlowRunner(Executor(registry, approver=lambda request: False))

    # When the run makes the call
    result = await runner.run(flow, Note())

    # Then the node sees ApprovalDenied and may handle it
    assert result.status == "done"
    assert result.state.note == "refund refused"
    assert len(caught) == 1 and "'refund'" in str(caught[0])
    assert refunded == []


async def test_a_tool_without_approval_never_asks_the_port():
    registry = Registry()

    @registry.tool
    async def lookup(show: str) -> str:
        return show.upper()

    asked: list[ApprovalRequest] = []
    flow = Flow("look", state=Note).node("look", Call("lookup", args={"show": "hamlet"}, into="note")).end("look")
    runner = FlowRunner(Executor(registry, approver=sync_port(False, asked)))

    result = await runner.run(flow, Note())

    assert result.status == "done" and result.state.note == "HAMLET"
    assert asked == []


async def test_executor_run_asks_the_approval_port_for_a_tool_that_needs_approval():
    # Given an executor whose approval port denies, and a tool that needs approval
    registry = Registry()
    refunded: list[int] = []
    refund_flow(registry, refunded)
    asked: list[ApprovalRequest] = []
    executor = Executor(registry, approver=sync_port(False, asked))

    # When the tool is run through the executor directly
    # Then the port is asked, the call is denied, and the tool does not run
    with pytest.raises(ApprovalDenied):
        await executor.run("refund", {"amount": 30})
    assert len(asked) == 1
    assert refunded == []
