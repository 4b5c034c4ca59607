"""The alert rules and the dashboard users copy from docs/alerts: valid, tested by promtool, naming real metrics."""

from __future__ import annotations

import json
import re
import subprocess

from _kit.prometheus import ALERTS, binary

from agentflow.observe import Metrics

RULES = ALERTS / "agentflow.rules.yml"
#: A metric name in a PromQL expression: ours (agentflow_...) or a recording rule's (agentflow:...).
NAME = re.compile(r"\bagentflow[_:][a-z_:]+")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([binary("promtool"), *args], cwd=ALERTS, capture_output=True, text=True, timeout=60)


def exported() -> set[str]:
    """Every series name the metrics export: a counter's with _total, a histogram's _bucket, _count and _sum."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    return {family.name + end for family in Metrics().registry.collect() for end in suffixes[family.type]}


def test_promtool_checks_the_rules():
    checked = promtool("check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 12 rules found" in checked.stdout


def test_the_rules_unit_tests_pass():
    # docs/alerts/agentflow.rules.test.yml: the freshest sweep wins, each alert fires when it should
    tested = promtool("test", "rules", "agentflow.rules.test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_the_rules_and_the_dashboard_name_only_metrics_that_exist():
    rules = RULES.read_text()
    recorded = set(re.findall(r"record: (agentflow:[a-z_:]+)", rules))
    dashboard = json.loads((ALERTS / "agentflow.dashboard.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    named = set(NAME.findall(rules)) | {name for expr in exprs for name in NAME.findall(expr)}
    assert named - exported() - recorded == set()
    assert recorded == {
        "agentflow:freshest_sweep",
        "agentflow:runs_waiting_for_decision",
        "agentflow:decision_wait_oldest_seconds",
        "agentflow:recoveries:per_minute",
        "agentflow:unfinished_run_oldest_seconds",
    }
    assert len(exprs) >= 10 and all(panel["datasource"]["uid"] == "${DS_PROMETHEUS}" for panel in dashboard["panels"])
