"""Cross-process approval kit: the worker entry point of tests/approvals, on the shared kit.

The flow is `_kit.tickets.REFUNDS`: ``refund`` (over 100 needs approval; a denial stores
``"denied"``) -> ``notify`` (or ``apologize`` after a denial). Every run refunds 500 + i, so
each pauses. Its tools write the shared file `Ledger` (fsynced); the store is a
`FaultyStore` that kills the process (SIGKILL) around a checkpoint save.
Checkpoints of one run: step 0 (start), step 1 (paused on refund); a resume saves step 2
(its claim, carrying the decision), then step 3 (after refund) and step 4 (done).

Worker actions (``python approvalkit.py --db PATH --ledger PATH ACTION ...`` with tests/ on
``PYTHONPATH``; the last line of stdout is JSON, nothing when the process was killed):
  start --runs N                           start N runs (``refund-000``, ...); each pauses at step 1
  race --runs N --barrier DIR --who NAME   wait for the other racer, then resume every run
  resume --run-id ID [--deny] [--crash POINT:WHAT]
  recover --run-id ID
Crash points: ``in_save:N`` (killed before step N is stored), ``between:N`` (just after it
is stored), ``in_tool:refund`` (inside refund, after its side effect hit the ledger).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from _kit.faults import FaultyStore
from _kit.leases import KILLED_LEASE_S, once_lapsed
from _kit.tickets import KEY, REFUNDS, Ledger, Refund, make_tickets, sigkill

from agentflow import Executor, FlowRunner
from agentflow.exec.checkpoints import CheckpointConflict, RecoveryNeedsDecision, SQLiteCheckpointStore

#: The step a resume saves (its claim, with the decision) for a run paused at step 1.
RESUME_STEP = 2
#: The first run's refund; run i refunds AMOUNT + i (all over 100: each needs approval).
AMOUNT = 500


def run_ids(count: int) -> list[str]:
    return [f"refund-{i:03d}" for i in range(count)]


def runner_for(db: str, ledger: Ledger, crash: str | None = None) -> tuple[FlowRunner, FaultyStore]:
    point, _, what = (crash or "").partition(":")
    tickets = make_tickets(ledger, die=sigkill)
    if point == "in_tool":
        tickets.crash_in.add(what)
    store = FaultyStore(SQLiteCheckpointStore(db), die=sigkill)
    if point in ("in_save", "between"):
        store.crash("save", step=int(what), when="before" if point == "in_save" else "after")
    runner = FlowRunner(Executor(tickets.registry), checkpoints=store, checkpoint_key=KEY, lease_s=KILLED_LEASE_S)
    return runner, store


def wait_for(paths: list[Path], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(p.exists() for p in paths):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the other racer never reached {paths}")
        time.sleep(0.0005)


async def race(runner: FlowRunner, count: int, barrier: Path, who: str) -> dict[str, Any]:
    """Resume every run, meeting the other racer at a barrier file before each one."""
    results: dict[str, list[str]] = {}
    (barrier / f"start.{who}").touch()
    wait_for([barrier / "start.A", barrier / "start.B"])
    for run_id in run_ids(count):
        (barrier / f"{run_id}.{who}").touch()
        wait_for([barrier / f"{run_id}.A", barrier / f"{run_id}.B"])
        try:
            result = await runner.resume(REFUNDS, run_id, approve=True)
        except CheckpointConflict as exc:
            results[run_id] = ["conflict", str(exc)]
        except Exception as exc:
            results[run_id] = ["error", f"{type(exc).__name__}: {exc}"]
        else:
            results[run_id] = ["won", str(result.status)]
    return {"results": results}


async def start(runner: FlowRunner, count: int) -> dict[str, Any]:
    """Start `count` runs; each pauses on its refund."""
    statuses = {}
    for i, run_id in enumerate(run_ids(count)):
        result = await runner.run(REFUNDS, Refund(amount=AMOUNT + i), run_id=run_id)
        statuses[run_id] = [str(result.status), result.step]
    return {"statuses": statuses}


async def act(opts: argparse.Namespace) -> dict[str, Any]:
    runner, store = runner_for(opts.db, Ledger(opts.ledger), opts.crash)
    try:
        if opts.action == "start":
            return await start(runner, opts.runs)
        if opts.action == "race":
            return await race(runner, opts.runs, Path(opts.barrier), opts.who)
        if opts.action == "resume":
            result = await once_lapsed(lambda: runner.resume(REFUNDS, opts.run_id, approve=not opts.deny))
        else:
            result = await once_lapsed(lambda: runner.recover(REFUNDS, opts.run_id))
    except RecoveryNeedsDecision as exc:
        return {"outcome": "decision", "calls": exc.calls}
    except Exception as exc:
        return {"outcome": "error", "error": type(exc).__name__, "message": str(exc)}
    finally:
        await store.aclose()
    return {"outcome": str(result.status), "state": result.state.model_dump(), "step": result.step}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=["start", "race", "resume", "recover"])
    parser.add_argument("--db", required=True)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--run-id")
    parser.add_argument("--deny", action="store_true")
    parser.add_argument("--crash", default=None)
    parser.add_argument("--runs", type=int, default=0)
    parser.add_argument("--barrier")
    parser.add_argument("--who", choices=["A", "B"])
    opts = parser.parse_args(argv)
    print(json.dumps(asyncio.run(act(opts))), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
