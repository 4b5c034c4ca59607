"""Failover rounds: ticket runs in flight through real Celery workers while the store's server is lost.

Two ways to lose it, each a round that ends with every run finished and a tally:

- `sentinel_round`: a primary, a replica behind a cuttable link and three Sentinels
  (`_kit.replication`). The replica is cut off while runs go on, then the primary is
  SIGKILLed and the Sentinels promote the replica, which never got what the primary
  acknowledged after the cut; a new replica of it restores redundancy (until then a store
  that waits for a replica stops every run at its next durable write). The workers' store
  URL is ``redis+sentinel://``: they find the new primary by themselves.
- `crash_round`: one Valkey server with an append-only file (`_kit.disk`). Once the runs'
  step 0s are fsynced its disk stalls while they go on, then the host "crashes": SIGKILL, and every file cut back to
  what was fsynced. The server restarts on the same port.

In both, the moment of loss is chosen the same way: once three effects of non-idempotent
tools happened after the cut (one worker runs two calls at a time, so at least one of
them was logged ``started`` after the cut), or once a worker reported that a write was not
acknowledged (`StoreNotDurable`), or the store stopped answering (a stalled disk under
``appendfsync always``). Without durability options the first comes; with them, one of
the others. After the loss an operator finishes every run: beat's ``recover_all``
recovers stranded runs, and a call in doubt is decided by looking at the ledger, as one
would look at the bank: `Happened` with its result if it had its effect, else `Rerun`.
So every non-idempotent effect past one per call is a duplicate the system made on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from _kit.disk import CrashableServer
from _kit.poll import until
from _kit.replication import ReplicaSet
from _kit.tickets import Ledger
from celery_kit import Deployment

from agentflow import Happened, Rerun
from agentflow._errors import CheckpointError, CheckpointNotFound
from agentflow.exec.run.read import read_run

#: The ticket flow's tools that must not have an effect twice, and the result each returns.
RESULTS: dict[str, Callable[[str, int], str]] = {
    "charge_card": lambda show, seats: f"charged {seats * 40} for {show}",
    "email_tickets": lambda show, seats: f"mailed {show}",
}
#: Runs started per round.
RUNS = 6
#: Effects after the cut that prove a ``started`` after the cut (a worker runs two calls at a time).
EFFECTS_AFTER_CUT = 3


@dataclass
class Tally:
    """What one set-up's rounds did."""

    setup: str
    rounds: int = 0
    runs: int = 0
    duplicates: int = 0
    """Non-idempotent effects past one per call: the system ran a call again on its own."""
    lost: int = 0
    """Runs the client was told had started that were gone after the loss."""
    in_doubt: int = 0
    """Calls in doubt surfaced to the operator (decided: happened, or rerun)."""
    refused: int = 0
    """Rounds in which a worker's write was refused as not durable (the tool did not run)."""

    def line(self) -> str:
        return (
            f"{self.setup}: {self.rounds} failovers, {self.runs} runs, {self.duplicates} duplicated effects, "
            f"{self.lost} runs lost, {self.in_doubt} calls in doubt surfaced, {self.refused} rounds with a "
            "refused write"
        )


def _non_idempotent(dep: Deployment) -> int:
    return sum(1 for e in Ledger(dep.ledger).entries() if e.tool in RESULTS)


def _refusals(dep: Deployment) -> int:
    return sum(dep.log(name).count("StoreNotDurable") for name in dep.procs)


async def _start_runs(dep: Deployment, tally: Tally) -> dict[str, tuple[str, int]]:
    orders = {}
    for i in range(RUNS):
        show, seats = f"show-{tally.rounds}-{i}", 1 + i % 3
        orders[await dep.client.start("tickets", {"show": show, "seats": seats})] = (show, seats)
    return orders


async def _lose_when_written(dep: Deployment, effects: int, refusals: int, stalled: Callable[[], bool]) -> None:
    """Wait for the moment of loss (see the module notes)."""

    def ready() -> bool:
        return _non_idempotent(dep) - effects >= EFFECTS_AFTER_CUT or _refusals(dep) > refusals or stalled()

    await until(ready, "three effects after the cut, a refused write, or a stalled store", timeout_s=60)


async def _settle(dep: Deployment, orders: dict[str, tuple[str, int]], tally: Tally, timeout_s: float = 120) -> None:
    """Finish every run as an operator would (see the module notes), then count."""
    runner = dep.client.runner
    assert runner.checkpoints is not None and runner.sealer is not None
    pending = set(orders)
    deadline = time.monotonic() + timeout_s
    seen: dict[str, Any] = {}
    while pending:
        assert time.monotonic() < deadline, f"runs never finished: {[seen.get(r) for r in sorted(pending)]}"
        for run_id in sorted(pending):
            try:
                view = await dep.client.status(run_id)
            except CheckpointNotFound:
                tally.lost += 1  # its step 0 was acknowledged, then lost with the server
                pending.discard(run_id)
                continue
            except CheckpointError as exc:  # the Sentinels are still settling on the new primary: ask again
                seen[run_id] = exc
                continue
            seen[run_id] = (view.status, view.step, view.waiting_for_decision, view.error)
            if view.status == "done":
                pending.discard(run_id)
            elif view.status != "running":
                raise AssertionError(f"run {run_id} ended {view.status}: {view.error}")
            elif view.waiting_for_decision:
                report = await read_run(runner.checkpoints, runner.sealer, run_id)
                effects = dep.effects()
                show, seats = orders[run_id]
                calls: dict[str, Any] = {}
                for call in report.in_doubt:
                    happened = effects[(call.tool, run_id)] > 0
                    calls[call.call_id] = Happened(RESULTS[call.tool](show, seats)) if happened else Rerun()
                tally.in_doubt += len(calls)
                with contextlib.suppress(CheckpointError):  # a worker took the run meanwhile: look again
                    await dep.client.decide_in_doubt(run_id, calls=calls, operator="failover-test")
        await asyncio.sleep(0.3)
    effects = dep.effects()
    tally.duplicates += sum(max(0, effects[(tool, r)] - 1) for r in orders for tool in RESULTS)
    tally.runs += len(orders)
    tally.rounds += 1


async def sentinel_round(dep: Deployment, pair: ReplicaSet, tally: Tally) -> None:
    """One failover through Sentinel (see the module notes)."""
    store = dep.client.runner.checkpoints
    assert store is not None
    await until(lambda: _answers(store), "the store to reach the new set through the Sentinels", timeout_s=30)
    refusals = _refusals(dep)
    orders = await _start_runs(dep, tally)
    await until(pair.in_sync, "the replica to have every run's step 0", timeout_s=30)
    effects = _non_idempotent(dep)
    pair.link.cut()
    await _lose_when_written(dep, effects, refusals, lambda: False)
    tally.refused += _refusals(dep) > refusals
    pair.primary.kill()
    pair.link.close()
    await until(pair.promoted, "the Sentinels to promote the replica", timeout_s=60)
    pair.add_replica()  # redundancy restored: with wait_replicas=1, durable writes need a replica to go on
    await _settle(dep, orders, tally)


async def crash_round(dep: Deployment, disk: CrashableServer, tally: Tally) -> None:
    """One host crash (see the module notes)."""
    refusals = _refusals(dep)
    orders = await _start_runs(dep, tally)
    written = disk.written()
    await until(lambda: disk.synced() >= written, "every run's step 0 to be fsynced", timeout_s=30)
    effects = _non_idempotent(dep)
    disk.stall_disk()
    await _lose_when_written(dep, effects, refusals, lambda: not _pings(disk))
    tally.refused += _refusals(dep) > refusals
    disk.crash()
    disk.restart()
    await _settle(dep, orders, tally)


async def _answers(store: Any) -> bool:
    try:
        await store.list_runs(limit=1)
    except Exception:
        return False
    return True


def _pings(disk: CrashableServer) -> bool:
    """Whether the server answers within a quarter second (under appendfsync always a stalled disk stalls it)."""
    import redis

    try:
        with redis.Redis(port=disk.server.port, socket_timeout=0.25, socket_connect_timeout=0.25) as client:
            return bool(client.ping())
    except redis.RedisError:
        return False
