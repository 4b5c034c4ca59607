"""The CLI against a real deployment: Celery worker processes on the machine's Redis, the command a process.

Imported as ``cli_workers_kit`` (tests/cli is on ``sys.path``). The deployment is the Celery
tests' `celery_kit.Deployment` (tests/celery/celery_kit.py, loaded by path under that name);
its workers run `APP`: ``celery_flows:app`` and one flow more, whose ticket tools write every
effect, with the pid of the process that had it, to the deployment's file ledger. `agentflow` runs the command as
``python -m agentflow.cli`` in the deployment's environment (the same settings as the
workers, so ``workers.celery_app:tasks`` finds their store, key and queue) and returns its
pid with its output: a tool the command ran itself would be in the ledger under that pid.

The runs a test acts on are written from the test's process, on a store of its own
(`client_of`) and with tools whose effects go to an in-memory ledger, never to the
deployment's: `stranded` (step 0 saved, no message sent), `in_doubt` (its process died
inside charge_card, after the charge) and `failed` (the bank was down).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest
from _kit.tickets import TICKETS, Crash, Effect, Ledger, Order, make_tickets

from agentflow import FlowApp

if TYPE_CHECKING:
    from celery_kit import Deployment

    from agentflow.celery import FlowClient

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
#: What the workers run: the Celery tests' app, and ``late_mail`` (tests/cli/cli_workers_flows.py).
APP = "cli_workers_flows:app"


def gate(ledger_path: Path | str, show: str) -> Path:
    """The file whose existence lets ``report_when_told`` for `show` finish (beside the deployment's ledger)."""
    return Path(ledger_path).parent / f"gate-{show}"


#: What ``--workers`` names: the runnable deployment's tasks, built from the environment's settings.
WORKERS = "workers.celery_app:tasks"


def _celery_kit() -> ModuleType:
    """tests/celery/celery_kit.py, as the module ``celery_kit`` (the Celery tests import it under that name)."""
    if "celery_kit" not in sys.modules:
        spec = importlib.util.spec_from_file_location("celery_kit", ROOT / "tests" / "celery" / "celery_kit.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["celery_kit"] = module
        spec.loader.exec_module(module)
    return sys.modules["celery_kit"]


def deployment(tmp_path: Path, redis_url: str) -> Deployment:
    """A deployment of its own (key prefix, queue, key) running `APP`, with one worker ``w1`` started and answering."""
    made: Deployment = _celery_kit().Deployment(tmp_path, redis_url)
    made.values["app"] = made.env["AGENTFLOW_APP"] = APP
    made.env["PYTHONPATH"] = os.pathsep.join([str(HERE), made.env["PYTHONPATH"]])
    try:
        made.start_worker("w1")
    except BaseException:
        made.close()
        raise
    return made


@dataclass(frozen=True)
class Ran:
    """One ``agentflow`` command that ran as a process of its own."""

    code: int
    stdout: str
    stderr: str
    pid: int
    """The command's process (a tool it ran itself would be in the ledger under this pid)."""

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def agentflow(dep: Deployment, *args: str, env: dict[str, str] | None = None, timeout_s: float = 90) -> Ran:
    """Run ``agentflow ARGS`` in the deployment's environment, from the repository (where ``workers`` is)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentflow.cli", *args],
        cwd=ROOT,
        env={**dep.env, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = proc.communicate(timeout=timeout_s)
    return Ran(proc.returncode, stdout, stderr, proc.pid)


def effects(dep: Deployment, run_id: str) -> list[Effect]:
    """The tool effects of the run, in every process, in order."""
    return [e for e in Ledger(dep.ledger).entries() if e.run_id == run_id]


def assert_ran_on_the_workers(dep: Deployment, ran: Ran, run_id: str, tools: list[str]) -> None:
    """The run's effects are `tools`, in order, and each was had by a process of the worker's pool, not the command."""
    found = effects(dep, run_id)
    assert [e.tool for e in found] == tools, found
    pool = set(dep.children("w1"))
    for effect in found:
        assert effect.pid != ran.pid, f"{effect.tool} ran in the command's process"
        assert effect.pid in pool, f"{effect.tool} ran in process {effect.pid}, not in the worker's pool {pool}"


@asynccontextmanager
async def client_of(dep: Deployment) -> AsyncIterator[FlowClient]:
    """A client over the deployment's store and key, on this test's event loop (its store closed after)."""
    from agentflow.celery import FlowClient
    from config import Settings
    from workers.build import build

    _, tasks = build(Settings(**dep.values))
    client = FlowClient(tasks)
    try:
        yield client
    finally:
        store = client.runner.checkpoints
        assert store is not None
        await store.aclose()


async def stranded(client: FlowClient, flow: str, run_id: str, **order: object) -> str:
    """A run whose step 0 was saved and whose first message never went out (nobody moves it)."""
    await client.runner.start(client.flow_app.flow(flow), Order(**order), run_id=run_id)
    return run_id


async def in_doubt(client: FlowClient, run_id: str, show: str) -> str:
    """A ticket run whose process died inside charge_card, after the charge: the call is in doubt."""
    tickets = make_tickets()  # an in-memory ledger: this charge is not the workers'
    tickets.crash_in.add("charge_card")
    runner = FlowApp(tickets.registry, [TICKETS]).runner(client.runner.checkpoints, client.tasks.worker.checkpoint_key)
    with pytest.raises(Crash):
        await runner.run(TICKETS, Order(show=show), run_id=run_id)
    return run_id


async def failed(client: FlowClient, run_id: str, show: str) -> str:
    """A ticket run that failed in hold_seats: the bank was down (in this process, not on the workers)."""

    async def bank_down() -> None:
        raise ValueError("the bank is down")

    tickets = make_tickets(pause=bank_down)
    runner = FlowApp(tickets.registry, [TICKETS]).runner(client.runner.checkpoints, client.tasks.worker.checkpoint_key)
    result = await runner.run(TICKETS, Order(show=show), run_id=run_id)
    assert result.status == "failed", result
    return run_id
