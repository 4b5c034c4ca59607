"""Flow building: validation errors that say what to fix, the entry node, and the graph digest."""

import operator
from collections.abc import Callable
from typing import Annotated

import pytest
from _kit import tickets as kit
from _kit.tickets import make_tickets, tickets_flow
from pydantic import BaseModel

from agentflow import Call, Executor, Flow, FlowRunner, Registry
from agentflow.flow import FlowError


class Order(BaseModel):
    show: str
    seats: int
    note: str = ""


def args(order: Order) -> dict[str, object]:
    return {"show": order.show, "seats": order.seats}


def step(state: BaseModel) -> None:
    return None


def other_step(state: BaseModel) -> None:
    return None


# --- build-time validation --------------------------------------------------------------


def test_a_valid_flow_validates():
    flow = tickets_flow()
    flow.validate(make_tickets().registry)  # raises nothing


def test_an_edge_to_an_unknown_node_is_refused_naming_it():
    flow = Flow("f", state=Order).node("a", step).edge("a", "nowhere").end("a")

    with pytest.raises(FlowError, match=r"edge 'a' -> 'nowhere' names unknown node 'nowhere'"):
        flow.validate()


def test_an_edge_from_an_unknown_node_is_refused_naming_it():
    flow = Flow("f", state=Order).node("a", step).edge("ghost", "a").end("a")

    with pytest.raises(FlowError, match="unknown node 'ghost'"):
        flow.validate()


def test_end_naming_an_unknown_node_is_refused():
    flow = Flow("f", state=Order).node("a", step).end("a", "b")

    with pytest.raises(FlowError, match=r"\.end\('b'\) names an unknown node"):
        flow.validate()


def test_a_duplicate_node_is_refused_when_added():
    flow = Flow("f", state=Order).node("a", step)

    with pytest.raises(FlowError, match="node named 'a' already exists; give each node its own name"):
        flow.node("a", other_step)
    # the first node is kept
    assert flow.nodes["a"].action is step


def test_a_flow_without_an_end_is_refused():
    flow = Flow("f", state=Order).node("a", step).node("b", step).edge("a", "b").edge("b", "a")

    with pytest.raises(FlowError, match=r"has no end; mark the last node with \.end\(name\)"):
        flow.validate()


def test_a_flow_without_nodes_is_refused():
    with pytest.raises(FlowError, match="has no nodes"):
        Flow("f", state=Order).validate()


def test_an_unreachable_node_is_refused_naming_it():
    # Given a node no edge leads to from the entry
    flow = Flow("f", state=Order).node("a", step).node("island", step).end("a", "island")

    # Then validation names it and the entry it cannot be reached from
    with pytest.raises(FlowError, match=r"'island' cannot be reached from 'a'"):
        flow.validate()


def test_call_into_a_missing_field_is_refused_naming_the_fields():
    flow = Flow("f", state=Order)

    with pytest.raises(FlowError, match=r"Call\(into='receipt'\).*Order does not have \(fields: show, seats, note\)"):
        flow.node("pay", Call("charge_card", into="receipt"))
    assert "pay" not in flow.nodes


def test_a_call_to_a_tool_the_registry_lacks_is_refused_by_validate():
    flow = tickets_flow(pay_tool="charge_kard")

    with pytest.raises(FlowError, match=r"node 'pay' calls tool 'charge_kard'.*register it"):
        flow.validate(make_tickets().registry)


async def test_a_call_to_a_tool_the_registry_lacks_is_refused_by_run_before_anything_runs():
    # Given a registry whose first tool records its calls, and a flow whose second node names a missing tool
    registry = make_tickets().registry
    ran: list[str] = []

    @registry.tool(name="hold_seats_logged")
    def hold(show: str, seats: int) -> str:
        ran.append(show)
        return "held"

    flow = (
        Flow("tickets", state=Order)
        .node("hold", Call("hold_seats_logged", args=args, into="note"))
        .node("pay", Call("charge_kard", args=args, into="note"))
        .edge("hold", "pay")
        .end("pay")
    )

    # When it is run, it is refused and no tool ran
    with pytest.raises(FlowError, match="'charge_kard'"):
        await FlowRunner(Executor(registry)).run(flow, Order(show="x", seats=1))
    assert ran == []


def test_a_plain_edge_out_of_an_end_node_is_refused():
    flow = Flow("f", state=Order).node("a", step).node("b", step).edge("a", "b").edge("b", "a").end("b")

    with pytest.raises(FlowError, match="end node 'b' has a plain edge to 'a'; make it conditional"):
        flow.validate()


def test_a_conditional_edge_out_of_an_end_node_is_allowed():
    flow = (
        Flow("f", state=Order)
        .node("a", step)
        .node("b", step)
        .edge("a", "b")
        .edge("b", "a", when=lambda o: o.seats > 0)
        .end("b")
    )

    flow.validate()  # raises nothing


def test_a_non_end_node_without_an_edge_out_is_refused():
    flow = Flow("f", state=Order).node("a", step).node("b", step).node("c", step).edge("a", "b").edge("a", "c")
    flow.end("c")

    with pytest.raises(FlowError, match=r"node 'b' has no edge out and is not an end; add an edge or \.end\(\)"):
        flow.validate()


def test_a_node_function_with_a_wrong_signature_is_refused():
    def three(state: BaseModel, handle: object, extra: object) -> None:
        return None

    with pytest.raises(FlowError, match=r"takes \(state\) or \(state, handle\)"):
        Flow("f", state=Order).node("a", three)


def test_the_state_must_be_a_pydantic_model():
    with pytest.raises(FlowError, match="state must be a pydantic BaseModel class"):
        Flow("f", state=dict)  # type: ignore[type-var]


def test_the_first_node_added_is_the_entry():
    # Given nodes added in the order b, a (not alphabetical), with the edge pointing back
    flow = Flow("f", state=Order).node("b", step).node("a", step).edge("b", "a").end("a")

    assert flow.entry == "b"


async def test_a_run_starts_at_the_first_node_added():
    ran: list[str] = []

    def mark(name: str) -> Callable[[Order], None]:
        def node(state: Order) -> None:
            ran.append(name)

        return node

    flow = Flow("f", state=Order).node("z", mark("z")).node("a", mark("a")).edge("z", "a").end("a")

    await FlowRunner(Executor(Registry())).run(flow, Order(show="x", seats=1))

    assert ran == ["z", "a"]


# --- the digest -------------------------------------------------------------------------


def test_the_digest_is_stable_for_an_identical_flow_built_twice():
    assert tickets_flow().digest == tickets_flow().digest


def test_the_digest_changes_when_an_edge_is_added():
    flow = tickets_flow()
    before = flow.digest

    flow.edge("hold", "send")

    assert flow.digest != before


def test_the_digest_changes_when_a_node_calls_another_tool():
    assert tickets_flow(pay_tool="charge_card").digest != tickets_flow(pay_tool="charge_wallet").digest


def test_the_digest_changes_when_the_state_schema_changes():
    class Order(kit.Order):  # same class name, one more field
        refunded: bool = False

    assert tickets_flow(state=Order).digest != tickets_flow().digest


def test_the_digest_changes_when_a_field_type_changes():
    class Order(kit.Order):  # same class name and fields, seats became a str
        seats: str = "2"  # type: ignore[assignment]

    assert tickets_flow(state=Order).digest != tickets_flow().digest


def test_the_digest_changes_when_an_end_is_added():
    # Given a -> b (only while seats are left), ending at b
    flow = Flow("f", state=Order).node("a", step).node("b", step).edge("a", "b", when=lambda o: o.seats > 0).end("b")
    before = flow.digest

    # When a becomes an end too (a run may now stop there)
    flow.end("a")

    assert flow.digest != before


def test_the_digest_changes_when_a_node_kind_changes():
    plain = Flow("f", state=Order).node("a", step).end("a")
    call = Flow("f", state=Order).node("a", Call("step")).end("a")

    assert plain.digest != call.digest


def test_the_digest_changes_when_a_node_changes_its_function():
    assert (
        Flow("f", state=Order).node("a", step).end("a").digest
        != Flow("f", state=Order).node("a", other_step).end("a").digest
    )


def test_the_digest_changes_with_a_visit_limit():
    assert (
        Flow("f", state=Order).node("a", step).end("a").digest
        != Flow("f", state=Order).node("a", step, max_visits=3).end("a").digest
    )


def test_the_digest_changes_when_a_field_gains_a_reducer():
    class Log(BaseModel):
        lines: list[str] = []

    plain = Flow("f", state=Log).node("a", step).end("a").digest

    class Log(BaseModel):  # type: ignore[no-redef]  # same name and type, now combined with operator.add
        lines: Annotated[list[str], operator.add] = []

    reduced = Flow("f", state=Log).node("a", step).end("a").digest

    assert plain != reduced


def test_validation_errors_are_flow_errors_until_fixed():
    # Given an invalid flow that has been checked once
    flow = Flow("f", state=Order).node("a", step).node("b", step).edge("a", "b")
    with pytest.raises(FlowError, match="no end"):
        flow.validate()

    # When the missing end is added
    flow.end("b")

    # Then it validates (the earlier check is not cached)
    flow.validate()
    assert isinstance(flow.digest, str)
