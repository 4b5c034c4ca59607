"""The apps of a rolling deploy: the refunds flow in version 1, in version 2, and both; a deploy that re-flags a tool.

Worker processes import them as ``versioned_flows:v1`` and so on (tests/celery on
``PYTHONPATH``); their tools are the kit's, recording effects in the shared file ledger
(`celery_flows.tickets`). Version 2 adds a currency to the state and drops the apology
branch, so a run cannot cross from one to the other without a migration. ``charge_idempotent``
is the ticket flow as a later deploy declares its tools: the same tool bodies, charge_card
now idempotent (as if it passed an idempotency key).
"""

from __future__ import annotations

from typing import Any

from _kit.tickets import REFUNDS, TICKETS, amount_args, redeployed
from celery_flows import tickets
from pydantic import BaseModel

from agentflow import Call, Flow, FlowApp


class RefundV2(BaseModel):
    """Version 2's state: the refund names its currency."""

    amount: int
    currency: str
    outcome: str = ""
    after: str = ""


REFUNDS_V2 = (
    Flow("refunds", state=RefundV2, version="2")
    .node("refund", Call("refund", args=amount_args, into="outcome"))
    .node("notify", Call("notify", args=amount_args, into="after"))
    .edge("refund", "notify")
    .end("notify")
)

v1 = FlowApp(tickets.registry, [REFUNDS])
v2 = FlowApp(tickets.registry, [REFUNDS_V2])
both = FlowApp(tickets.registry, [REFUNDS, REFUNDS_V2])
charge_idempotent = FlowApp(redeployed(tickets.registry, idempotent={"charge_card": True}), [TICKETS])


def to_v2(old: dict[str, Any]) -> dict[str, Any]:
    """Version 1's state as version 2's: the refunds of version 1 were all in euros."""
    return {**old, "currency": "EUR"}
