"""The crash-test kit: a ticket flow whose tools keep a ledger, a store wrapper that kills
the process at a chosen boundary of the protocol, and the worker entry point.

Boundaries (``--crash POINT[:WHAT]``):
  before_started:TOOL   killed just before TOOL's ``started`` record reaches the store
  after_started:TOOL    killed just after it is stored (the tool has not run)
  in_tool:TOOL          killed inside TOOL, after its side effect hit the ledger
  before_done:TOOL      killed after TOOL ran, before its ``done`` record is stored
  after_done:TOOL       killed just after ``done`` is stored
  in_save:N             killed before checkpoint step N is stored
  between:N             killed just after checkpoint step N is stored (between supersteps)
The kill is SIGKILL to the worker's own process: no cleanup, no flush, no finally blocks.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from agentflow import Call, Executor, Flow, FlowRunner, Registry
from agentflow.exec.checkpoints import RecoveryNeedsDecision, idempotency_key

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from storespec import make_store

KEY = b"crash-kit-key-0123456789abcdef-01"
TOOLS = ("hold_seats", "charge_card", "email_tickets")
POINTS = ("before_started", "after_started", "in_tool", "before_done", "after_done", "in_save", "between")


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class Ledger:
    """An append-only file of side effects: one line per tool that really ran."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, tool: str, run_id: str, key: str) -> None:
        with self.path.open("a") as fh:
            fh.write(json.dumps([tool, run_id, key]) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def entries(self) -> list[tuple[str, str, str]]:
        if not self.path.exists():
            return []
        return [tuple(json.loads(line)) for line in self.path.read_text().splitlines() if line]  # type: ignore[misc]

    def counts(self, run_id: str | None = None) -> Counter[str]:
        return Counter(t for t, r, _ in self.entries() if run_id is None or r == run_id)


class Order(BaseModel):
    show: str
    seats: int
    note: str = ""


def build(ledger: Ledger, crash_in: str | None = None) -> tuple[Registry, Flow[Order]]:
    registry = Registry()

    def effect(tool: str) -> str:
        from agentflow.exec import current_call

        info = current_call()
        ledger.write(tool, info.run_id, idempotency_key())
        if crash_in == tool:
            die()
        return f"{tool} ok"

    @registry.tool(idempotent=True)
    async def hold_seats(show: str, seats: int) -> str:
        return effect("hold_seats")

    @registry.tool
    async def charge_card(show: str, seats: int) -> str:
        return effect("charge_card")

    @registry.tool
    def email_tickets(show: str) -> str:
        return effect("email_tickets")

    def args(order: Order) -> dict[str, Any]:
        return {"show": order.show, "seats": order.seats}

    flow = (
        Flow("tickets", state=Order)
        .node("hold", Call("hold_seats", args=args, into="note"))
        .node("pay", Call("charge_card", args=args, into="note"))
        .node("send", Call("email_tickets", args=lambda o: {"show": o.show}, into="note"))
        .edge("hold", "pay")
        .edge("pay", "send")
        .end("send")
    )
    return registry, flow


class CrashingStore:
    """Wraps a store and kills the process at one boundary; otherwise passes through."""

    def __init__(self, inner: Any, point: str | None, what: str | None, kill: Any = die) -> None:
        self.inner = inner
        self.point = point
        self.what = what
        self.kill = kill
        self.in_process = inner.in_process
        self._tool_of: dict[str, str] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def save(self, run_id: str, step: int, checkpoint: Any) -> None:
        if self.point == "in_save" and str(step) == self.what:
            self.kill()
        await self.inner.save(run_id, step, checkpoint)
        if self.point == "between" and str(step) == self.what:
            self.kill()

    async def record_call(self, run_id: str, record: Any) -> None:
        self._at_record("before", record)
        await self.inner.record_call(run_id, record)
        self._at_record("after", record)

    def _at_record(self, when: str, record: Any) -> None:
        body = json.loads(record.payload)
        if record.kind == "started":
            self._tool_of[body["call_id"]] = body["tool"]
        if self._tool_of.get(body["call_id"]) == self.what and self.point == f"{when}_{record.kind}":
            self.kill()


class CombiningCrashingStore(CrashingStore):
    """The same, for a store that writes a held ``done`` and the checkpoint in one go.

    Its boundaries fold together: before that one write is before ``done`` and before the
    save (``before_done`` = ``in_save``); after it is after both (``after_done`` = ``between``).
    """

    async def save_after_calls(self, run_id: str, step: int, checkpoint: Any, calls: Any) -> None:
        for record in calls:
            self._at_record("before", record)
        if self.point == "in_save" and str(step) == self.what:
            self.kill()
        await self.inner.save_after_calls(run_id, step, checkpoint, calls)
        for record in calls:
            self._at_record("after", record)
        if self.point == "between" and str(step) == self.what:
            self.kill()


async def act(runner: FlowRunner, flow: Flow[Order], action: str, run_id: str) -> dict[str, Any]:
    try:
        if action == "run":
            result = await runner.run(flow, Order(show="Hamlet", seats=2), run_id=run_id)
        else:
            result = await runner.recover(flow, run_id, rerun_in_doubt=action == "recover_rerun")
    except RecoveryNeedsDecision as exc:
        return {"outcome": "decision", "calls": exc.calls}
    except Exception as exc:
        return {"outcome": "error", "error": type(exc).__name__, "message": str(exc)}
    return {
        "outcome": str(result.status),
        "note": result.state.note,
        "replayed": result.replayed,
        "rerun": result.rerun,
    }


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--action", choices=["run", "recover", "recover_rerun"], required=True)
    parser.add_argument("--crash", default=None)
    opts = parser.parse_args(argv)
    point, _, what = (opts.crash or "").partition(":")
    ledger = Ledger(Path(opts.ledger))
    registry, flow = build(ledger, crash_in=what if point == "in_tool" else None)
    inner = make_store(opts.store)
    wrapper = CombiningCrashingStore if hasattr(inner, "save_after_calls") else CrashingStore
    store = wrapper(inner, point or None, what or None)
    runner = FlowRunner(Executor(registry), checkpoints=store, checkpoint_key=KEY)

    async def go() -> dict[str, Any]:
        try:
            return await act(runner, flow, opts.action, opts.run_id)
        finally:
            await store.inner.aclose()

    print(json.dumps(asyncio.run(go())), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
