"""The 3-node ticket flow (hold seats, charge the card, email the tickets) in agentflow and in LangGraph.

Both run the same three trivial async tools, one per node, in a line. The agentflow flow
is the demo's (`agentflow.demo.tickets`) without its ledger; the LangGraph graph is a
`StateGraph` whose nodes await the same functions. `sync_graph` is the same graph with
sync nodes, for LangGraph's sync `invoke` with its sync `SqliteSaver`.
"""

from __future__ import annotations

from typing import Any, TypedDict

from pydantic import BaseModel

from agentflow import Call, Executor, Flow, FlowRunner, Registry
from agentflow.exec.checkpoints import CheckpointStore

#: The initial state of every run.
ORDER: dict[str, Any] = {"show": "Hamlet", "seats": 2, "note": ""}
#: Supersteps (= tool calls) per run of the flow.
SUPERSTEPS = 3

registry = Registry()


@registry.tool(idempotent=True)
async def hold_seats(show: str, seats: int) -> str:
    """Hold seats for a show."""
    return f"held {seats} seats for {show}"


@registry.tool
async def charge_card(show: str, seats: int) -> str:
    """Charge the customer's card."""
    return f"charged {seats * 45} EUR"


@registry.tool
async def email_tickets(show: str) -> str:
    """Email the tickets."""
    return f"tickets for {show} sent"


class Order(BaseModel):
    """The state of one run."""

    show: str
    seats: int
    note: str = ""


def _order_args(order: Order) -> dict[str, object]:
    return {"show": order.show, "seats": order.seats}


flow = (
    Flow("tickets", state=Order)
    .node("hold", Call("hold_seats", args=_order_args, into="note"))
    .node("pay", Call("charge_card", args=_order_args, into="note"))
    .node("send", Call("email_tickets", args=lambda o: {"show": o.show}, into="note"))
    .edge("hold", "pay")
    .edge("pay", "send")
    .end("send")
)


def runner(store: CheckpointStore | None = None, key: bytes | None = None) -> FlowRunner:
    """A runner for `flow` (no store, or `store` signed with `key`; the memory store needs none)."""
    return FlowRunner(Executor(registry), checkpoints=store, checkpoint_key=key)


class OrderDict(TypedDict):
    """The LangGraph state: the same fields as `Order`."""

    show: str
    seats: int
    note: str


async def _lg_hold(state: OrderDict) -> dict[str, str]:
    return {"note": await hold_seats(state["show"], state["seats"])}


async def _lg_pay(state: OrderDict) -> dict[str, str]:
    return {"note": await charge_card(state["show"], state["seats"])}


async def _lg_send(state: OrderDict) -> dict[str, str]:
    return {"note": await email_tickets(state["show"])}


def _sync_hold(state: OrderDict) -> dict[str, str]:
    return {"note": f"held {state['seats']} seats for {state['show']}"}


def _sync_pay(state: OrderDict) -> dict[str, str]:
    return {"note": f"charged {state['seats'] * 45} EUR"}


def _sync_send(state: OrderDict) -> dict[str, str]:
    return {"note": f"tickets for {state['show']} sent"}


def _graph(nodes: tuple[Any, Any, Any]) -> Any:
    from langgraph.graph import END, START, StateGraph

    graph = StateGraph(OrderDict)
    for name, fn in zip(("hold", "pay", "send"), nodes, strict=True):
        graph.add_node(name, fn)
    graph.add_edge(START, "hold")
    graph.add_edge("hold", "pay")
    graph.add_edge("pay", "send")
    graph.add_edge("send", END)
    return graph


def graph() -> Any:
    """The LangGraph `StateGraph` (not compiled) with async nodes."""
    return _graph((_lg_hold, _lg_pay, _lg_send))


def sync_graph() -> Any:
    """The same graph with sync nodes (for `invoke`)."""
    return _graph((_sync_hold, _sync_pay, _sync_send))
