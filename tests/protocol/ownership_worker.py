"""The worker process of tests/protocol/test_ownership.py, and the app its CLI and viewer act with.

Run as ``python ownership_worker.py MODE ...`` with tests/ on ``PYTHONPATH``
(`_kit.specs.child_env`). Every line it prints on stdout is one JSON event (``"event"``
names it); logs go to stderr.

Modes:
  run --job FLOW:RUN_ID:TOOL ... --hold RUN_ID ...
      Each job runs FLOW (a ticket flow, from `ORDER`) as run RUN_ID, holding its lease
      (``--lease-s``, renewed every third of it) as ``worker@<host>:<pid>``, or as
      ``<identity>#<start>`` with ``--identity`` (a runner that keeps its name across restarts). The first
      invocation of TOOL blocks until the ``--gate`` file exists, after printing
      ``{"event": "blocked", ...}``: charge_card and hold_seats block before their effect
      (their `make_tickets` pause), slow_lookup after it (its `Tickets.gate`); either way
      the call's ``started`` record is stored. TOOL ``port`` blocks in the runner's approval
      port instead (the port is asked after ``started``), then approves (WIRE's wire_money).
      TOOL ``charge_card+confirm`` blocks inside charge_card as above, then confirms its
      worker's lease itself (`CallInfo.confirm_held`) before its effect.
      Each ``--hold`` run (stored already) is held the same way, as a worker holds a run it
      moves, until the gate opens
      (``{"event": "held", ...}``). Ends with ``{"event": "end", "jobs": {RUN_ID: outcome}}``.
  race --run-id ID --me N --parties N --meet DIR --go FILE
      Connects, prints ``{"event": "ready", ...}``, waits for the go file, then recovers the
      ticket run (rerunning calls in doubt). Each racer waits at the door of the lease until
      all of them are there (`RacingStore`), so they all take it at the same instant; the
      lease itself is the store's, nothing fakes it. Ends with ``{"event": "end", ...}``.

`app` is the `FlowApp` the CLI (``--app ownership_worker:app``) and the viewer act with: the
ticket tools, recording their effects in the ledger file `LEDGER_ENV` names.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from _kit.faults import FaultyStore, file_rendezvous
from _kit.specs import BACKENDS, open_spec
from _kit.tickets import BATCH, KEY, LOOKUP, ORDER, REFUNDS, TICKETS, Ledger, Order, Tickets, make_tickets, order_args

from agentflow import Call, Executor, Flow, FlowApp, FlowRunner
from agentflow.errors import CheckpointConflict
from agentflow.exec import ApprovalRequest, current_call
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.checkpoints.records import Lease
from agentflow.exec.run.lease import Ownership, holding, process_owner

#: What the warm server imports before it forks this script's processes (`_kit.forkserver`).
PRELOAD = BACKENDS
#: wire (wire_money: not idempotent, and it always needs approval), alone.
WIRE = Flow("wire", state=Order).node("wire", Call("wire_money", args=order_args, into="wired")).end("wire")
#: The flows a job may run, by name.
FLOWS = {flow.name: flow for flow in (TICKETS, LOOKUP, BATCH, REFUNDS, WIRE)}
#: The variable naming the ledger file of `app`'s tools.
LEDGER_ENV = "AGENTFLOW_OWNERSHIP_LEDGER"
#: What the CLI and the viewer act with: the ticket tools and flows.
app = FlowApp(make_tickets(Ledger(env=LEDGER_ENV)).registry, FLOWS.values())
#: How long a worker waits for its gate or its go file before it gives up.
WAIT_S = 60.0


def say(event: str, **fields: Any) -> None:
    """Print one JSON event line, flushed."""
    print(json.dumps({"event": event, **fields}), flush=True)


async def until_exists(path: Path, timeout_s: float = WAIT_S) -> None:
    """Wait until `path` exists (polled; the wait survives SIGSTOP, since the clock goes on)."""
    async with asyncio.timeout(timeout_s):
        while not path.exists():
            await asyncio.sleep(0.01)


def ran(tickets: Tickets) -> list[str]:
    """The tools whose effect this process's tools had, in order (`Tickets.trace`)."""
    return [entry.removeprefix("tool:") for entry in tickets.trace if entry.startswith("tool:")]


class Blocker:
    """Blocks the first invocation of one tool of one run until the gate file exists, and says so."""

    def __init__(self, run_id: str, tool: str, gate: Path, owner: str) -> None:
        self.tool, _, then = tool.partition("+")
        self.run_id, self.gate, self.owner = run_id, gate, owner
        self.confirms = then == "confirm"
        self.armed = True
        self.tickets: Tickets | None = None

    async def pause(self) -> None:
        """The ticket tools' pause (before their effect): block the first invocation of the tool.

        A ``+confirm`` tool then confirms its worker's lease before its effect, as a tool that
        works long before its effect does.
        """
        if self.armed and current_call().tool == self.tool:
            self.armed = False
            await self.block()
            if self.confirms:
                await current_call().confirm_held()

    async def watch(self, release: asyncio.Event, entered: asyncio.Event) -> None:
        """For a tool held by `Tickets.gate` (slow_lookup, after its effect): block there, then let it go."""
        await entered.wait()
        await self.block()
        release.set()

    async def block(self) -> None:
        assert self.tickets is not None
        say("blocked", run_id=self.run_id, tool=self.tool, owner=self.owner, ran=ran(self.tickets))
        await until_exists(self.gate)

    async def port(self, request: ApprovalRequest) -> bool:
        """The approval port of a ``port`` job: block until the gate opens, then approve."""
        await self.block()
        return True


async def run_job(opts: argparse.Namespace, owner: str, job: str) -> dict[str, Any]:
    """Run one flow until it ends or is refused; block inside the named tool until the gate opens."""
    flow_name, run_id, tool = job.split(":")
    blocker = Blocker(run_id, tool, Path(opts.gate), owner)
    tickets = make_tickets(Ledger(opts.ledger), pause=blocker.pause)
    blocker.tickets = tickets
    store = FaultyStore(open_spec(opts.spec))
    who = {"identity": opts.identity} if opts.identity else {"owner": owner}
    executor = Executor(tickets.registry, approver=blocker.port if tool == "port" else None)
    runner = FlowRunner(executor, checkpoints=store, checkpoint_key=KEY, lease_s=opts.lease_s, **who)
    blocker.owner = runner.ownership.owner
    watch = asyncio.create_task(blocker.watch(*tickets.gate(tool))) if tool == "slow_lookup" else None
    try:
        flow: Flow[Any] = FLOWS[flow_name]
        result = await runner.run(flow, ORDER, run_id=run_id)
        outcome: dict[str, Any] = {"outcome": str(result.status)}
    except CheckpointConflict as exc:
        outcome = {"outcome": "refused", "error": type(exc).__name__, "message": str(exc)}
    except Exception as exc:  # reported, so that the test says what went wrong
        outcome = {"outcome": "error", "error": type(exc).__name__, "message": str(exc)}
    finally:
        if watch is not None:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
        await store.aclose()
    return {**outcome, "refused": [op for op, _ in store.refused], "writes": store.writes, "ran": ran(tickets)}


async def hold_job(opts: argparse.Namespace, owner: str, run_id: str) -> dict[str, Any]:
    """Hold a stored run's lease (renewed from a timer, as a runner does) until the gate opens."""
    store = open_spec(opts.spec)
    try:
        async with holding(store, run_id, Ownership(owner, opts.lease_s)):
            say("held", run_id=run_id, owner=owner)
            await until_exists(Path(opts.gate))
    finally:
        await store.aclose()
    return {"outcome": "released"}


async def run_all(opts: argparse.Namespace) -> None:
    owner = process_owner("worker")
    jobs: dict[str, Awaitable[dict[str, Any]]] = {}
    for job in opts.job:
        jobs[job.split(":")[1]] = run_job(opts, owner, job)
    for run_id in opts.hold:
        jobs[run_id] = hold_job(opts, owner, run_id)
    outcomes = await asyncio.gather(*jobs.values())
    say("end", jobs=dict(zip(jobs, outcomes, strict=True)))


class RacingStore(FaultyStore):
    """A racer's store: before its first lease take, it waits until every racer is at that door."""

    def __init__(self, inner: CheckpointStore, door: Callable[[], Awaitable[None]]) -> None:
        super().__init__(inner)
        self._door: Callable[[], Awaitable[None]] | None = door

    async def take_lease(self, run_id: str, owner: str, token: str, ttl_s: float) -> Lease:
        door, self._door = self._door, None
        if door is not None:
            await door()
        return await super().take_lease(run_id, owner, token, ttl_s)


async def race(opts: argparse.Namespace) -> None:
    tickets = make_tickets(Ledger(opts.ledger))
    store = RacingStore(open_spec(opts.spec), file_rendezvous(Path(opts.meet), str(opts.me), opts.parties))
    owner = process_owner(f"racer-{opts.me}")
    runner = FlowRunner(
        Executor(tickets.registry), checkpoints=store, checkpoint_key=KEY, lease_s=opts.lease_s, owner=owner
    )
    try:
        await store.leases([opts.run_id])  # connected before the race starts (the run may not be stored yet)
        say("ready", owner=owner)
        await until_exists(Path(opts.go))
        try:
            result = await runner.recover(TICKETS, opts.run_id, rerun_in_doubt=True)
            outcome: dict[str, Any] = {"outcome": "won", "status": str(result.status)}
        except CheckpointConflict as exc:
            outcome = {"outcome": "lost", "error": type(exc).__name__, "message": str(exc)}
    finally:
        await store.aclose()
    say("end", owner=owner, **outcome, writes=store.writes, ran=ran(tickets))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["run", "race"])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--lease-s", type=float, required=True)
    parser.add_argument("--gate", default="")
    parser.add_argument("--job", action="append", default=[])
    parser.add_argument("--hold", action="append", default=[])
    parser.add_argument("--run-id", default="")
    parser.add_argument("--me", type=int, default=0)
    parser.add_argument("--parties", type=int, default=1)
    parser.add_argument("--meet", default="")
    parser.add_argument("--go", default="")
    parser.add_argument("--identity", default="")
    opts = parser.parse_args(argv)
    asyncio.run(run_all(opts) if opts.mode == "run" else race(opts))


if __name__ == "__main__":
    main(sys.argv[1:])
