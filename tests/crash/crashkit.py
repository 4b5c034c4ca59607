"""The worker process of the crash tests: the ticket flow (`_kit.tickets`) on a store that kills
the process at a chosen boundary of the protocol (`_kit.faults.FaultyStore`).

Boundaries (``--crash POINT[:WHAT]``):
  before_started:TOOL   killed just before TOOL's ``started`` record reaches the store
  after_started:TOOL    killed just after it is stored (the tool has not run)
  in_tool:TOOL          killed inside TOOL, after its side effect hit the ledger
  before_done:TOOL      killed after TOOL ran, before its ``done`` record is stored
  after_done:TOOL       killed just after ``done`` is stored
  in_save:N             killed before checkpoint step N is stored
  between:N             killed just after checkpoint step N is stored (between supersteps)
The kill is SIGKILL to the worker's own process: no cleanup, no flush, no finally blocks.
Every store writes a lone Call node's ``done`` together with its checkpoint
(``save_after_calls``), so those boundaries fold together: before that one write is before
the ``done`` and before the save; after it is after both.

Run as ``python crashkit.py --store SPEC --ledger PATH --run-id ID --action ACTION`` with tests/
on ``PYTHONPATH`` (`_kit.specs.child_env`); the last line of stdout is a JSON outcome. The tests
fork it from a warm server instead (`_kit.forkserver`), which calls `main`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from _kit.faults import FaultyStore
from _kit.leases import KILLED_LEASE_S, once_lapsed
from _kit.specs import BACKENDS, open_spec
from _kit.tickets import KEY, ORDER, TICKETS, Ledger, make_tickets, sigkill

from agentflow import Executor, FlowRunner
from agentflow.exec.checkpoints import RecoveryNeedsDecision

#: What the warm server imports before it forks this script's processes (`_kit.forkserver`).
PRELOAD = BACKENDS
POINTS = ("before_started", "after_started", "in_tool", "before_done", "after_done", "in_save", "between")


def arm(store: FaultyStore, point: str, what: str) -> None:
    """Make `store` kill the process at the boundary ``point:what`` (``in_tool`` is the tool's own)."""
    if point in ("before_started", "after_started", "before_done", "after_done"):
        when, kind = point.split("_")
        store.crash(kind, tool=what, when=when)
    elif point in ("in_save", "between"):
        store.crash("save", step=int(what), when="before" if point == "in_save" else "after")


async def act(runner: FlowRunner, action: str, run_id: str) -> dict[str, Any]:
    try:
        if action == "run":
            result = await runner.run(TICKETS, ORDER, run_id=run_id)
        else:
            rerun = action == "recover_rerun"
            result = await once_lapsed(lambda: runner.recover(TICKETS, run_id, rerun_in_doubt=rerun))
    except RecoveryNeedsDecision as exc:
        return {"outcome": "decision", "calls": exc.calls}
    except Exception as exc:
        return {"outcome": "error", "error": type(exc).__name__, "message": str(exc)}
    state = result.state
    return {"outcome": str(result.status), "sent": state.sent, "replayed": result.replayed, "rerun": result.rerun}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--action", choices=["run", "recover", "recover_rerun"], required=True)
    parser.add_argument("--crash", default=None)
    opts = parser.parse_args(argv)
    point, _, what = (opts.crash or "").partition(":")
    tickets = make_tickets(Ledger(opts.ledger), die=sigkill)
    if point == "in_tool":
        tickets.crash_in.add(what)
    store = FaultyStore(open_spec(opts.store), die=sigkill)
    arm(store, point, what)
    runner = FlowRunner(Executor(tickets.registry), checkpoints=store, checkpoint_key=KEY, lease_s=KILLED_LEASE_S)

    async def go() -> dict[str, Any]:
        try:
            return await act(runner, opts.action, opts.run_id)
        finally:
            await store.aclose()

    print(json.dumps(asyncio.run(go())), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
