"""Kill a tool-loop worker process at each boundary and check what a new process's recovery does.

Every worker is a real process on one SQLite file (see loopkit.py), killed with SIGKILL.
For every point: a new process finishes the loop with the right history; a tool call
whose ``done`` was stored never runs again; a non-idempotent call left in doubt surfaces
in RecoveryNeedsDecision and runs again only after ``rerun_in_doubt``; the model is
called at most ``max_steps`` times over all the processes together.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _kit.processes import run_kit
from _kit.stores import setups
from _kit.tickets import Ledger
from loopkit import EXPECTED_HISTORY, MAX_STEPS, NON_IDEMPOTENT, TOOLS

#: Worker processes SIGKILLed and recovered: seconds each (make check leaves them to make test).
pytestmark = pytest.mark.slow

HERE = Path(__file__).parent


class Worker:
    """Starts loopkit.py worker processes on one database (or store spec) and ledger."""

    def __init__(self, tmp_path: Path, store: str | None = None) -> None:
        self.db = tmp_path / "loops.db"
        self.store = store
        self.ledger = Ledger(tmp_path / "ledger.jsonl")

    def __call__(
        self, run_id: str, action: str, crash: str | None = None, approver: bool = False
    ) -> dict[str, Any] | None:
        """Run one worker; None if it was killed."""
        args = ["--db", str(self.db), "--ledger", str(self.ledger.path), "--run-id", run_id, "--action", action]
        args += ["--store", self.store] if self.store else []
        args += ["--crash", crash] if crash else []
        args += ["--approver"] if approver else []
        return run_kit(HERE / "loopkit.py", *args)

    def recover_until_done(self, run_id: str, approver: bool = False) -> tuple[dict[str, Any], list[list[str]]]:
        """Recover as an operator would: on a decision, check the calls and rerun them."""
        decisions: list[list[str]] = []
        out = self(run_id, "recover", approver=approver)
        assert out is not None
        if out["outcome"] == "decision":
            decisions = out["calls"]
            out = self(run_id, "recover_rerun", approver=approver)
            assert out is not None
        return out, decisions


CASES = [
    "model:1",
    "model:2",
    "model:3",
    "after_reply:1",
    "after_reply:2",
    "after_started:charge",
    "in_tool:lookup",
    "in_tool:charge",
    "before_done:charge",
    "after_done:charge",
    "in_tool:email",
    "before_done:email",
    "after_done:email",
    "after_tools:1",
    "after_tools:2",
]


def in_doubt(crash: str) -> str | None:
    """The tool a crash leaves in doubt that needs a decision (None: recovery just goes on)."""
    point, _, tool = crash.partition(":")
    if point in ("after_started", "in_tool", "before_done", "in_approver") and tool in NON_IDEMPOTENT:
        return tool
    return None


def check_finished(worker: Worker, run_id: str, crash: str, out: dict[str, Any], decisions: list[list[str]]) -> None:
    point, _, tool = crash.partition(":")
    assert out["outcome"] == "done", out
    assert out["messages"] == EXPECTED_HISTORY
    counts = worker.ledger.counts(run_id)
    for name in TOOLS:
        assert counts[name] >= 1, (name, counts)
        if name in NON_IDEMPOTENT:
            # A non-idempotent tool ran twice only after the operator decided so
            assert counts[name] == 1 or [t for t, _ in decisions] == [name], (name, counts, decisions)
    assert [t for t, _ in decisions] == ([in_doubt(crash)] if in_doubt(crash) else [])
    if point == "after_done":
        assert counts[tool] == 1  # finished before the crash: replayed, never rerun
    # Every model call counts, the one cut off by the crash included, and never past max_steps
    assert counts["model"] <= MAX_STEPS
    assert out["model_calls"] == counts["model"]
    assert counts["model"] == (4 if point == "model" else 3)


@pytest.mark.parametrize("crash", CASES)
def test_loop_worker_killed_at_each_boundary_is_recovered_by_another_process(tmp_path: Path, crash: str) -> None:
    # Given a worker process running the loop on SQLite
    check_boundary(Worker(tmp_path), crash)


@pytest.mark.parametrize(
    "crash",
    ["model:2", "after_reply:1", "after_started:charge", "in_tool:charge", "after_done:charge", "after_tools:1"],
)
@pytest.mark.parametrize("shared_spec", setups("redis", "sql-postgres"), indirect=True)
def test_loop_worker_on_a_server_store_killed_at_a_boundary_is_recovered(
    tmp_path: Path, shared_spec: str, crash: str
) -> None:
    # Given worker processes sharing Redis or PostgreSQL
    check_boundary(Worker(tmp_path, shared_spec), crash)


def check_boundary(worker: Worker, crash: str) -> None:
    # When it is SIGKILLed at the boundary
    first = worker("chat-1", "run", crash)
    assert first is None, f"the worker should have been killed at {crash}, got {first}"
    # Then a new process recovers it to the end with the right history and the invariants intact
    out, decisions = worker.recover_until_done("chat-1")
    check_finished(worker, "chat-1", crash, out, decisions)


def test_recovery_after_a_saved_reply_runs_the_tools_without_asking_the_model_again(tmp_path: Path) -> None:
    # Given a worker killed right after the first reply (with its two tool calls) was saved
    worker = Worker(tmp_path)
    assert worker("chat-1", "run", "after_reply:1") is None
    assert worker.ledger.counts("chat-1") == {"model": 1}
    # When a new process recovers it, and is itself killed right after the tool results are saved
    assert worker("chat-1", "recover", "after_tools:1") is None
    # Then the pinned tool calls ran, and the model was not asked again for the first reply
    assert worker.ledger.counts("chat-1") == {"model": 1, "lookup": 1, "charge": 1}
    out, decisions = worker.recover_until_done("chat-1")
    assert decisions == []
    check_finished(worker, "chat-1", "after_reply:1", out, decisions)


def test_max_steps_holds_when_every_worker_dies_inside_the_model(tmp_path: Path) -> None:
    # Given a loop whose worker dies inside its first model call, again and again on every process
    worker = Worker(tmp_path)
    assert worker("chat-1", "run", "model:1") is None
    for _ in range(MAX_STEPS + 2):
        out = worker("chat-1", "recover", "model:1")
        if out is not None:
            break
    # Then once max_steps model calls were spent the run fails instead of asking once more
    assert out is not None and out["outcome"] == "failed", out
    assert "max_steps" in out["error"]
    assert worker.ledger.counts("chat-1")["model"] == MAX_STEPS
    # And a failed run cannot be recovered again
    again = worker("chat-1", "recover")
    assert again is not None and again["error"] == "CheckpointConflict"
    assert worker.ledger.counts("chat-1")["model"] == MAX_STEPS


@pytest.mark.slow
@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("in_tool:charge", "after_done:charge"),
        ("after_reply:1", "in_tool:email"),
        ("model:1", "after_tools:1"),
    ],
)
def test_a_recovering_worker_killed_again_is_recovered_by_a_third(tmp_path: Path, first: str, second: str) -> None:
    # Given a worker killed at one boundary, and the recovering worker killed at another
    worker = Worker(tmp_path)
    assert worker("chat-1", "run", first) is None
    assert worker("chat-1", "recover_rerun", second) is None
    # When a third process recovers the run
    out, decisions = worker.recover_until_done("chat-1")
    # Then the loop finishes with the right history; max_steps still counts every model call
    assert out["outcome"] == "done", out
    assert out["messages"] == EXPECTED_HISTORY
    counts = worker.ledger.counts("chat-1")
    assert out["model_calls"] == counts["model"] <= MAX_STEPS
    assert counts["lookup"] >= 1 and counts["charge"] >= 1 and counts["email"] >= 1
    if second.startswith("after_done:"):
        assert counts[second.partition(":")[2]] == 2  # rerun once by decision, then replayed, not rerun


def test_worker_killed_while_the_approval_port_waits_leaves_the_call_in_doubt(tmp_path: Path) -> None:
    # Given a loop whose charge call needs approval from a synchronous port
    worker = Worker(tmp_path)
    # When the worker dies while the port is being asked about charge
    assert worker("chat-1", "run", "in_approver:charge", approver=True) is None
    assert worker.ledger.counts("chat-1")["charge"] == 0
    # Then a new process cannot tell whether it was approved and ran: the call is in doubt
    out = worker("chat-1", "recover", approver=True)
    assert out is not None and out["outcome"] == "decision", out
    assert [tool for tool, _ in out["calls"]] == ["charge"]
    # And after the operator's decision the port is asked again and the loop finishes
    out = worker("chat-1", "recover_rerun", approver=True)
    assert out is not None and out["outcome"] == "done", out
    assert out["messages"] == EXPECTED_HISTORY
    assert worker.ledger.counts("chat-1")["charge"] == 1
