"""`make demo` tells the crash-and-recovery story end to end."""

import subprocess
import sys


def test_demo_kills_a_worker_and_every_run_finishes_with_each_effect_once(tmp_path):
    # Given a fresh folder, when the demo runs
    proc = subprocess.run(
        [sys.executable, "-m", "agentflow.demo", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout
    # Then it says which mode it runs in, first
    assert out.splitlines()[0].startswith("agentflow demo, embedded mode"), out
    # and a worker was killed mid-mail, the call surfaced in doubt, and was decided
    assert "killed with SIGKILL while order-2 was sending its mail" in out
    assert "NEEDS A DECISION, in doubt: email_tickets" in out
    assert "order-2: done: tickets for Tosca sent" in out
    # and the ledger shows every effect exactly once (the demo's exit code checks it too)
    assert proc.returncode == 0, out + proc.stderr
    for run in ("order-1", "order-2", "order-3"):
        assert f"  {run:<10}{1:>12}{1:>13}{1:>15}" in out
    # and it ends with how to inspect what just happened
    assert "agentflow viewer --store sqlite:///" in out.strip().splitlines()[-1]
