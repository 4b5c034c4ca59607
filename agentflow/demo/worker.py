"""A demo worker process: runs or recovers ticket orders and prints its events as JSON lines."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from agentflow import Event, Events, Executor, FlowRunner
from agentflow._errors import RunHeld
from agentflow.demo.tickets import Order, flow, registry
from agentflow.exec.checkpoints import RecoveryNeedsDecision, SQLiteCheckpointStore

#: The demo's key. A real deployment reads its key from a secret store, never from code.
DEMO_KEY = b"agentflow-demo-key-not-for-production!"

#: How long a demo worker's hold on a run lasts unless renewed: short, so the story need not
#: wait long for the lease of the worker it kills (the default is 30 s).
DEMO_LEASE_S = 3.0

SHOWN = ("checkpoint.saved", "tool.started", "tool.finished", "tool.replayed", "run.recovered", "run.paused")


def emit(event: str, **data: Any) -> None:
    """Write one line for the demo's narrator."""
    print(json.dumps({**data, "event": event}, default=str), flush=True)


def on_event(event: Event) -> None:
    """Forward the events the narrator tells about."""
    if event.name in SHOWN:
        emit(event.name, run_id=event.run_id, **event.data)


async def work(db: Path, action: str, run_ids: list[str], rerun: bool) -> None:
    """Run new orders, or recover every unfinished one."""
    store = SQLiteCheckpointStore(db, synchronous="NORMAL")
    executor = Executor(registry, events=Events(record=True))  # the viewer shows each run's events live
    executor.events.subscribe(on_event)
    runner = FlowRunner(executor, checkpoints=store, checkpoint_key=DEMO_KEY, lease_s=DEMO_LEASE_S)
    try:
        if action == "run":
            shows = ["Hamlet", "Tosca", "Cats", "Faust", "Aida"]
            orders = [Order(show=shows[i % len(shows)], seats=2 + i % 3) for i in range(len(run_ids))]
            results = await asyncio.gather(
                *(runner.run(flow, o, run_id=r) for o, r in zip(orders, run_ids, strict=True))
            )
            for res in results:
                emit("result", run_id=res.run_id, status=str(res.status), note=res.state.note)
            return
        outcomes: dict[str, Any] = dict(await runner.recover_all(flow, rerun_in_doubt=rerun))
        for run_id, held in [(r, o) for r, o in outcomes.items() if isinstance(o, RunHeld)]:
            # A live lease: its holder may be alive, or killed and not yet timed out. Wait it out, then try again.
            emit("held", run_id=run_id, owner=held.owner, left=round(max(0.0, held.expires_at - time.time()), 1))
            while True:
                await asyncio.sleep(max(0.05, held.expires_at - time.time() + 0.05))
                try:
                    outcomes[run_id] = await runner.recover(flow, run_id, rerun_in_doubt=rerun)
                except RunHeld as again:  # renewed: its holder is alive after all
                    held = again
                except Exception as exc:
                    outcomes[run_id] = exc
                    break
                else:
                    break
        for run_id, outcome in outcomes.items():
            if isinstance(outcome, RecoveryNeedsDecision):
                emit("decision", run_id=run_id, calls=outcome.calls)
            elif isinstance(outcome, BaseException):
                emit("error", run_id=run_id, error=f"{type(outcome).__name__}: {outcome}")
            else:
                emit("result", run_id=run_id, status=str(outcome.status), note=outcome.state.note)
    finally:
        await store.aclose()


def main(argv: list[str] | None = None) -> None:
    """Parse the command line and work."""
    parser = argparse.ArgumentParser(prog="python -m agentflow.demo.worker")
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("action", choices=["run", "recover"])
    parser.add_argument("run_ids", nargs="*")
    parser.add_argument("--rerun-in-doubt", action="store_true")
    opts = parser.parse_args(argv)
    asyncio.run(work(opts.db, opts.action, opts.run_ids, opts.rerun_in_doubt))


if __name__ == "__main__":
    main(sys.argv[1:])
