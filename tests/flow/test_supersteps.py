"""Supersteps without a store: frontiers, joins, conditions, merges, visit limits and node kinds."""

import asyncio
import operator
import threading
from collections.abc import Callable
from typing import Annotated, Any

import pytest
from _kit import tickets as kit
from _kit.tickets import TICKETS, make_tickets
from pydantic import BaseModel

from agentflow import Call, Executor, Flow, FlowRunner, Registry, RunContext
from agentflow._events import Event
from agentflow.exec import ApprovalRequest
from agentflow.flow import FlowError, NodeHandle

WAIT = 2.0  # seconds a node waits for its sibling before the test calls it sequential


class Order(BaseModel):
    show: str
    seats: int
    note: str = ""


class Trail(BaseModel):
    """A state whose `log` combines the writes of one superstep; `value` does not."""

    log: Annotated[list[str], operator.add] = []
    value: int = 0
    items: list[str] = []


def runner_for(registry: Registry | None = None) -> FlowRunner:
    return FlowRunner(Executor(registry or Registry()))


def append(name: str) -> Callable[[Trail], dict[str, Any]]:
    """A node function that appends its name to `Trail.log`."""

    def node(state: Trail) -> dict[str, Any]:
        return {"log": [name]}

    node.__name__ = node.__qualname__ = f"append_{name}"
    return node


def args(order: Order) -> dict[str, object]:
    return {"show": order.show, "seats": order.seats}


# --- the seed's ticket flow (tests/_kit/tickets.py) ----------------------------------------


async def test_the_ticket_flow_runs_to_done_with_the_expected_state():
    # Given the seed's ticket flow and its three tools
    tickets = make_tickets()
    runner = runner_for(tickets.registry)
    order = kit.Order(show="Hamlet", seats=2)

    # When it runs
    result = await runner.run(TICKETS, order, run_id="order-7")

    # Then each tool ran once, in order, and the last result is in the state
    assert result.status == "done"
    assert result.run_id == "order-7"
    assert [e.tool for e in tickets.ledger.entries()] == ["hold_seats", "charge_card", "email_tickets"]
    assert result.state == kit.Order(
        show="Hamlet", seats=2, held="held 2 for Hamlet", paid="charged 80 for Hamlet", sent="mailed Hamlet"
    )
    assert result.error is None
    # the caller's state object is left as it was
    assert order.sent == ""


async def test_each_call_result_is_written_into_its_field_before_the_next_superstep():
    seen: list[str] = []
    registry = Registry()

    @registry.tool
    def hold_seats(show: str, seats: int) -> str:
        return "held"

    def check(order: Order) -> None:
        seen.append(order.note)

    flow = (
        Flow("f", state=Order)
        .node("hold", Call("hold_seats", args=args, into="note"))
        .node("check", check)
        .edge("hold", "check")
        .end("check")
    )

    await runner_for(registry).run(flow, Order(show="x", seats=1))

    assert seen == ["held"]


# --- fan-out and joins ------------------------------------------------------------------


async def test_parallel_branches_run_concurrently_and_their_join_runs_once():
    # Given a -> b, a -> c, b -> d, c -> d, where b and c can only finish if both are running:
    # each sets its own event and waits (with a timeout) for the other's
    b_ready, c_ready = asyncio.Event(), asyncio.Event()
    runs: list[str] = []

    def a(state: Trail) -> None:
        runs.append("a")

    async def b(state: Trail) -> dict[str, Any]:
        runs.append("b")
        b_ready.set()
        await asyncio.wait_for(c_ready.wait(), WAIT)
        return {"log": ["b"]}

    async def c(state: Trail) -> dict[str, Any]:
        runs.append("c")
        c_ready.set()
        await asyncio.wait_for(b_ready.wait(), WAIT)
        return {"log": ["c"]}

    def d(state: Trail) -> dict[str, Any]:
        runs.append("d")
        return {"log": ["d"]}

    flow = (
        Flow("diamond", state=Trail)
        .node("a", a)
        .node("b", b)
        .node("c", c)
        .node("d", d)
        .edge("a", "b")
        .edge("a", "c")
        .edge("b", "d")
        .edge("c", "d")
        .end("d")
    )

    # When it runs
    result = await runner_for().run(flow, Trail())

    # Then b and c ran in one superstep (neither timed out), and d, reached twice, ran once
    assert result.status == "done", result.error
    assert runs.count("d") == 1
    assert sorted(runs[1:3]) == ["b", "c"]
    assert result.state.log == ["b", "c", "d"]


async def test_nodes_of_one_superstep_share_a_superstep_number_in_events():
    flow = (
        Flow("fan", state=Trail)
        .node("a", append("a"))
        .node("b", append("b"))
        .node("c", append("c"))
        .edge("a", "b")
        .edge("a", "c")
        .end("b", "c")
    )
    runner = runner_for()
    started: dict[str, int] = {}

    def on_event(event: Event) -> None:
        if event.name == "node.started":
            started[event.data["node"]] = event.data["superstep"]

    runner.events.subscribe(on_event)

    await runner.run(flow, Trail())

    assert started == {"a": 0, "b": 1, "c": 1}


async def test_sync_node_functions_of_one_superstep_also_run_concurrently():
    # Given two sync nodes that each wait for the other (threads, with a timeout)
    left_in, right_in = threading.Event(), threading.Event()

    def left(state: Trail) -> dict[str, Any]:
        left_in.set()
        assert right_in.wait(WAIT), "right never started while left was running"
        return {"log": ["left"]}

    def right(state: Trail) -> dict[str, Any]:
        right_in.set()
        assert left_in.wait(WAIT), "left never started while right was running"
        return {"log": ["right"]}

    flow = (
        Flow("threads", state=Trail)
        .node("start", append("start"))
        .node("left", left)
        .node("right", right)
        .edge("start", "left")
        .edge("start", "right")
        .end("left", "right")
    )

    result = await runner_for().run(flow, Trail())

    assert result.status == "done", result.error
    assert result.state.log == ["start", "left", "right"]


# --- conditional edges ------------------------------------------------------------------


def branching_flow() -> Flow[Order]:
    def route(order: Order) -> None:
        return None

    def big(order: Order) -> dict[str, str]:
        return {"note": "group booking"}

    def small(order: Order) -> dict[str, str]:
        return {"note": "single booking"}

    return (
        Flow("route", state=Order)
        .node("route", route)
        .node("big", big)
        .node("small", small)
        .edge("route", "big", when=lambda o: o.seats >= 10)
        .edge("route", "small", when=lambda o: o.seats < 10)
        .end("big", "small")
    )


async def test_a_conditional_edge_is_followed_when_its_condition_holds():
    result = await runner_for().run(branching_flow(), Order(show="x", seats=12))

    assert result.state.note == "group booking"


async def test_a_conditional_edge_is_not_followed_when_its_condition_fails():
    result = await runner_for().run(branching_flow(), Order(show="x", seats=2))

    assert result.state.note == "single booking"


async def test_a_condition_sees_the_state_after_the_superstep():
    # Given a node that sets seats, followed by an edge conditioned on seats
    def set_seats(order: Order) -> dict[str, int]:
        return {"seats": 50}

    def big(order: Order) -> dict[str, str]:
        return {"note": "big"}

    flow = (
        Flow("f", state=Order)
        .node("set", set_seats)
        .node("big", big)
        .edge("set", "big", when=lambda o: o.seats >= 10)
        .end("set", "big")
    )

    # When it starts with few seats, the condition sees the updated value
    result = await runner_for().run(flow, Order(show="x", seats=1))

    assert result.state.note == "big"


async def test_no_matching_edge_out_of_a_non_end_node_is_a_flow_error():
    def route(order: Order) -> None:
        return None

    def big(order: Order) -> None:
        return None

    flow = Flow("f", state=Order).node("route", route).node("big", big)
    flow.edge("route", "big", when=lambda o: o.seats > 100).end("big")

    with pytest.raises(FlowError, match="no edge out of 'route' matched the state, and it is not an end"):
        await runner_for().run(flow, Order(show="x", seats=1))


# --- merging updates --------------------------------------------------------------------


async def test_two_nodes_writing_one_plain_field_in_a_superstep_is_an_error():
    # Given two nodes of one superstep that both write the plain field `value`
    def one(state: Trail) -> dict[str, int]:
        return {"value": 1}

    def two(state: Trail) -> dict[str, int]:
        return {"value": 2}

    flow = (
        Flow("clash", state=Trail)
        .node("start", append("start"))
        .node("one", one)
        .node("two", two)
        .edge("start", "one")
        .edge("start", "two")
        .end("one", "two")
    )

    # When it runs, Then it stops with a FlowError naming both nodes and the field
    with pytest.raises(FlowError) as caught:
        await runner_for().run(flow, Trail())
    message = str(caught.value)
    assert "'one'" in message and "'two'" in message and "'value'" in message
    assert "Annotated" in message  # and says how to fix it


async def test_a_field_with_a_reducer_combines_both_writes_in_node_add_order():
    # Given two nodes of one superstep writing `log` (Annotated[list[str], operator.add]);
    # "first" was added first but finishes last
    second_done = asyncio.Event()

    async def first(state: Trail) -> dict[str, Any]:
        await asyncio.wait_for(second_done.wait(), WAIT)
        return {"log": ["first"]}

    async def second(state: Trail) -> dict[str, Any]:
        second_done.set()
        return {"log": ["second"]}

    flow = (
        Flow("merge", state=Trail)
        .node("start", append("start"))
        .node("first", first)
        .node("second", second)
        .edge("start", "first")
        .edge("start", "second")
        .end("first", "second")
    )

    # When it runs from a state that already has a line
    result = await runner_for().run(flow, Trail(log=["seed"]))

    # Then every write was combined with the current value, in the order the nodes were added
    assert result.state.log == ["seed", "start", "first", "second"]


async def test_a_node_does_not_see_a_siblings_changes_within_a_superstep():
    # Given sibling nodes: "writer" changes its state in place and returns an update;
    # "reader" looks at its state only after the writer has finished
    writer_done = asyncio.Event()
    seen: list[tuple[int, list[str]]] = []

    async def writer(state: Trail) -> dict[str, Any]:
        state.items.append("mutated in place")
        state.value = 99
        writer_done.set()
        return {"value": 1}

    async def reader(state: Trail) -> dict[str, Any]:
        await asyncio.wait_for(writer_done.wait(), WAIT)
        await asyncio.sleep(0)
        seen.append((state.value, list(state.items)))
        return {"log": ["read"]}

    def after(state: Trail) -> None:
        seen.append((state.value, list(state.items)))

    flow = (
        Flow("isolation", state=Trail)
        .node("start", append("start"))
        .node("writer", writer)
        .node("reader", reader)
        .node("after", after)
        .edge("start", "writer")
        .edge("start", "reader")
        .edge("writer", "after")
        .edge("reader", "after")
        .end("after")
    )

    result = await runner_for().run(flow, Trail())

    # Then the reader saw the state as the superstep began; the next superstep sees only the returned update
    assert seen[0] == (0, [])
    assert seen[1] == (1, [])
    assert result.state.items == []


class Flat(BaseModel):
    """A state of immutable fields only: each node's copy of it is a shallow one."""

    value: int = 0
    name: str = ""
    ratio: float | None = None


async def test_a_node_assigning_to_a_state_of_immutable_fields_changes_only_its_own_copy():
    # Given sibling nodes over a state whose fields are all immutable values: "writer" assigns
    # to every field of its state and returns one update; "reader" looks only after that
    writer_done = asyncio.Event()
    seen: list[tuple[int, str, float | None]] = []

    async def writer(state: Flat) -> dict[str, Any]:
        state.value, state.name, state.ratio = 99, "changed in place", 0.5
        writer_done.set()
        return {"value": 1}

    async def reader(state: Flat) -> None:
        await asyncio.wait_for(writer_done.wait(), WAIT)
        seen.append((state.value, state.name, state.ratio))

    def after(state: Flat) -> None:
        seen.append((state.value, state.name, state.ratio))

    flow = (
        Flow("flat", state=Flat)
        .node("start", lambda state: None)
        .node("writer", writer)
        .node("reader", reader)
        .node("after", after)
        .edge("start", "writer")
        .edge("start", "reader")
        .edge("writer", "after")
        .edge("reader", "after")
        .end("after")
    )
    start = Flat(name="given")

    result = await runner_for().run(flow, start)

    # Then neither the sibling, nor the next superstep, nor the caller's state saw the assignments
    assert seen == [(0, "given", None), (1, "given", None)]
    assert result.state == Flat(value=1, name="given")
    assert start == Flat(name="given")


async def test_a_node_returning_something_other_than_a_dict_is_a_flow_error():
    def bad(state: Order) -> str:
        return "done"

    flow = Flow("f", state=Order).node("bad", bad).end("bad")

    with pytest.raises(FlowError, match="node 'bad' returned str; return a dict"):
        await runner_for().run(flow, Order(show="x", seats=1))


async def test_a_node_returning_none_changes_nothing():
    def nothing(state: Order) -> None:
        return None

    flow = Flow("f", state=Order).node("nothing", nothing).end("nothing")

    result = await runner_for().run(flow, Order(show="x", seats=1, note="kept"))

    assert result.status == "done"
    assert result.state == Order(show="x", seats=1, note="kept")


async def test_a_node_returning_an_unknown_field_is_a_flow_error():
    def typo(state: Order) -> dict[str, str]:
        return {"note": "ok", "ntoe": "typo"}

    flow = Flow("f", state=Order).node("typo", typo).end("typo")

    with pytest.raises(FlowError, match="node 'typo' returned field 'ntoe', which the state lacks"):
        await runner_for().run(flow, Order(show="x", seats=1))


async def test_an_update_that_does_not_fit_the_state_is_a_flow_error():
    def wrong_type(state: Order) -> dict[str, str]:
        return {"seats": "a few"}

    flow = Flow("f", state=Order).node("w", wrong_type).end("w")

    with pytest.raises(FlowError, match="does not fit Order"):
        await runner_for().run(flow, Order(show="x", seats=1))


# --- visits -----------------------------------------------------------------------------


def counter_flow(*, max_visits: int | None = None, flow_max: int = 25, stop_at: int = 1000) -> Flow[Trail]:
    def tick(state: Trail) -> dict[str, int]:
        return {"value": state.value + 1}

    flow = Flow("loop", state=Trail, max_visits=flow_max)
    flow.node("tick", tick, max_visits=max_visits)
    return flow.edge("tick", "tick", when=lambda s: s.value < stop_at).end("tick")


async def test_a_cycle_past_its_visit_limit_stops_with_flow_error():
    # Given a node that loops back to itself forever, under a flow limit of 4 visits
    runner = runner_for()
    ticks: list[int] = []
    runner.events.subscribe(lambda e: ticks.append(1) if e.name == "node.finished" else None)

    # When it runs, Then it stops with a FlowError naming the node and its limit, after 4 runs
    with pytest.raises(FlowError, match=r"node 'tick' would run a 5th time, past its limit of 4"):
        await runner.run(counter_flow(flow_max=4), Trail())
    assert len(ticks) == 4


async def test_a_cycle_within_its_visit_limit_finishes():
    # Given the same loop, which stops by itself after exactly 4 runs
    result = await runner_for().run(counter_flow(flow_max=4, stop_at=4), Trail())

    # Then the limit is not hit: a node may run exactly max_visits times
    assert result.status == "done"
    assert result.state.value == 4


async def test_max_visits_is_per_node_and_overrides_the_flow_default():
    # Given a loop node limited to 2 visits in a flow whose default is 25
    with pytest.raises(FlowError, match=r"'tick'.*limit of 2"):
        await runner_for().run(counter_flow(max_visits=2, flow_max=25), Trail())


async def test_visits_count_each_node_separately():
    # Given a -> b -> a ... where only b is limited (to 2): a may run a third time, b may not
    ran: list[str] = []

    def a(state: Trail) -> dict[str, int]:
        ran.append("a")
        return {"value": state.value + 1}

    def b(state: Trail) -> None:
        ran.append("b")

    flow = Flow("pair", state=Trail).node("a", a).node("b", b, max_visits=2)
    flow.edge("a", "b").edge("b", "a", when=lambda s: True).end("b")

    with pytest.raises(FlowError, match=r"node 'b' would run a 3th time"):
        await runner_for().run(flow, Trail())
    assert ran == ["a", "b", "a", "b", "a"]


# --- node kinds -------------------------------------------------------------------------


async def test_a_sync_node_function_calls_a_tool_through_call_sync():
    # Given a sync node function that calls a tool with its handle
    registry = Registry()
    node_threads: list[int] = []

    @registry.tool
    async def hold_seats(show: str, seats: int) -> str:
        return f"held {seats} for {show}"

    def hold(order: Order, handle: NodeHandle) -> dict[str, str]:
        node_threads.append(threading.get_ident())
        return {"note": handle.call_sync("hold_seats", show=order.show, seats=order.seats)}

    flow = Flow("f", state=Order).node("hold", hold).end("hold")

    # When it runs
    result = await runner_for(registry).run(flow, Order(show="Hamlet", seats=3))

    # Then the node ran off the loop's thread and got the tool's result
    assert result.status == "done", result.error
    assert result.state.note == "held 3 for Hamlet"
    assert node_threads[0] != threading.get_ident()


async def test_call_sync_from_an_async_node_is_refused():
    registry = Registry()

    @registry.tool
    async def ping() -> str:
        return "pong"

    async def wrong(order: Order, handle: NodeHandle) -> dict[str, str]:
        return {"note": handle.call_sync("ping")}

    flow = Flow("f", state=Order).node("wrong", wrong).end("wrong")

    result = await runner_for(registry).run(flow, Order(show="x", seats=1))

    assert result.status == "failed"
    assert result.error is not None and "call_sync is for sync node functions" in result.error


async def test_an_async_node_function_calls_several_tools():
    # Given an async node that holds seats, then charges for them, through its handle
    tickets = make_tickets()

    async def book(order: Order, handle: NodeHandle) -> dict[str, str]:
        held = await handle.call("hold_seats", show=order.show, seats=order.seats)
        charged = await handle.call("charge_card", show=order.show, seats=order.seats)
        return {"note": f"{held}; {charged}"}

    flow = Flow("book", state=Order).node("book", book).end("book")

    # When it runs
    result = await runner_for(tickets.registry).run(flow, Order(show="Hamlet", seats=2))

    # Then both calls ran in order, and the node's update holds both results
    assert [e.tool for e in tickets.ledger.entries()] == ["hold_seats", "charge_card"]
    assert result.state.note == "held 2 for Hamlet; charged 80 for Hamlet"


async def test_a_tool_that_raises_fails_the_run_with_the_error():
    # Given a flow whose second tool raises
    registry = Registry()

    @registry.tool
    async def hold_seats(show: str, seats: int) -> str:
        return "held"

    @registry.tool
    async def charge_card(show: str, seats: int) -> str:
        raise ValueError("card declined")

    flow = (
        Flow("f", state=Order)
        .node("hold", Call("hold_seats", args=args, into="note"))
        .node("pay", Call("charge_card", args=args, into="note"))
        .edge("hold", "pay")
        .end("pay")
    )

    # When it runs
    result = await runner_for(registry).run(flow, Order(show="x", seats=1))

    # Then the run is failed, says why, and keeps the state of the last finished superstep
    assert result.status == "failed"
    assert result.error == "ValueError: card declined"
    assert result.state.note == "held"


async def test_a_node_function_that_raises_fails_the_run():
    def broken(order: Order) -> None:
        raise KeyError("seat map missing")

    flow = Flow("f", state=Order).node("broken", broken).end("broken")

    result = await runner_for().run(flow, Order(show="x", seats=1))

    assert result.status == "failed"
    assert result.error is not None and "seat map missing" in result.error


# --- runs -------------------------------------------------------------------------------


async def test_run_id_defaults_to_an_unguessable_id():
    flow = Flow("f", state=Order).node("a", lambda o: None).end("a")
    runner = runner_for()

    first = await runner.run(flow, Order(show="x", seats=1))
    second = await runner.run(flow, Order(show="x", seats=1))

    assert first.run_id != second.run_id
    assert len(first.run_id) >= 20 and len(second.run_id) >= 20


async def test_events_report_the_run_and_its_nodes_in_order():
    # Given a two-node flow and a subscriber
    flow = Flow("pair", state=Trail).node("a", append("a")).node("b", append("b")).edge("a", "b").end("b")
    runner = runner_for()
    events: list[Event] = []
    runner.events.subscribe(events.append)

    # When it runs
    result = await runner.run(flow, Trail(), run_id="pair-1")

    # Then the run's and the nodes' events come in order, all tagged with the run id
    assert [(e.name, e.data.get("node")) for e in events] == [
        ("run.started", None),
        ("node.started", "a"),
        ("node.finished", "a"),
        ("node.started", "b"),
        ("node.finished", "b"),
        ("run.finished", None),
    ]
    assert {e.run_id for e in events} == {"pair-1"}
    assert events[0].data["flow"] == "pair"
    assert events[-1].data["status"] == "done" == result.status


async def test_a_failed_run_finishes_with_a_failed_event():
    def broken(order: Order) -> None:
        raise RuntimeError("nope")

    flow = Flow("f", state=Order).node("broken", broken).end("broken")
    runner = runner_for()
    finished: list[Event] = []
    runner.events.subscribe(lambda e: finished.append(e) if e.name == "run.finished" else None)

    await runner.run(flow, Order(show="x", seats=1))

    assert len(finished) == 1
    assert finished[0].data["status"] == "failed"
    assert "nope" in finished[0].data["error"]


async def test_state_given_as_a_dict_is_validated_into_the_state_model():
    result = await runner_for(make_tickets().registry).run(TICKETS, {"show": "Hamlet", "seats": "2"})

    assert result.status == "done"
    assert isinstance(result.state, kit.Order)
    assert result.state.seats == 2


async def test_a_bad_state_dict_is_a_flow_error_before_anything_runs():
    tickets = make_tickets()

    with pytest.raises(FlowError, match=r"(?s)initial state does not fit Order.*seats"):
        await runner_for(tickets.registry).run(TICKETS, {"show": "Hamlet", "seats": "many"})
    assert tickets.counts() == {}


async def test_a_state_of_another_type_is_a_flow_error():
    class Other(BaseModel):
        show: str = "x"

    with pytest.raises(FlowError, match="state must be a Order or a dict, not Other"):
        await runner_for(make_tickets().registry).run(TICKETS, Other())  # type: ignore[misc]


def test_run_context_holds_user_thread_and_principal():
    ctx = RunContext(user="u1", thread="t1", principal="secret-token")

    assert (ctx.user, ctx.thread, ctx.principal) == ("u1", "t1", "secret-token")
    assert RunContext() == RunContext(user=None, thread=None, principal=None)
    # the credential never shows in logs
    assert "secret-token" not in repr(ctx)
    assert "u1" in repr(ctx)
    with pytest.raises(AttributeError):
        ctx.user = "someone else"  # type: ignore[misc]


async def test_the_run_context_reaches_approval_policies_and_the_approval_port():
    # Given a tool whose approval policy asks only for calls made for user "guest"
    registry = Registry()
    refunded: list[int] = []

    @registry.tool(approval=lambda args, ctx: ctx is not None and ctx.user == "guest")
    async def refund(amount: int) -> str:
        refunded.append(amount)
        return "refunded"

    asked: list[ApprovalRequest] = []

    def port(request: ApprovalRequest) -> bool:
        asked.append(request)
        return False

    flow = Flow("f", state=Order).node("refund", Call("refund", args={"amount": 5}, into="note")).end("refund")
    runner = FlowRunner(Executor(registry, approver=port))

    # When a member's run and a guest's run make the call
    member = await runner.run(flow, Order(show="x", seats=1), ctx=RunContext(user="member", thread="t1"))
    guest = await runner.run(flow, Order(show="x", seats=1), ctx=RunContext(user="guest", thread="t2"))

    # Then only the guest's call went to the port, which saw the guest's context
    assert member.status == "done" and refunded == [5]
    assert guest.status == "failed"
    assert [(r.ctx.user, r.ctx.thread) for r in asked if r.ctx] == [("guest", "t2")]
