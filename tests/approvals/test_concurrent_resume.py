"""Resuming paused runs from real processes on one SQLite file.

- Two processes resume the same paused runs at the same moment, fifty times over: the
  store's compare-and-set lets exactly one resume win each run; the tool runs once.
- A process killed around the resume's save: before it, the run is still paused and
  resumable; after it, the decision is stored and `recover` spends it (the tool runs once).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _kit.forkpopen import spawn
from _kit.processes import run_kit
from _kit.tickets import Ledger
from approvalkit import RESUME_STEP, run_ids

#: Worker processes started, frozen or killed: seconds each (make check leaves them to make test).
pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
#: The worker script: each of its processes is forked from its warm server (`_kit.forkserver`).
KIT = HERE / "approvalkit.py"
RUNS = 50


class Kit:
    """Starts approvalkit.py worker processes on one database and ledger (forked warm: `_kit.forkserver`)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.db = tmp_path / "runs.db"
        self.ledger = Ledger(tmp_path / "ledger.jsonl")

    def ran(self, tool: str) -> Counter[str]:
        """How often `tool`'s effect happened, per run."""
        return Counter({run_id: n for (name, run_id), n in self.ledger.by_run().items() if name == tool})

    def args(self, action: str, *args: str) -> list[str]:
        return [action, "--db", str(self.db), "--ledger", str(self.ledger.path), *args]

    def __call__(self, action: str, *args: str) -> dict[str, Any] | None:
        """Run one worker to its end; None if it was killed."""
        return run_kit(KIT, *self.args(action, *args), timeout_s=60)

    def start(self, runs: int) -> None:
        out = self("start", "--runs", str(runs))
        assert out is not None
        assert {tuple(v) for v in out["statuses"].values()} == {("paused", 1)}, out


@pytest.mark.slow
def test_two_processes_resuming_the_same_paused_runs_exactly_one_wins_each_time(tmp_path: Path) -> None:
    # Given 50 runs on one SQLite file, each paused for the approval of its refund
    kit = Kit(tmp_path)
    kit.start(RUNS)
    assert kit.ran("refund") == Counter()
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    # When two processes start together and each resumes every run, meeting at a barrier before each one
    began = time.monotonic()
    racers = {
        who: spawn(KIT, kit.args("race", "--runs", str(RUNS), "--barrier", str(barrier), "--who", who))
        for who in ("A", "B")
    }
    outs = {}
    for who, racer in racers.items():
        stdout = racer.stdout.read()
        assert racer.wait(timeout=90) == 0, racer.stderr_text()
        racer.close()
        outs[who] = json.loads(stdout.strip().splitlines()[-1])["results"]
    elapsed = time.monotonic() - began
    # Then every time exactly one resume won and the other got CheckpointConflict
    lost_at_claim = 0
    for run_id in run_ids(RUNS):
        pair = sorted([outs["A"][run_id], outs["B"][run_id]])
        assert [kind for kind, _ in pair] == ["conflict", "won"], (run_id, pair)
        assert pair[1][1] == "done", (run_id, pair)
        # "not paused": the loser read the run after the winner's claim; anything else: both read it
        # paused and the store's compare-and-set refused the loser's claim
        lost_at_claim += "not paused" not in pair[0][1]
    # And each run's refund ran exactly once (its notify too)
    assert kit.ran("refund") == Counter({run_id: 1 for run_id in run_ids(RUNS)})
    assert kit.ran("notify") == Counter({run_id: 1 for run_id in run_ids(RUNS)})
    wins = {who: sum(kind == "won" for kind, _ in outs[who].values()) for who in outs}
    print(f"{RUNS} races in {elapsed:.1f}s; wins {wins}; decided by the claim's compare-and-set: {lost_at_claim}")
    # And the race was real: at least once both resumes read the run paused and the store picked one
    assert lost_at_claim >= 1


def test_process_killed_before_the_resume_save_leaves_the_run_paused_and_resumable(tmp_path: Path) -> None:
    # Given a run paused for the approval of its refund
    kit = Kit(tmp_path)
    kit.start(1)
    [run_id] = run_ids(1)
    # When the process resuming it is killed just before the resume's save
    assert kit("resume", "--run-id", run_id, "--crash", f"in_save:{RESUME_STEP}") is None
    # Then nothing ran, and the run is still paused (recover hands it back as paused)
    assert kit.ran("refund") == Counter()
    out = kit("recover", "--run-id", run_id)
    assert out is not None and (out["outcome"], out["step"]) == ("paused", 1), out
    # And another process can resume it: the refund runs once
    out = kit("resume", "--run-id", run_id)
    assert out is not None and out["outcome"] == "done", out
    assert out["state"]["outcome"] == "refunded 500"
    assert kit.ran("refund") == Counter({run_id: 1})


@pytest.mark.parametrize(
    ("deny", "outcome", "after", "refunds"),
    [(False, "refunded 500", "notified 500", 1), (True, "denied", "apologized 500", 0)],
    ids=["approved", "denied"],
)
def test_process_killed_after_the_resume_save_is_recovered_by_spending_the_stored_decision(
    tmp_path: Path, deny: bool, outcome: str, after: str, refunds: int
) -> None:
    # Given a run paused for the approval of its refund
    kit = Kit(tmp_path)
    kit.start(1)
    [run_id] = run_ids(1)
    # When the process resuming it is killed just after the resume's save (the decision is stored)
    args = ["--run-id", run_id, "--crash", f"between:{RESUME_STEP}"] + (["--deny"] if deny else [])
    assert kit("resume", *args) is None
    assert kit.ran("refund") == Counter()
    # Then the decision is taken: a second resume (maybe with another decision) is a conflict
    again = kit("resume", "--run-id", run_id, *([] if deny else ["--deny"]))
    assert again is not None and again["error"] == "CheckpointConflict", again
    # And a new process's recover spends the stored decision: the refund ran once if approved, never if denied
    out = kit("recover", "--run-id", run_id)
    assert out is not None and out["outcome"] == "done", out
    assert out["state"]["outcome"] == outcome
    assert out["state"]["after"] == after
    assert kit.ran("refund") == (Counter({run_id: refunds}) if refunds else Counter())


def test_process_killed_inside_the_approved_tool_leaves_the_call_in_doubt(tmp_path: Path) -> None:
    # Given a run paused for the approval of its refund
    kit = Kit(tmp_path)
    kit.start(1)
    [run_id] = run_ids(1)
    # When the process that approved it dies inside the refund (the money may have gone out)
    assert kit("resume", "--run-id", run_id, "--crash", "in_tool:refund") is None
    assert kit.ran("refund") == Counter({run_id: 1})
    # Then recovery does not rerun it on its own: the operator has to decide
    out = kit("recover", "--run-id", run_id)
    assert out is not None and out["outcome"] == "decision", out
    assert [tool for tool, _ in out["calls"]] == ["refund"]
    assert kit.ran("refund") == Counter({run_id: 1})
