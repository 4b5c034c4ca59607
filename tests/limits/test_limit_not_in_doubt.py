"""A call waiting for a limit is not in doubt: its slots come before its ``started`` record.

A real worker process on a real store (SQLite) and a real shared limits backend (a SQLite
file) is SIGKILLed while its call waits for the one slot another holder keeps; the call
has no ``started`` record, and recovery runs it once, with no decision asked. A run
cancelled while its call waits ends without the call ever starting.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import pytest
from _kit.forkpopen import Child, spawn
from _kit.poll import until
from _kit.specs import open_spec
from limit_wait_proc import API, CHARGE, KEY, Order

from agentflow import Event, Events, Executor, FlowRunner, Registry
from agentflow.exec.checkpoints import SQLiteCheckpointStore
from agentflow.exec.limits import LocalLimits
from agentflow.exec.limits._backends import BackendRef
from agentflow.exec.run.events import read_events
from agentflow.exec.seal import Sealer

#: Worker processes started, frozen or killed: seconds each (make check leaves them to make test).
pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent


def worker(action: str, store: str, limits: str, ledger: Path, run_id: str) -> Child:
    """A limit_wait_proc.py process, forked from its warm server (`_kit.forkpopen`)."""
    return spawn(HERE / "limit_wait_proc.py", [action, store, limits, str(ledger), run_id])


def outcome(proc: Child) -> dict[str, Any]:
    out = proc.stdout.read()
    assert proc.wait(timeout=60) == 0, proc.stderr_text()
    proc.close()
    said: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return said


async def test_a_worker_killed_while_its_call_waits_for_a_slot_leaves_nothing_in_doubt(tmp_path: Path) -> None:
    store_spec = f"sqlite:{tmp_path / 'runs.db'}"
    limits = f"sqlite+aiosqlite:///{tmp_path / 'limits.db'}#lim_"
    ledger = tmp_path / "ledger.txt"
    backend = BackendRef(limits).get()
    store = open_spec(store_spec)
    try:
        # Given another holder keeping the only slot of limit "api"
        assert await backend.take(API, "", "another-holder") is None

        # When a worker process starts a run whose non-idempotent call is under that limit,
        # and is SIGKILLed once its call is waiting for the slot
        proc = worker("run", store_spec, limits, ledger, "pay-1")
        try:

            async def waiting() -> bool:
                return any(e.name == "call.waiting" for e in await read_events(store, Sealer(KEY), "pay-1"))

            await until(waiting, "the worker's call waiting for the slot", timeout_s=30)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            proc.close()
        assert proc.returncode == -signal.SIGKILL

        # Then the call has no record at all (no started: nothing in doubt), and the tool never ran
        assert [record.kind for record in await store.calls("pay-1")] == []
        assert not ledger.exists()

        # When the slot is free again and another worker process recovers the run
        await backend.release(API, "", "another-holder")
        recovered = outcome(worker("recover", store_spec, limits, ledger, "pay-1"))

        # Then the call ran once, with no operator's decision asked and nothing rerun
        assert recovered == {"outcome": "done", "receipt": "charged o-1", "rerun": []}
        assert len(ledger.read_text().splitlines()) == 1
        assert [record.kind for record in await store.calls("pay-1")] == ["started", "done"]
    finally:
        await backend.aclose()
        await store.aclose()


async def test_a_run_cancelled_while_its_call_waits_for_a_slot_never_starts_the_call(tmp_path: Path) -> None:
    # Given a run whose call waits for the one slot of limit "api", which another holder keeps
    backend = LocalLimits()
    registry = Registry(limit_backend=backend)
    registry.limit(API)
    charged: list[str] = []

    @registry.tool(limits=["api"])
    async def charge(order: str) -> str:
        charged.append(order)
        return f"charged {order}"

    waiting: list[Event] = []
    hub = Events()
    hub.subscribe(waiting.append, ["call.waiting"])
    assert await backend.take(API, "", "another-holder") is None
    async with SQLiteCheckpointStore(tmp_path / "runs.db") as store:
        runner = FlowRunner(Executor(registry, events=hub), checkpoints=store, checkpoint_key=KEY)
        run = asyncio.create_task(runner.run(CHARGE, Order(), run_id="pay-2"))
        await until(lambda: waiting, "the call waiting for the slot")

        # When an operator cancels the run, and then the slot comes free
        other = FlowRunner(Executor(registry), checkpoints=store, checkpoint_key=KEY)
        await other.cancel(CHARGE, "pay-2", reason="not needed", operator="ann")
        await backend.release(API, "", "another-holder")
        result = await run

        # Then the run ended cancelled, and the call never started: no record, no charge
        assert result.status == "cancelled" and result.error == "cancelled by ann: not needed"
        assert charged == []
        assert [record.kind for record in await store.calls("pay-2")] == []
