"""Cross-process approval kit: a refund flow that pauses for approval, a ledger its tools
write with fsync, a store wrapper that kills the process around a checkpoint save, and
the worker entry point.

The flow: ``refund`` (needs approval; a denial stores ``"denied"``) -> ``notify``.
Checkpoints of one run: step 0 (start), step 1 (paused on refund); a resume saves step 2
(its claim, carrying the decision), then step 3 (after refund) and step 4 (done).

Worker actions (``python approvalkit.py --db PATH --ledger PATH ACTION ...``; the last
line of stdout is JSON, nothing when the process was killed):
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
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from agentflow import Call, Executor, Flow, FlowRunner, Registry
from agentflow.exec.checkpoints import CheckpointConflict, RecoveryNeedsDecision, SQLiteCheckpointStore

KEY = b"approvals-kit-key-0123456789abcdef"
#: The step a resume saves (its claim, with the decision) for a run paused at step 1.
RESUME_STEP = 2


def die() -> None:
    """Die like a worker the kernel killed: no cleanup, no flush, no finally blocks."""
    os.kill(os.getpid(), signal.SIGKILL)


class Ledger:
    """An append-only file of side effects: one fsynced line per tool that really ran."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, tool: str, order: str) -> None:
        with self.path.open("a") as fh:
            fh.write(json.dumps([tool, order]) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def counts(self, tool: str) -> Counter[str]:
        """How often `tool` ran, per order."""
        if not self.path.exists():
            return Counter()
        rows = [json.loads(line) for line in self.path.read_text().splitlines() if line]
        return Counter(order for name, order in rows if name == tool)


class Refund(BaseModel):
    order: str
    amount: int
    outcome: str = ""
    after: str = ""


def build(ledger: Ledger, crash_in: str | None = None) -> tuple[Registry, Flow[Refund]]:
    registry = Registry()

    @registry.tool(approval=True)
    async def refund(order: str, amount: int) -> str:
        """Send money back (not idempotent; always needs approval)."""
        ledger.write("refund", order)
        if crash_in == "refund":
            die()
        return f"refunded {amount} EUR"

    @registry.tool(idempotent=True)
    async def notify(order: str, outcome: str) -> str:
        """Tell the customer what happened."""
        ledger.write("notify", order)
        return f"told {order}: {outcome}"

    def refund_args(r: Refund) -> dict[str, Any]:
        return {"order": r.order, "amount": r.amount}

    def notify_args(r: Refund) -> dict[str, Any]:
        return {"order": r.order, "outcome": r.outcome}

    flow = (
        Flow("refunds", state=Refund)
        .node("refund", Call("refund", args=refund_args, into="outcome", on_deny="denied"))
        .node("notify", Call("notify", args=notify_args, into="after"))
        .edge("refund", "notify")
        .end("notify")
    )
    return registry, flow


def run_ids(count: int) -> list[str]:
    return [f"refund-{i:03d}" for i in range(count)]


class CrashingStore:
    """Wraps a store and kills the process just before or just after one checkpoint save."""

    def __init__(self, inner: Any, point: str | None, what: str | None) -> None:
        self.inner = inner
        self.point = point
        self.what = what
        self.in_process = inner.in_process

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def save(self, run_id: str, step: int, checkpoint: Any) -> None:
        if self.point == "in_save" and str(step) == self.what:
            die()
        await self.inner.save(run_id, step, checkpoint)
        if self.point == "between" and str(step) == self.what:
            die()


def runner_for(db: str, ledger: Ledger, crash: str | None = None) -> tuple[FlowRunner, Flow[Refund], Any]:
    point, _, what = (crash or "").partition(":")
    registry, flow = build(ledger, crash_in=what if point == "in_tool" else None)
    store = CrashingStore(SQLiteCheckpointStore(db), point or None, what or None)
    return FlowRunner(Executor(registry), checkpoints=store, checkpoint_key=KEY), flow, store


def wait_for(paths: list[Path], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(p.exists() for p in paths):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the other racer never reached {paths}")
        time.sleep(0.0005)


async def race(runner: FlowRunner, flow: Flow[Refund], count: int, barrier: Path, who: str) -> dict[str, Any]:
    """Resume every run, meeting the other racer at a barrier file before each one."""
    results: dict[str, list[str]] = {}
    (barrier / f"start.{who}").touch()
    wait_for([barrier / "start.A", barrier / "start.B"])
    for run_id in run_ids(count):
        (barrier / f"{run_id}.{who}").touch()
        wait_for([barrier / f"{run_id}.A", barrier / f"{run_id}.B"])
        try:
            result = await runner.resume(flow, run_id, approve=True)
        except CheckpointConflict as exc:
            results[run_id] = ["conflict", str(exc)]
        except Exception as exc:
            results[run_id] = ["error", f"{type(exc).__name__}: {exc}"]
        else:
            results[run_id] = ["won", str(result.status)]
    return {"results": results}


async def start(runner: FlowRunner, flow: Flow[Refund], count: int) -> dict[str, Any]:
    """Start `count` runs; each pauses on its refund."""
    statuses = {}
    for i, run_id in enumerate(run_ids(count)):
        result = await runner.run(flow, Refund(order=f"order-{i}", amount=10 + i), run_id=run_id)
        statuses[run_id] = [str(result.status), result.step]
    return {"statuses": statuses}


async def act(opts: argparse.Namespace) -> dict[str, Any]:
    ledger = Ledger(Path(opts.ledger))
    runner, flow, store = runner_for(opts.db, ledger, opts.crash)
    try:
        if opts.action == "start":
            return await start(runner, flow, opts.runs)
        if opts.action == "race":
            return await race(runner, flow, opts.runs, Path(opts.barrier), opts.who)
        if opts.action == "resume":
            result = await runner.resume(flow, opts.run_id, approve=not opts.deny)
        else:
            result = await runner.recover(flow, opts.run_id)
    except RecoveryNeedsDecision as exc:
        return {"outcome": "decision", "calls": exc.calls}
    except Exception as exc:
        return {"outcome": "error", "error": type(exc).__name__, "message": str(exc)}
    finally:
        await store.inner.aclose()
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
