"""A worker process whose one call waits for a limit: ``python limit_wait_proc.py ACTION STORE LIMITS LEDGER RUN_ID``.

- ``run``: start run RUN_ID of `CHARGE` (one Call node: ``charge``, not idempotent, under
  limit ``api`` of one call in flight); print the outcome as JSON on the last line.
- ``recover``: recover run RUN_ID (waiting out a killed worker's lease), then print the outcome.

STORE is a store spec (`_kit.specs.open_spec`), LIMITS the limits backend's URL. Each run
of ``charge`` appends one line to the file LEDGER (fsynced before the tool returns). The
hub records the run's events into its stream (``Events(record=True)``), as the Celery
workers' hub does: a test reads ``call.waiting`` there to know the call is waiting.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from _kit.leases import KILLED_LEASE_S, once_lapsed
from _kit.specs import open_spec
from pydantic import BaseModel

from agentflow import Call, Events, Executor, Flow, FlowRunner, Registry
from agentflow.exec.checkpoints import RecoveryNeedsDecision
from agentflow.exec.limits import Limit

KEY = b"limit-wait-test-key-0123456789abcdef"
#: What the warm server imports before it forks this script's processes (`_kit.forkserver`): the SQLite
#: store, and the SQL limits backend on SQLite with its driver (the test's two set-ups).
PRELOAD = (
    "agentflow.exec.checkpoints.sqlite",
    "agentflow.exec.limits.sql",
    "sqlalchemy.dialects.sqlite.aiosqlite",
    "aiosqlite",
)
#: The limit the call waits for: one call in flight, on every process sharing the backend.
API = Limit("api", concurrency=1)


class Order(BaseModel):
    order: str = "o-1"
    receipt: str = ""


CHARGE = Flow("charge", state=Order).node("pay", Call("charge", args=lambda s: {"order": s.order}, into="receipt"))
CHARGE = CHARGE.end("pay")


def registry_for(limits: str, ledger: str) -> Registry:
    registry = Registry(limit_backend=limits)
    registry.limit(API)

    @registry.tool(limits=["api"])
    async def charge(order: str) -> str:
        """Charge a card (not idempotent: a second charge is a second payment)."""
        with open(ledger, "a") as fh:
            fh.write(json.dumps([order, os.getpid()]) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        return f"charged {order}"

    return registry


async def work(action: str, store_spec: str, limits: str, ledger: str, run_id: str) -> dict[str, Any]:
    registry = registry_for(limits, ledger)
    store = open_spec(store_spec)
    runner = FlowRunner(
        Executor(registry, events=Events(record=True)), checkpoints=store, checkpoint_key=KEY, lease_s=KILLED_LEASE_S
    )
    try:
        if action == "run":
            result = await runner.run(CHARGE, Order(), run_id=run_id)
        else:
            result = await once_lapsed(lambda: runner.recover(CHARGE, run_id))
    except RecoveryNeedsDecision as exc:
        return {"outcome": "decision", "calls": exc.calls}
    finally:
        await registry.limits.backend.get().aclose()
        await store.aclose()
    return {"outcome": str(result.status), "receipt": result.state.receipt, "rerun": result.rerun}


def main(argv: list[str]) -> None:
    print(json.dumps(asyncio.run(work(*argv[:5]))), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
