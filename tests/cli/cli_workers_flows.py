"""The app the CLI's workers tests run: the Celery tests' app (``celery_flows:app``) and one flow more.

``late_mail`` writes a report (``slow_report``, taking ``order.seconds``), then mails the
tickets: a run a worker is busy with that still has a call to make, for ``cancel`` to stop.
The tools are ``celery_flows``'s own, so their effects go to the deployment's ledger.
"""

from __future__ import annotations

from _kit.tickets import Order, show_args
from celery_flows import app as celery_tests_app

from agentflow import Call, Flow, FlowApp

LATE_MAIL = (
    Flow("late_mail", state=Order)
    .node("report", Call("slow_report", args=lambda o: {"show": o.show, "seconds": o.seconds}, into="held"))
    .node("send", Call("email_tickets", args=show_args, into="sent"))
    .edge("report", "send")
    .end("send")
)

app = FlowApp(celery_tests_app.registry, [*celery_tests_app.flows.values(), LATE_MAIL], loops=celery_tests_app.loops)
