"""Kill a durable pydantic-ai agent's worker process at each boundary and check what a new process does.

Every worker is a real process (agentkit.py) on one SQLite file, or on Redis or PostgreSQL,
killed with SIGKILL. For every point: a new process finishes the run with the output an
uninterrupted run gives; ``charge`` never runs twice on its own (cut off, it parks the run
until an operator decides); a finished call is replayed, never rerun; a model request cut off
is made again; the model is asked at most ``MAX_REQUESTS`` times over every process together.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest
from _kit.agents import EXPECTED, MAX_REQUESTS, NON_IDEMPOTENT, REQUESTS, TOOLS
from _kit.processes import run_kit
from _kit.stores import setups
from _kit.tickets import Ledger

#: Worker processes SIGKILLed and recovered: seconds each (make check leaves them to make test).
pytestmark = pytest.mark.slow

HERE = Path(__file__).parent


class Worker:
    """Starts agentkit.py worker processes on one database (or store spec) and ledger."""

    def __init__(self, tmp_path: Path, store: str | None = None) -> None:
        self.db = tmp_path / "agents.db"
        self.store = store
        self.ledger = Ledger(tmp_path / "ledger.jsonl")

    def __call__(self, run_id: str, action: str, crash: str | None = None) -> dict[str, Any] | None:
        """Run one worker; None if it was killed."""
        args = ["--db", str(self.db), "--ledger", str(self.ledger.path), "--run-id", run_id, "--action", action]
        args += ["--store", self.store] if self.store else []
        args += ["--crash", crash] if crash else []
        return run_kit(HERE / "agentkit.py", *args)


CASES = [
    "model:1",
    "model:2",
    "model:3",
    "after_reply:1",
    "after_reply:2",
    "after_reply:3",
    "after_started:lookup_order",
    "in_tool:lookup_order",
    "after_started:charge",
    "in_tool:charge",
    "before_done:charge",
    "after_done:charge",
    "after_tools:1",
    "after_tools:2",
]


def in_doubt(crash: str) -> str | None:
    """The tool a crash leaves in doubt that needs a decision (None: recovery just goes on)."""
    point, _, tool = crash.partition(":")
    if point in ("after_started", "in_tool", "before_done") and tool in NON_IDEMPOTENT:
        return tool
    return None


def check_done(worker: Worker, run_id: str, out: dict[str, Any]) -> None:
    """The run reached the uninterrupted run's output, no tool ran twice, the model budget held."""
    assert out["outcome"] == "done", out
    assert out["output"] == EXPECTED.model_dump()
    counts = worker.ledger.counts(run_id)
    for name in TOOLS:
        assert counts[name] == 1 if name in NON_IDEMPOTENT else counts[name] >= 1, (name, counts)
    assert out["model_calls"] == counts["model"] <= MAX_REQUESTS


@pytest.mark.parametrize("crash", CASES)
def test_agent_worker_killed_at_each_boundary_finishes_with_the_same_output(tmp_path: Path, crash: str) -> None:
    # Given a worker process running the agent on SQLite, SIGKILLed at the boundary
    worker = Worker(tmp_path)
    assert worker("order-1", "run", crash) is None, f"the worker should have been killed at {crash}"
    point, _, tool = crash.partition(":")
    # When a new process recovers it
    out = worker("order-1", "recover")
    assert out is not None
    if in_doubt(crash):
        # Then a cut-off charge is never rerun on its own: the run waits for a decision
        assert out["outcome"] == "decision", out
        assert [name for name, _ in out["calls"]] == ["charge"]
        assert worker.ledger.counts("order-1")["charge"] == (0 if point == "after_started" else 1)
        # And once an operator says what happened (it ran: its result; it did not: rerun), the run ends as an
        # uninterrupted one, with charge run exactly once
        out = worker("order-1", "operator")
        assert out is not None
        check_done(worker, "order-1", out)
        return
    check_done(worker, "order-1", out)
    if point == "model":  # the request cut off was made again, and counted
        assert worker.ledger.counts("order-1")["model"] == REQUESTS + 1
    if point == "after_done":
        assert worker.ledger.counts("order-1")[tool] == 1  # finished before the crash: replayed


@pytest.mark.parametrize("crash", ["model:2", "in_tool:charge", "after_done:charge", "after_tools:1"])
@pytest.mark.parametrize("shared_spec", setups("redis", "sql-postgres"), indirect=True)
def test_agent_worker_on_a_server_store_killed_at_a_boundary_finishes(
    tmp_path: Path, shared_spec: str, crash: str
) -> None:
    # Given worker processes sharing Redis or PostgreSQL, the first SIGKILLed at the boundary
    worker = Worker(tmp_path, shared_spec)
    assert worker("order-1", "run", crash) is None
    # When a new process recovers it (an operator deciding a cut-off charge, where asked)
    out = worker("order-1", "operator")
    # Then it ends with the uninterrupted run's output and charge ran at most once
    assert out is not None
    check_done(worker, "order-1", out)


def test_a_recovering_worker_killed_again_is_recovered_by_a_third(tmp_path: Path) -> None:
    # Given a worker killed inside the second model request, and its recoverer killed inside charge
    worker = Worker(tmp_path)
    assert worker("order-1", "run", "model:2") is None
    assert worker("order-1", "recover", "in_tool:charge") is None
    # When a third process recovers it, an operator deciding the cut-off charge
    out = worker("order-1", "operator")
    # Then the run ends as an uninterrupted one: charge ran once, the model was asked once per cut-off more
    assert out is not None
    check_done(worker, "order-1", out)
    assert worker.ledger.counts("order-1")["model"] == REQUESTS + 1


#: SIGKILLs of the random test (`make soak` sets AGENT_KILLS for the long form).
RANDOM_KILLS = int(os.environ.get("AGENT_KILLS", "12"))


def test_random_kills_never_run_a_finished_or_cut_off_charge_again(tmp_path: Path) -> None:
    # Given runs whose workers are SIGKILLed at random boundaries, again and again, until RANDOM_KILLS died
    rng = random.Random(int(os.environ.get("AGENT_SEED", "20261204")))
    worker = Worker(tmp_path)
    kills = runs = 0
    while kills < RANDOM_KILLS:
        run_id, action, out = f"order-{runs}", "run", None
        seen: list[tuple[str | None, dict[str, Any] | None]] = []
        while out is None or out["outcome"] != "done":
            assert out is None or out["outcome"] == "running", seen  # a kill or a stage limit; nothing else
            crash = rng.choice(CASES) if kills < RANDOM_KILLS and rng.random() < 0.7 else None
            out = worker(run_id, action, crash)
            seen.append((crash, out))
            kills += out is None
            action = "operator"  # every later process recovers; an operator decides a cut-off charge
        # Then every run ends with the uninterrupted output, and no effect ran twice
        check_done(worker, run_id, out)
        runs += 1
    print(f"{kills} kills over {runs} runs: every run done, charge once each")
