"""The crash kit for the tool loop: a conversation whose tools keep a ledger (the shared
`_kit.tickets.Ledger`), the store wrapper of `_kit.faults` killing the process at a protocol
boundary, and the worker entry point.

The conversation (the model's replies depend only on the history, so a model in a new
process picks up where the dead one stopped):

  turn 1: the assistant asks for ``lookup`` (idempotent) and ``charge`` in one reply
  turn 2: it asks for ``email``
  turn 3: it answers ``FINAL``

Boundaries (``--crash POINT[:WHAT]``); the kill is SIGKILL to the worker's own process:
  model:N               inside the Nth model call of this process (after it hit the ledger)
  after_reply:N         just after this process saved its Nth reply checkpoint (stage ``model``)
  after_started:TOOL    just after TOOL's ``started`` record is stored (the tool has not run)
  in_tool:TOOL          inside TOOL, after its side effect hit the ledger
  before_done:TOOL      after TOOL ran, before its ``done`` record is stored
  after_done:TOOL       just after TOOL's ``done`` record is stored
                        (a reply's last call, ``charge`` or ``email``, stores its ``done``
                        with the tool results' checkpoint in one write: these two points
                        are just before and just after that write)
  after_tools:N         just after this process saved its Nth tool-results checkpoint
  in_approver:TOOL      inside the synchronous approval port, asked about TOOL (``--approver``)

Run as ``python loopkit.py --db PATH --ledger PATH --run-id ID --action ACTION`` with tests/ on
``PYTHONPATH`` (`_kit.specs.child_env`); the last line of stdout is a JSON outcome (nothing is
printed when the process was killed). The tests fork it from a warm server instead
(`_kit.forkserver`), which calls `main`. The ledger is `_kit.tickets.Ledger`; the store wrapper
`_kit.faults.FaultyStore`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any

from _kit.faults import FaultyStore
from _kit.leases import KILLED_LEASE_S, once_lapsed
from _kit.specs import BACKENDS, open_spec
from _kit.tickets import Ledger, sigkill

from agentflow import Events, Registry
from agentflow.exec import ApprovalRequest, recover_tool_loop, run_tool_loop
from agentflow.exec.checkpoints import RecoveryNeedsDecision, SQLiteCheckpointStore
from agentflow.models import Message, ScriptedModel, ToolCall

#: What the warm server imports before it forks this script's processes (`_kit.forkserver`).
PRELOAD = BACKENDS
KEY = b"loop-crash-kit-key-0123456789abcdef"
#: The model may be called this often over the whole run (the conversation needs 3 calls).
MAX_STEPS = 4
TOOLS = ("lookup", "charge", "email")
NON_IDEMPOTENT = frozenset({"charge", "email"})
PROMPT = "Charge order A1 90 EUR and mail the receipt."
FINAL = "Order A1: charged 90 EUR, receipt mailed."

#: The history a finished run must have: (role, content, tool name).
EXPECTED_HISTORY = [
    ["user", PROMPT, None],
    ["assistant", "", None],
    ["tool", "found A1 (90 EUR)", "lookup"],
    ["tool", "charged 90 EUR for A1", "charge"],
    ["assistant", "", None],
    ["tool", "mailed receipt for A1", "email"],
    ["assistant", FINAL, None],
]


def die() -> None:
    """Die like a worker the kernel killed: no cleanup, no flush, no finally blocks."""
    sigkill("at the chosen boundary")


def reply_for(history: Sequence[Message]) -> Message:
    """The model's next reply, from the conversation alone (deterministic on every worker)."""
    turn = sum(1 for m in history if m.role == "assistant") + 1
    if turn == 1:
        return Message.assistant(
            tool_calls=[
                ToolCall(id="call-lookup", name="lookup", arguments={"order": "A1"}),
                ToolCall(id="call-charge", name="charge", arguments={"order": "A1", "amount": 90}),
            ]
        )
    if turn == 2:
        return Message.assistant(tool_calls=[ToolCall(id="call-email", name="email", arguments={"order": "A1"})])
    return Message.assistant(FINAL)


class LedgerModel(ScriptedModel):
    """A ScriptedModel following `reply_for` that logs each call to the ledger, and may die in one."""

    def __init__(self, ledger: Ledger, run_id: str, die_on: int | None = None) -> None:
        super().__init__([reply_for] * (MAX_STEPS + 2))
        self.ledger = ledger
        self.run_id = run_id
        self.die_on = die_on

    async def complete(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> Message:
        self.ledger.record("model", self.run_id, str(self.calls + 1))
        if self.die_on == self.calls + 1:
            die()
        return await super().complete(messages, tools)


def build(ledger: Ledger, run_id: str, crash_in: str | None = None, approval: bool = False) -> Registry:
    """The conversation's tools; each writes the ledger before it returns (and may die there)."""
    registry = Registry()

    def effect(tool: str, result: str) -> str:
        ledger.record(tool, run_id)
        if crash_in == tool:
            die()
        return result

    @registry.tool(idempotent=True)
    async def lookup(order: str) -> str:
        """Find an order (safe to repeat)."""
        return effect("lookup", f"found {order} (90 EUR)")

    @registry.tool(approval=approval)
    async def charge(order: str, amount: int) -> str:
        """Charge the customer's card (not idempotent)."""
        return effect("charge", f"charged {amount} EUR for {order}")

    @registry.tool
    def email(order: str) -> str:
        """Mail the receipt (a sync tool, not idempotent)."""
        return effect("email", f"mailed receipt for {order}")

    return registry


def arm(store: FaultyStore, point: str, what: str) -> None:
    """Make `store` kill the process at a call-log boundary (``after_started``, ``before_done``, ``after_done``)."""
    if point in ("after_started", "before_done", "after_done"):
        when, kind = point.split("_")
        store.crash(kind, tool=what, when=when)


def kill_after_saves(events: Events, point: str, what: str) -> None:
    """Kill the process right after its Nth checkpoint of a stage is stored (``after_reply``/``after_tools``)."""
    stage = {"after_reply": "model", "after_tools": "tools"}[point]
    seen = Counter[str]()

    def on_event(event: Any) -> None:
        if event.name == "checkpoint.saved" and event.data["stage"] == stage:
            seen[stage] += 1
            if seen[stage] == int(what):
                die()

    events.subscribe(on_event)


def outcome(result: Any) -> dict[str, Any]:
    return {
        "outcome": str(result.status),
        "messages": [[m.role, m.content, m.name] for m in result.messages],
        "model_calls": result.model_calls,
        "replayed": result.replayed,
        "rerun": result.rerun,
        "error": result.error,
    }


async def act(opts: argparse.Namespace) -> dict[str, Any]:
    point, _, what = (opts.crash or "").partition(":")
    ledger = Ledger(opts.ledger)
    registry = build(ledger, opts.run_id, crash_in=what if point == "in_tool" else None, approval=opts.approver)
    model = LedgerModel(ledger, opts.run_id, die_on=int(what) if point == "model" else None)
    inner = open_spec(opts.store) if opts.store else SQLiteCheckpointStore(opts.db)
    store = FaultyStore(inner, die=sigkill)
    arm(store, point, what)
    events = Events()
    if point in ("after_reply", "after_tools"):
        kill_after_saves(events, point, what)

    def approver(request: ApprovalRequest) -> bool:
        if point == "in_approver" and request.tool == what:
            die()
        return True

    common: dict[str, Any] = {"checkpoints": store, "checkpoint_key": KEY, "events": events, "lease_s": KILLED_LEASE_S}
    if opts.approver:
        common["approver"] = approver
    try:
        if opts.action == "run":
            result = await run_tool_loop(
                model, registry, [Message.user(PROMPT)], run_id=opts.run_id, max_steps=MAX_STEPS, **common
            )
        else:
            rerun = opts.action == "recover_rerun"
            result = await once_lapsed(
                lambda: recover_tool_loop(model, registry, opts.run_id, rerun_in_doubt=rerun, **common)
            )
    except RecoveryNeedsDecision as exc:
        return {"outcome": "decision", "calls": exc.calls}
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
    parser.add_argument("--action", choices=["run", "recover", "recover_rerun"], required=True)
    parser.add_argument("--crash", default=None)
    parser.add_argument("--approver", action="store_true", help="charge needs approval; a sync port approves")
    opts = parser.parse_args(argv)
    print(json.dumps(asyncio.run(act(opts))), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
