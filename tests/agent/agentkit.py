"""The crash kit for durable pydantic-ai agents: the worker entry point around the shared order agent.

The agent and its conversation are `_kit.agents` (the order agent: ``lookup_order``, idempotent,
``charge``, not, a `Receipt` output); here a worker process runs or recovers one of its runs and
may die at a boundary.

Boundaries (``--crash POINT[:WHAT]``), each a SIGKILL of the worker's own process:
  model:N               inside the Nth model request of this process (after it hit the ledger)
  after_reply:N         just after this process saved its Nth response checkpoint (stage ``model``)
  after_started:TOOL    just after TOOL's ``started`` record is stored (the tool has not run)
  in_tool:TOOL          inside TOOL, after its effect hit the ledger
  before_done:TOOL      after TOOL ran, before its ``done`` record is stored
  after_done:TOOL       just after TOOL's ``done`` record is stored
  after_tools:N         just after this process saved its Nth tool-results checkpoint

Run as ``python agentkit.py --db PATH --ledger PATH --run-id ID --action ACTION`` with tests/ on
``PYTHONPATH`` (`_kit.specs.child_env`); the last line of stdout is a JSON outcome (nothing is
printed when the process was killed). The tests fork it from a warm server instead
(`_kit.forkserver`), which calls `main`. Actions: ``run``, ``recover``, ``recover_rerun`` (every call in
doubt reruns), ``operator`` (recover; where a cut-off charge needs a decision, an operator looks at the
ledger as at the card's statement: `Happened` with the tool's result if it ran, else `Rerun`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import Counter
from typing import Any

from _kit.agents import PROMPT, Receipt, charge_result, durable, make_agent
from _kit.faults import FaultyStore
from _kit.leases import KILLED_LEASE_S, once_lapsed
from _kit.specs import BACKENDS, open_spec
from _kit.tickets import Ledger, sigkill

from agentflow import Events, Happened, Rerun
from agentflow.exec.checkpoints import RecoveryNeedsDecision, SQLiteCheckpointStore
from agentflow.integrations.pydantic_ai import AgentResult

#: What the warm server imports before it forks this script's processes (`_kit.forkserver`): the
#: store backends, and what pydantic-ai imports in its first run.
PRELOAD = (*BACKENDS, "anyio._backends._asyncio", "genai_prices.data")
KEY = b"agent-crash-kit-key-0123456789abcdef"


def outcome(result: AgentResult) -> dict[str, Any]:
    output = result.output.model_dump() if isinstance(result.output, Receipt) else result.output
    return {
        "outcome": str(result.status),
        "output": output,
        "model_calls": result.model_calls,
        "replayed": result.replayed,
        "rerun": result.rerun,
        "error": result.error,
    }


def arm(store: FaultyStore, events: Events, point: str, what: str) -> None:
    """Make the process die at a call-log boundary, or right after its Nth checkpoint of a stage."""
    if point in ("after_started", "before_done", "after_done"):
        when, kind = point.split("_")
        store.crash(kind, tool=what, when=when)
    if point in ("after_reply", "after_tools"):
        stage = {"after_reply": "model", "after_tools": "tools"}[point]
        seen = Counter[str]()

        def on_event(event: Any) -> None:
            if event.name == "checkpoint.saved" and event.data.get("stage") == stage:
                seen[stage] += 1
                if seen[stage] == int(what):
                    sigkill("after a checkpoint")

        events.subscribe(on_event)


async def act(opts: argparse.Namespace) -> dict[str, Any]:
    point, _, what = (opts.crash or "").partition(":")
    ledger = Ledger(opts.ledger)
    agent = make_agent(
        ledger,
        die_in_model=int(what) if point == "model" else None,
        die_in=what if point == "in_tool" else None,
    )
    inner = open_spec(opts.store) if opts.store else SQLiteCheckpointStore(opts.db)
    store = FaultyStore(inner, die=sigkill)
    events = Events()
    arm(store, events, point, what)
    runner = durable(agent).runner(store, KEY, events=events, lease_s=KILLED_LEASE_S)
    try:
        if opts.action == "run":
            result = await runner.run(PROMPT, run_id=opts.run_id)
        elif opts.action == "operator" and (ended := await runner.read(opts.run_id)).status in ("done", "failed"):
            result = ended  # the operator looks first: a worker killed after its last save left it ended
        elif opts.action == "operator":
            try:
                result = await once_lapsed(lambda: runner.recover(opts.run_id))
            except RecoveryNeedsDecision as exc:  # charge was cut off: the operator checks the card's ledger
                assert [tool for tool, _ in exc.calls] == ["charge"], exc.calls
                charged = ledger.counts(opts.run_id)["charge"] > 0
                decision = Happened(charge_result("A1", 90)) if charged else Rerun()
                calls = {call_id: decision for call_id in exc.call_ids}
                await runner.decide_in_doubt(opts.run_id, calls=calls, operator="kit")
                result = await once_lapsed(lambda: runner.recover(opts.run_id))
        else:
            rerun = opts.action == "recover_rerun"
            result = await once_lapsed(lambda: runner.recover(opts.run_id, rerun_in_doubt=rerun))
    except RecoveryNeedsDecision as exc:
        return {"outcome": "decision", "calls": exc.calls, "call_ids": exc.call_ids}
    except Exception as exc:
        return {"outcome": "error", "error": type(exc).__name__, "message": str(exc)}
    finally:
        await store.aclose()
    return outcome(result)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--store", default=None, help="a store spec (_kit.specs.open_spec) instead of --db")
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--action", choices=["run", "recover", "recover_rerun", "operator"], required=True)
    parser.add_argument("--crash", default=None)
    opts = parser.parse_args(argv)
    print(json.dumps(asyncio.run(act(opts))), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
