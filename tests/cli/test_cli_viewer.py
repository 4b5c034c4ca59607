"""``agentflow viewer``: the command serves the viewer; its own mistakes are one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import runs_kit
from _kit.ports import free_port
from runs_kit import one_line_error


def test_the_viewer_command_serves_the_runs(url):
    port = free_port()
    env = {
        **os.environ,
        "AGENTFLOW_CHECKPOINT_KEYS": runs_kit.KEY_TEXT,
        **runs_kit.ALLOW_DEMO_KEY,
        "PYTHONPATH": str(Path(runs_kit.__file__).parent),
    }
    script = Path(sys.executable).parent / "agentflow"
    args = [str(script), "viewer", "--store", url, "--port", str(port), "--app", "runs_kit:app"]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline, page = time.monotonic() + 20, ""
        while time.monotonic() < deadline and not page:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/runs/refund-1", timeout=2) as answer:
                    page = answer.read().decode()
            except OSError:
                time.sleep(0.1)
        assert 'name="csrf"' in page and "Approve" in page  # --app given, asked from this machine
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    assert f"agentflow viewer on http://127.0.0.1:{port}/" in err
    assert "Traceback" not in out + err


def test_an_empty_token_variable_is_one_line(agentflow):
    result = agentflow("viewer", "--token-env", "NO_SUCH_TOKEN_VAR")
    assert result.exit_code == 2
    assert "$NO_SUCH_TOKEN_VAR must hold a token" in one_line_error(result)


def test_a_bad_app_for_the_viewer_is_one_line(agentflow):
    result = agentflow("viewer", "--app", "runs_kit:nothing")
    assert result.exit_code == 2
    assert "is not a FlowApp" in one_line_error(result)
