"""``agentflow recover`` and ``agentflow resume``: acting on stored runs with the app's flows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import runs_kit
from runs_kit import one_line_error

APP = "runs_kit:app"


def test_recover_stops_at_a_call_in_doubt_then_reruns_it_when_told(agentflow):
    # Given ship-1, whose worker died inside the (not idempotent) ship tool
    # When it is recovered without a decision
    first = agentflow("recover", "ship-1", "--app", APP)
    # Then nothing ran, the summary says why, and the exit code says a run was not recovered
    assert first.exit_code == 1
    assert "ship-1  needs a decision  in doubt: ship" in first.stdout
    assert "recovering 1 run(s)" in first.stderr
    assert "1 of 1 run(s) were not recovered" in first.stderr
    # When the operator checked the call and recovers with --rerun-in-doubt
    second = agentflow("recover", "ship-1", "--app", APP, "--rerun-in-doubt")
    # Then the run finishes, and is marked recovered
    assert second.exit_code == 0, second.output
    assert "ship-1  done" in second.stdout and "reran 1" in second.stdout
    listing = agentflow("runs", "list", "--flow", "shipping").stdout
    assert "done" in listing and "recovered" in listing


def test_recover_with_nothing_to_do(agentflow):
    result = agentflow("recover", "--flow", "tickets", "--app", "agentflow.demo.tickets:app")
    assert result.exit_code == 0
    assert result.stdout.strip() == "no unfinished runs of flow 'tickets'"


def test_recover_reports_paused_runs_and_runs_with_a_principal(agentflow):
    result = agentflow("recover", "refund-1", "refund-2", "--app", APP)
    assert result.exit_code == 1
    assert "refund-1  paused" in result.stdout
    assert "refund-2  needs its principal" in result.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["recover", "--flow", "nope", "--app", APP], "unknown flow 'nope' (this app has: refunds, shipping)"),
        (["recover", "nope", "--app", APP], "no run 'nope' in this store"),
        (["recover", "ship-1", "--app", "runs_kit"], "write it as package.module:attribute"),
        (["recover", "ship-1", "--app", "no_such_module:app"], "cannot import 'no_such_module'"),
        (["recover", "ship-1", "--app", "runs_kit:registry"], "is not a FlowApp"),
        (["resume", "refund-1", "--app", "runs_kit:nothing", "--approve"], "is not a FlowApp"),
    ],
)
def test_unknown_flow_or_bad_app_is_one_line(agentflow, args, says):
    result = agentflow(*args)
    assert result.exit_code == 2
    assert says in one_line_error(result)


def test_resume_approve_finishes_the_run(agentflow):
    # Given refund-1, paused on the refund tool
    result = agentflow("resume", "refund-1", "--app", APP, "--approve", "--note", "checked by Ana")
    # Then the tool ran once and the run is done
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("run refund-1: approved; now done at step 3")
    assert runs_kit.REFUNDS == ["order-1"]
    shown = agentflow("runs", "show", "refund-1").stdout
    assert "status done" in shown and "claim (resume)" in shown and "marks: resumed" in shown


def test_resume_deny_fails_the_run_as_asked(agentflow):
    result = agentflow("resume", "refund-1", "--app", APP, "--deny")
    assert result.exit_code == 0, result.output
    assert "denied; now failed" in result.stdout
    assert runs_kit.REFUNDS == []


def test_resume_a_run_with_a_principal_is_refused_in_one_line(agentflow):
    result = agentflow("resume", "refund-2", "--app", APP, "--approve")
    assert result.exit_code == 2
    assert "acts for a principal" in one_line_error(result)
    assert runs_kit.REFUNDS == []


def test_resume_a_run_that_is_not_paused(agentflow):
    result = agentflow("resume", "order-1", "--app", "agentflow.demo.tickets:app", "--approve")
    assert result.exit_code == 2
    assert "is not paused (done)" in one_line_error(result)


def test_resume_needs_a_decision(agentflow):
    result = agentflow("resume", "refund-1", "--app", APP)
    assert result.exit_code == 2
    assert "say --approve or --deny" in result.stderr


def test_resume_a_run_whose_latest_checkpoint_was_changed_is_refused(agentflow, db):
    runs_kit.tamper(db, "refund-1", 1, find=b"order-1")
    result = agentflow("resume", "refund-1", "--app", APP, "--approve")
    assert result.exit_code == 1
    assert "checkpoint 1 of run 'refund-1': signature does not match" in one_line_error(result)
    assert runs_kit.REFUNDS == []


@pytest.mark.slow
def test_demo_command_tells_the_story_and_how_to_look_at_it(tmp_path):
    script = Path(sys.executable).parent / "agentflow"
    proc = subprocess.run([str(script), "demo", str(tmp_path / "demo")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "killed with SIGKILL" in proc.stdout
    assert f"agentflow viewer --store sqlite:///{tmp_path / 'demo' / 'runs.db'}" in proc.stdout
    # and the key it prints opens the runs it wrote
    env_line = proc.stdout.strip().splitlines()[-1].split()[0]
    assert env_line == "AGENTFLOW_CHECKPOINT_KEYS=" + runs_kit.KEY_TEXT
