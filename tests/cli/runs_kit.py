"""A store full of real runs, shared by the CLI and viewer tests.

Imported as ``runs_kit`` (tests/cli is on ``sys.path`` under pytest's prepend import mode;
tests/viewer/viewer_kit.py loads it by path). ``--app runs_kit:app`` names its FlowApp.

`build(folder)` writes ``folder/runs.db``, signed with the demo's key:
- order-1, order-2, order-3: the demo's ticket runs (`agentflow.demo.story.main`); order-2 was
  recovered after its worker was killed mid-mail;
- refund-1: paused, waiting for approval of ``refund`` (no identity);
- refund-2: paused, acting for user alice, thread t-9 and a principal (`PRINCIPAL`);
- ship-1: its worker died inside ``ship`` (not idempotent), so the call is in doubt;
- tamper-1: a finished shipping run whose checkpoint 1 payload had one byte changed
  (``Berlin`` became ``berlin``) with sqlite3, behind agentflow's back.

``--app runs_kit:app_v2`` is a later deploy with version 2 of the refunds flow only
(``--state runs_kit:in_euros`` maps a version 1 refund to it).

`hold(db, run_id)` takes a run's lease as a live worker (`HOLDER`) would; `stored` counts a
run's rows, to show that nothing ran.
"""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path
from typing import Any, TypeVar

from click.testing import Result
from pydantic import BaseModel

from agentflow import Call, Flow, FlowApp, FlowRunner, Registry, RunContext
from agentflow._events import Events
from agentflow.demo.worker import DEMO_KEY
from agentflow.errors import RecoveryNeedsDecision
from agentflow.exec.checkpoints import SQLiteCheckpointStore
from agentflow.exec.checkpoints.records import Lease

KEY = DEMO_KEY
#: The key as the CLI reads it from the environment.
KEY_TEXT = "hex:" + KEY.hex()
#: The runs are signed with the demo's public key, which the CLI refuses unless told to take it.
ALLOW_DEMO_KEY = {"AGENTFLOW_ALLOW_DEMO_KEY": "1"}
#: The principal of refund-2: it must never be shown, nor its proof.
PRINCIPAL = "principal-token-5ecret-do-not-show"
#: What the tamper changed in tamper-1's checkpoint 1 (to ``berlin``).
TAMPERED_FROM = b"Berlin"

T = TypeVar("T")

registry = Registry()
#: Orders refunded (the side effect of the refund tool).
REFUNDS: list[str] = []
#: Tools that "kill the worker" on their next call.
CRASH: set[str] = set()


class WorkerDied(BaseException):
    """A simulated SIGKILL: the runner cannot catch it, so the run stays as a dead worker left it."""


@registry.tool(approval=True)
async def refund(order: str, amount: int) -> str:
    """Refund an order (needs a person's approval first)."""
    REFUNDS.append(order)
    return f"refunded {amount} EUR on {order}"


@registry.tool
async def ship(address: str) -> str:
    """Ship a parcel (not idempotent)."""
    if "ship" in CRASH:
        CRASH.discard("ship")
        raise WorkerDied()
    return f"shipped to {address}"


class Refund(BaseModel):
    order: str
    amount: int
    note: str = ""


class Parcel(BaseModel):
    address: str
    label: str = ""


refunds = (
    Flow("refunds", state=Refund)
    .node("refund", Call("refund", args=lambda s: {"order": s.order, "amount": s.amount}, into="note"))
    .end("refund")
)
shipping = (
    Flow("shipping", state=Parcel)
    .node("pack", lambda s: {"label": f"parcel for {s.address}"})
    .node("ship", Call("ship", args=lambda s: {"address": s.address}, into="label"))
    .edge("pack", "ship")
    .end("ship")
)
app = FlowApp(registry, [refunds, shipping])


class RefundV2(Refund):
    """Version 2's state: a refund names its currency."""

    currency: str


#: A later deploy: version 2 of the refunds flow only (refund-1 and refund-2 are on version 1).
refunds_v2 = (
    Flow("refunds", state=RefundV2, version="2")
    .node("refund", Call("refund", args=lambda s: {"order": s.order, "amount": s.amount}, into="note"))
    .end("refund")
)
app_v2 = FlowApp(registry, [refunds_v2, shipping])

#: Whether the quote service is down (the quote tool raises).
DOWN: list[bool] = []


async def quote(address: str) -> str:
    """Ask the carrier for a price (fails while the service is down)."""
    if DOWN:
        raise ConnectionError("the quote service is down")
    return f"12 EUR to {address}"


quotes = (
    Flow("quotes", state=Parcel)
    .node("quote", Call("quote", args=lambda s: {"address": s.address}, into="label"))
    .end("quote")
)
#: The kit's flows and ``quotes``, which fails on cue (`DOWN`): what operators retry.
quoting = Registry()
quoting.add(refund, approval=True)
quoting.add(ship)
quoting.add(quote)
quotes_app = FlowApp(quoting, [refunds, shipping, quotes])
NOT_A_FUNCTION = "a string, not a function"


def in_euros(old: dict[str, Any]) -> dict[str, Any]:
    """Version 1's refund state as version 2's (the ``--state`` of a migration)."""
    return {**old, "currency": "EUR"}


async def _add_runs(db: Path) -> None:
    async with SQLiteCheckpointStore(db) as store:
        runner = app.runner(store, KEY, events=Events(record=True))  # the viewer's live page reads the streams
        await runner.run(refunds, Refund(order="order-1", amount=90), run_id="refund-1")
        ctx = RunContext(user="alice", thread="t-9", principal=PRINCIPAL)
        await runner.run(refunds, Refund(order="order-3", amount=45), run_id="refund-2", ctx=ctx)
        CRASH.add("ship")
        try:
            await runner.run(shipping, Parcel(address="Lisbon"), run_id="ship-1")
        except WorkerDied:
            pass
        await runner.run(shipping, Parcel(address="Berlin"), run_id="tamper-1")


def tamper(db: Path, run_id: str = "tamper-1", step: int = 1, find: bytes = TAMPERED_FROM) -> None:
    """Change one byte of a checkpoint's payload directly in the SQLite file (the first of `find`, case swapped)."""
    with closing(sqlite3.connect(db)) as conn, conn:
        (payload,) = conn.execute(
            "SELECT payload FROM checkpoints WHERE run_id = ? AND step = ?", (run_id, step)
        ).fetchone()
        at = payload.index(find)
        changed = payload[:at] + payload[at : at + 1].swapcase() + payload[at + 1 :]
        conn.execute("UPDATE checkpoints SET payload = ? WHERE run_id = ? AND step = ?", (changed, run_id, step))


def build(folder: Path) -> Path:
    """Write the demo's runs and ours into ``folder/demo/runs.db``; return its path."""
    # In a process of its own: the story leaves its workers' pipes to the garbage collector,
    # and this suite turns the ResourceWarning that causes into an error.
    code = "import sys, pathlib; from agentflow.demo.story import main; sys.exit(main(pathlib.Path(sys.argv[1])))"
    proc = subprocess.run([sys.executable, "-c", code, str(folder / "demo")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    db = folder / "demo" / "runs.db"
    in_thread(lambda: _add_runs(db))
    tamper(db)
    return db


def in_thread(job: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``asyncio.run(job())`` on a thread of its own (Playwright's sync API keeps a loop running on this one)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(job())).result()


_BUILT: list[Path] = []


def build_once(tmp_path_factory: Any) -> Path:
    """`build` once per test session (the CLI and viewer tests share the result; copy it before writing)."""
    if not _BUILT:
        _BUILT.append(build(tmp_path_factory.mktemp("runs")))
    return _BUILT[0]


def copy_db(source: Path, target: Path) -> Path:
    """Copy a SQLite database consistently (WAL included)."""
    with closing(sqlite3.connect(source)) as src, closing(sqlite3.connect(target)) as dst:
        src.backup(dst)
    return target


#: The owner of a lease a test takes, as a live worker holds a run.
HOLDER = "worker-7@host-b:4242"


def hold(db: Path, run_id: str, owner: str = HOLDER) -> Lease:
    """Take the run's lease in the store, as a live worker holds it while it moves the run (60 s: past any test)."""

    async def take() -> Lease:
        async with SQLiteCheckpointStore(db) as store:
            return await store.take_lease(run_id, owner, f"token-of-{owner}", 60.0)

    lease = in_thread(take)
    assert lease.owner == owner, f"{run_id} is held by {lease.owner} already"
    return lease


def as_worker(db: Path, job: str, run_id: str, operator: str | None = None) -> None:
    """Act on a run through the app's runner, as a worker would: ``park`` it, or ``decide`` its calls in doubt."""

    async def act() -> None:
        async with SQLiteCheckpointStore(db) as store:
            runner: FlowRunner = app.runner(store, KEY, owner="worker-9@host-c:99")
            if job == "park":
                try:
                    await runner.advance(shipping, run_id, park=True)
                except RecoveryNeedsDecision:
                    return
                raise AssertionError("the run was not parked")
            await runner.decide_in_doubt(shipping, run_id, operator=operator)

    in_thread(act)


def add_failed(db: Path, run_id: str = "quote-1") -> None:
    """Write a quotes run that failed because the quote service was down (it is up again on return)."""

    async def run() -> None:
        async with SQLiteCheckpointStore(db) as store:
            result = await quotes_app.runner(store, KEY).run(quotes, Parcel(address="Faro"), run_id=run_id)
            assert result.status == "failed", result

    DOWN.append(True)
    try:
        in_thread(run)
    finally:
        DOWN.clear()


def stored(db: Path, run_id: str) -> tuple[int, int]:
    """How many checkpoints and call records of the run are stored."""

    async def read() -> tuple[int, int]:
        async with SQLiteCheckpointStore(db) as store:
            return len(await store.history(run_id)), len(await store.calls(run_id))

    return in_thread(read)


def one_line_error(result: Result) -> str:
    """The command's error: exactly one line on stderr, and no traceback anywhere."""
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("agentflow: "), lines[0]
    return lines[0]


#: The key another deployment signed `add_alien`'s run with.
ALIEN_KEY = b"another-deployment-signing-key-0123456789"


def add_alien(db: Path, run_id: str = "alien-1") -> None:
    """Write a shipping run signed with `ALIEN_KEY` into the kit's store (the newest run)."""

    async def write() -> None:
        async with SQLiteCheckpointStore(db) as store:
            await app.runner(store, ALIEN_KEY).run(shipping, Parcel(address="Oslo"), run_id=run_id)

    in_thread(write)
