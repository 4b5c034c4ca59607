"""`make example` runs the agent fleet example (examples/agent_fleet) end to end, through real processes."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.celery
@pytest.mark.redis
@pytest.mark.timeout(150)
def test_make_example_kills_a_worker_in_the_charge_and_the_decided_run_charges_once(redis_url: str) -> None:
    # Given this test's Redis, and the interpreter running the tests as the make target's (not rebuilt)
    env = {**os.environ, "AGENTFLOW_REDIS_URL": redis_url}
    stamp = f"{sys.prefix}/.installed-stamp"

    # When `make example` runs: workers (one with beat) and Flower from the example's app module
    made = subprocess.run(
        ["make", "--no-print-directory", "-o", stamp, "example", f"VENV={sys.prefix}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=140,
    )
    out = made.stdout

    # Then it succeeds: a worker was killed inside the charge, the run parked on the charge in doubt,
    assert made.returncode == 0, out + made.stderr
    assert "inside the charge tool" in out, out
    assert "parked" in out and "charge(" in out and "in doubt" in out, out
    # the operator decided it happened through the workers, with the charge's result,
    assert "$ agentflow decide order-A1-" in out and "=happened:" in out, out
    # and both runs finished with the right output, each order charged exactly once
    assert "done: 'Done: charged 90 EUR for A1.'" in out, out
    assert "done: 'Done: charged 35 EUR for B2.'" in out, out
    assert "charges per order: {'A1': 1, 'B2': 1}" in out, out
    # and the example left no key behind
    client = redis.Redis.from_url(redis_url)
    try:
        assert list(client.scan_iter(match="fleet*")) == []
    finally:
        client.close()
