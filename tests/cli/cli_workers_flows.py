"""The app the CLI's workers tests run: the Celery tests' app (``celery_flows:app``) and one flow more.

``late_mail`` writes a report (``report_when_told``, which finishes once the test opens its
gate), then mails the tickets: a run a worker is busy with that still has a call to make, for
``cancel`` to stop. The tools are ``celery_flows``'s own (and its ledger), so their effects
go to the deployment's ledger.
"""

from __future__ import annotations

import asyncio
import os

from _kit.tickets import Order, show_args
from celery_flows import app as celery_tests_app
from celery_flows import ledger
from cli_workers_kit import gate

from agentflow import Call, Flow, FlowApp
from agentflow.exec import current_call, idempotency_key


@celery_tests_app.registry.tool(idempotent=True)
async def report_when_told(show: str) -> str:
    """Write a report, finishing only once the test opened its gate (a worker busy for as long as the test needs)."""
    opened = gate(os.environ["AGENTFLOW_TEST_LEDGER"], show)
    while not opened.exists():
        await asyncio.sleep(0.05)
    ledger.record("report_when_told", current_call().run_id, idempotency_key())
    return f"reported {show}"


LATE_MAIL = (
    Flow("late_mail", state=Order)
    .node("report", Call("report_when_told", args=show_args, into="held"))
    .node("send", Call("email_tickets", args=show_args, into="sent"))
    .edge("report", "send")
    .end("send")
)

app = FlowApp(celery_tests_app.registry, [*celery_tests_app.flows.values(), LATE_MAIL], loops=celery_tests_app.loops)
