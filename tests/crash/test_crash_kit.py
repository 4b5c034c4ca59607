"""Kill a worker at every boundary of the protocol and check what recovery does.

For every point: the run completes after recovery; a call whose ``done`` was stored never
runs again; a call left in doubt either reruns (idempotent tool) or surfaces in
RecoveryNeedsDecision, and after the operator's ``rerun_in_doubt`` the run completes.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from _kit.processes import run_kit
from _kit.stores import setups
from _kit.tickets import NON_IDEMPOTENT, TOOLS, Ledger
from crashkit import POINTS

#: Worker processes SIGKILLed and recovered: seconds each (make check leaves them to make test).
pytestmark = pytest.mark.slow

HERE = Path(__file__).parent


def worker(store: str, ledger: Path, run_id: str, action: str, crash: str | None = None) -> dict[str, Any] | None:
    args = ["--store", store, "--ledger", str(ledger), "--run-id", run_id, "--action", action]
    return run_kit(HERE / "crashkit.py", *args, *(["--crash", crash] if crash else []))


def recover_until_done(store: str, ledger: Path, run_id: str) -> tuple[dict[str, Any], list[list[str]]]:
    """Recover as an operator would: on a decision, check and rerun the calls in doubt."""
    decisions: list[list[str]] = []
    outcome = worker(store, ledger, run_id, "recover")
    assert outcome is not None
    if outcome["outcome"] == "decision":
        decisions = outcome["calls"]
        outcome = worker(store, ledger, run_id, "recover_rerun")
        assert outcome is not None
    return outcome, decisions


def crash_cases() -> list[str]:
    cases = [f"{p}:{t}" for p in POINTS[:5] for t in TOOLS]
    cases += [f"in_save:{n}" for n in range(4)] + [f"between:{n}" for n in range(3)]
    return cases


#: The call each checkpoint of the ticket flow follows (one single-node superstep each).
ENDS_WITH = {1: "hold_seats", 2: "charge_card", 3: "email_tickets"}


def doubted(crash: str) -> str | None:
    """The non-idempotent call a kill at `crash` leaves in doubt, if any.

    Every store writes a lone Call node's ``done`` with the superstep's checkpoint, so a kill
    before that save is a kill before the ``done``: the call ran, its result is not stored.
    """
    point, _, what = crash.partition(":")
    tool = ENDS_WITH.get(int(what)) if point == "in_save" else what
    in_doubt = point in ("after_started", "in_tool", "before_done", "in_save")
    return tool if in_doubt and tool in NON_IDEMPOTENT else None


def check_invariants(
    crash: str, ledger: Ledger, run_id: str, outcome: dict[str, Any], decisions: list[list[str]]
) -> None:
    point, _, tool = crash.partition(":")
    assert outcome["outcome"] == "done", outcome
    assert outcome["sent"] == "mailed Hamlet"
    counts = ledger.counts(run_id)
    # Every tool's effect happened; a non-idempotent one twice only after an explicit decision.
    for name in TOOLS:
        assert counts[name] >= 1, (name, counts)
        if name in NON_IDEMPOTENT and counts[name] > 1:
            assert any(t == name for t, _ in decisions), (name, counts, decisions)
    left = doubted(crash)
    if left is not None:
        assert [t for t, _ in decisions] == [left]
    else:
        assert decisions == []
    if point == "after_done":
        assert counts[tool] == 1  # finished before the crash: replayed, never rerun


def check_boundary(store: str, tmp_path: Path, crash: str) -> None:
    ledger_path = tmp_path / "ledger.jsonl"
    ledger = Ledger(ledger_path)
    # When the worker is SIGKILLed at the boundary
    first = worker(store, ledger_path, "order-1", "run", crash)
    assert first is None, f"the worker should have been killed at {crash}, got {first}"
    if crash == "in_save:0":
        # Then step 0 was never stored: there is no run to recover, and nothing ran
        outcome = worker(store, ledger_path, "order-1", "recover")
        assert outcome is not None and outcome["error"] == "CheckpointNotFound"
        assert ledger.counts() == {}
        return
    if crash == "after_done:email_tickets":
        # Then (the last `done` went with the final checkpoint) the run had ended: nothing to recover
        outcome = worker(store, ledger_path, "order-1", "recover")
        assert outcome is not None and outcome["error"] == "CheckpointConflict" and "ended" in outcome["message"]
        assert ledger.counts("order-1") == {t: 1 for t in TOOLS}
        return
    # Then a new worker process recovers it to the end with the invariants intact
    outcome, decisions = recover_until_done(store, ledger_path, "order-1")
    check_invariants(crash, ledger, "order-1", outcome, decisions)


@pytest.mark.parametrize("crash", crash_cases())
@pytest.mark.parametrize("shared_spec", setups("sqlite"), indirect=True)
def test_sqlite_worker_killed_at_each_boundary_recovers(shared_spec: str, tmp_path: Path, crash: str) -> None:
    # Given a worker process running the ticket flow on SQLite, killed at the boundary
    check_boundary(shared_spec, tmp_path, crash)


SERVER_CASES = [c for c in crash_cases() if c.endswith(":charge_card") or c.startswith(("in_save", "between"))]


@pytest.mark.parametrize("crash", SERVER_CASES)
@pytest.mark.parametrize("shared_spec", setups("redis", "sql-postgres"), indirect=True)
def test_server_store_worker_killed_at_each_boundary_recovers(shared_spec: str, tmp_path: Path, crash: str) -> None:
    # Given worker processes sharing Redis or PostgreSQL, one killed at each boundary of a non-idempotent call
    check_boundary(shared_spec, tmp_path, crash)


def test_random_kills_over_many_runs_keep_the_invariants(tmp_path: Path) -> None:
    # Given many runs, each killed at a random boundary (seeded, so a failure reproduces)
    rng = random.Random(20261129)
    ledger_path = tmp_path / "ledger.jsonl"
    store, ledger = f"sqlite:{tmp_path / 'runs.db'}", Ledger(ledger_path)
    cases = [c for c in crash_cases() if c != "in_save:0"]
    for i in range(12):
        crash = rng.choice(cases)
        run_id = f"order-r{i}"
        assert worker(store, ledger_path, run_id, "run", crash) is None
        # When a worker may itself be killed during recovery (a second crash, sometimes)
        if rng.random() < 0.4:
            second = rng.choice(["between:3", "between:4", "in_save:4", "after_done:email_tickets"])
            worker(store, ledger_path, run_id, "recover_rerun", second)
        outcome, decisions = recover_until_done(store, ledger_path, run_id)
        # Then every run finishes and no finished call ran twice without a decision
        assert outcome["outcome"] in ("done", "error"), outcome
        if outcome["outcome"] == "error":
            assert outcome["error"] == "CheckpointConflict" and "ended" in outcome["message"]
        counts = ledger.counts(run_id)
        assert all(counts[t] >= 1 for t in TOOLS), (crash, counts)
        assert counts["hold_seats"] <= 3
