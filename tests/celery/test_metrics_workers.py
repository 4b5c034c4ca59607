"""A real Prometheus scrapes real prefork workers after a SIGKILL: counters against the ledger, the rules evaluated."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import pytest
import yaml
from _kit.poll import until
from _kit.ports import free_port
from _kit.prometheus import ALERTS, Prometheus

pytestmark = [pytest.mark.celery, pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(180)]

RULES = ALERTS / "agentflow.rules.yml"


@pytest.fixture
def prometheus(tmp_path, deployment):
    """A Prometheus scraping workers w1 and w2 (each serving its own port, multiprocess dir of its own)."""
    targets = []
    for name in ("w1", "w2"):
        port = free_port()
        folder = tmp_path / f"metrics-{name}"
        folder.mkdir()
        deployment.worker_env[name] = {"AGENTFLOW_METRICS_PORT": str(port), "PROMETHEUS_MULTIPROC_DIR": str(folder)}
        targets.append(f"127.0.0.1:{port}")
    server = Prometheus(tmp_path / "prometheus", targets, [RULES])
    yield server
    server.close()


async def test_prometheus_counts_what_the_ledger_and_the_store_show_after_a_worker_was_killed(deployment, prometheus):
    await prometheus.ready()
    # Given a ticket run whose worker w1 was SIGKILLed (its whole process group) inside charge_card,
    # after the charge: w2 found the call in doubt and parked the run
    run_id = await deployment.parked_run("w1", "w2")
    deployment.start_beat()  # recover_all every 2 s: its sweep counts the runs waiting for a person

    # When Prometheus scrapes w2 and evaluates the rules
    async def firing() -> list[dict[str, Any]]:
        return [a for a in prometheus.alerts() if a["labels"]["alertname"] == "AgentflowCallsInDoubt"]

    # Then the alert on calls in doubt fires, naming the flow, and the call in doubt is counted under its tool
    alerts = await until(firing, "AgentflowCallsInDoubt firing", timeout_s=30, every=0.5)
    assert [(a["state"], a["labels"]["flow"], a["labels"]["why"]) for a in alerts] == [
        ("firing", "tickets", "in_doubt")
    ]
    assert prometheus.scalar('sum(agentflow_calls_in_doubt_total{tool="charge_card"})') == 1

    # And when an operator decides to rerun the charge and w2 finishes the run
    await deployment.client.decide_in_doubt(run_id)
    view = await deployment.client.settle(run_id, timeout_s=30)
    assert view.status == "done"
    report = await deployment.report(run_id)
    recoveries = [seg for seg in report.segments if seg.how == "recovery"]
    in_doubt = [tool for seg in report.segments if seg.how == "parked" for tool, _ in seg.awaiting]
    charges = deployment.effects()[("charge_card", run_id)]

    # Then Prometheus shows what the ledger and the store show: the reruns of charge_card (its
    # charges but the first), the run's recovery claims, the calls its parked claim waited on, one run done
    def counted() -> tuple[float | None, ...]:
        return (
            prometheus.scalar('sum(agentflow_calls_rerun_total{tool="charge_card"})'),
            prometheus.scalar('sum(agentflow_recoveries_total{flow="tickets"})'),
            prometheus.scalar('sum(agentflow_runs_finished_total{flow="tickets",status="done"})'),
            prometheus.scalar('sum(agentflow_calls_in_doubt_total{tool="charge_card"})'),
        )

    expected = (charges - 1, len(recoveries), 1, in_doubt.count("charge_card"))
    assert (charges, len(recoveries), in_doubt) == (2, 1, ["charge_card"])
    await until(lambda: counted() == expected, f"the counters at {expected}", timeout_s=15, every=0.5)

    # and the sweep after the decision sees nobody waiting, so the alert resolves
    async def resolved() -> bool:
        return not await firing()

    await until(resolved, "AgentflowCallsInDoubt resolved", timeout_s=20, every=0.5)

    # And when w2's pool processes, which counted all of it, are SIGKILLed and replaced, the counts stay
    # (each process's files stay in the multiprocess directory, which the main process sums)
    children = set(deployment.children("w2"))
    before = counted()
    for child in children:
        os.kill(child, signal.SIGKILL)
    await until(lambda: len(set(deployment.children("w2")) - children) == 2, "w2's pool replaced", timeout_s=20)
    last_scrape = f'timestamp(up{{instance="127.0.0.1:{deployment.worker_env["w2"]["AGENTFLOW_METRICS_PORT"]}"}})'
    replaced_at = prometheus.scalar("vector(time())") or 0
    await until(lambda: (prometheus.scalar(last_scrape) or 0) > replaced_at, "a scrape after it", timeout_s=10)
    assert counted() == before

    # And every rule evaluated without error, and every query of the dashboard runs
    rules = prometheus.rules()
    written = yaml.safe_load((ALERTS / "agentflow.rules.yml").read_text())["groups"]
    assert len(rules) == sum(len(group["rules"]) for group in written), rules
    assert {r["health"] for r in rules} == {"ok"}, rules
    dashboard = json.loads((ALERTS / "agentflow.dashboard.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            prometheus.query(target["expr"])
