"""`make demo` tells the crash-and-recovery story end to end, embedded and over Celery on Redis."""

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

RUNS = ("order-1", "order-2", "order-3")


def _demo(
    cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run the demo as `make demo` does: from `cwd`, its files in the default, relative ``demo-runs``."""
    return subprocess.run(
        [sys.executable, "-m", "agentflow.demo", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
    )


def _assert_each_effect_once(proc: subprocess.CompletedProcess[str]) -> None:
    out = proc.stdout
    # the ledger shows every effect exactly once (the demo's exit code checks it too)
    assert proc.returncode == 0, out + proc.stderr
    for run in RUNS:
        assert f"  {run:<10}{1:>12}{1:>13}{1:>15}" in out, out


def test_demo_kills_a_worker_and_every_run_finishes_with_each_effect_once(tmp_path: Path) -> None:
    # Given a fresh folder, when the embedded demo runs
    proc = _demo(tmp_path, "--embedded")
    out = proc.stdout
    # Then it says which mode it runs in, and why, first
    assert out.splitlines()[0].startswith("agentflow demo, embedded mode"), out
    assert "--embedded was given" in out.splitlines()[0]
    # and a worker was killed mid-mail, the call surfaced in doubt, and was decided
    assert "killed with SIGKILL while order-2 was sending its mail" in out
    assert "NEEDS A DECISION, in doubt: email_tickets" in out
    assert "order-2: done: tickets for Tosca sent" in out
    _assert_each_effect_once(proc)
    # and it ends with how to inspect what just happened
    assert "agentflow viewer --store sqlite:///" in out.strip().splitlines()[-1]


@pytest.mark.celery
@pytest.mark.redis
@pytest.mark.timeout(180)
def test_distributed_demo_kills_a_celery_worker_and_every_run_finishes(
    tmp_path: Path, redis_url: str, unique_prefix: Callable[[], str]
) -> None:
    # Given Redis and a key prefix of this test's own (never the user's demo keys)
    prefix = f"{unique_prefix()}-demo"
    env = {**os.environ, "AGENTFLOW_REDIS_URL": redis_url, "AGENTFLOW_DEMO_PREFIX": prefix}
    client = redis.Redis.from_url(redis_url)
    try:
        # When the distributed demo runs
        proc = _demo(tmp_path, "--distributed", env=env, timeout=150)
        out = proc.stdout
        # Then it says which mode it runs in, on which Redis, first
        assert out.splitlines()[0].startswith("agentflow demo, distributed mode: Celery workers on Redis at "), out
        # and the worker holding order-2 was killed mid-mail, a fresh worker recovered the run,
        assert "killed with SIGKILL while order-2 was sending its mail" in out, out + proc.stderr
        assert "A fresh worker C starts" in out
        # the call in doubt waited for a decision, which was taken, and every run finished
        assert "order-2: picked up by recovery: NEEDS A DECISION, in doubt: email_tickets" in out
        assert "FlowClient.decide_in_doubt('order-2', operator='demo')" in out
        assert "email_tickets done: tickets for Tosca sent, rerun after recovery" in out
        _assert_each_effect_once(proc)
        # and it ends with how to inspect what just happened, on the demo's keys
        lines = out.strip().splitlines()
        assert f"agentflow runs show order-2 --store '{redis_url}?prefix={prefix}'" in lines[-2]
        assert f"agentflow viewer --store '{redis_url}?prefix={prefix}' --app agentflow.demo.tickets:app" in lines[-1]
        # and only the runs stay in Redis (no queue, lease or decision left behind), beside markers that
        # lapse by themselves (a recovery sent for order-2 is remembered for a back-off's length)
        left = {k.decode() for k in client.scan_iter(match=f"{prefix}:*")}
        markers = {k for k in left if k.startswith(f"{prefix}:marker:")}
        assert all(client.pttl(k) > 0 for k in markers), {k: client.pttl(k) for k in markers}
        assert left - markers and all(k.startswith((f"{prefix}:run:", f"{prefix}:runs")) for k in left - markers), left
    finally:
        keys = list(client.scan_iter(match=f"{prefix}:*"))
        if keys:
            client.delete(*keys)
        client.close()
