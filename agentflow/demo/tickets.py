"""The ticket flow of the demo: hold seats, charge the card, email the tickets.

The tools stand in for real systems. Each effect is appended to a ledger file (the
"outside world"), so the demo can show what really happened, and `email_tickets` can be
slowed down so the demo has time to kill the worker while the mail is being sent.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from agentflow import Call, Flow, FlowApp, Registry
from agentflow.exec import current_call, idempotency_key

registry = Registry()

#: Where the tools record their effects (set by the demo before any tool runs).
LEDGER_ENV = "AGENTFLOW_DEMO_LEDGER"
#: Seconds `email_tickets` takes for runs listed in AGENTFLOW_DEMO_SLOW (comma-separated run ids).
SLOW_ENV = "AGENTFLOW_DEMO_SLOW"


def _record(tool: str, detail: str) -> None:
    path = os.environ.get(LEDGER_ENV)
    if not path:
        return
    info = current_call()
    with Path(path).open("a") as fh:
        fh.write(json.dumps({"tool": tool, "run_id": info.run_id, "key": idempotency_key(), "detail": detail}) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def ledger(path: Path) -> list[dict[str, Any]]:
    """Read the effects recorded so far."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@registry.tool(idempotent=True)
async def hold_seats(show: str, seats: int) -> str:
    """Hold seats for a show (holding twice holds the same seats)."""
    _record("hold_seats", f"{seats} seats for {show}")
    return f"held {seats} seats for {show}"


@registry.tool
async def charge_card(show: str, seats: int) -> str:
    """Charge the customer's card (not idempotent: charging twice charges twice)."""
    _record("charge_card", f"{seats * 45} EUR")
    return f"charged {seats * 45} EUR"


@registry.tool
async def email_tickets(show: str) -> str:
    """Email the tickets (not idempotent: the customer would get two mails)."""
    slow = os.environ.get(SLOW_ENV, "").split(",")
    if current_call().run_id in slow:
        await asyncio.sleep(30)  # the demo kills the worker during this wait
    _record("email_tickets", f"tickets for {show}")
    return f"tickets for {show} sent"


class Order(BaseModel):
    """A ticket order, the state of one run."""

    show: str
    seats: int
    note: str = ""


def order_args(order: Order) -> dict[str, object]:
    """Arguments of the hold and pay calls."""
    return {"show": order.show, "seats": order.seats}


flow = (
    Flow("tickets", state=Order)
    .node("hold", Call("hold_seats", args=order_args, into="note"))
    .node("pay", Call("charge_card", args=order_args, into="note"))
    .node("send", Call("email_tickets", args=lambda o: {"show": o.show}, into="note"))
    .edge("hold", "pay")
    .edge("pay", "send")
    .end("send")
)

#: The demo's app: ``--app agentflow.demo.tickets:app`` on the command line.
app = FlowApp(registry, [flow])
