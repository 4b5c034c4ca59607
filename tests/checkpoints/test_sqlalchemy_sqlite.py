"""SQLAlchemyCheckpointStore on SQLite: its transactions and how a writer meets another one's lock.

Each store here opens its connections through ``async_creator``, with SQLite's trace
callback reporting every statement, so a test sees which transactions an operation made.
The rules themselves are the conformance suite's and test_sqlalchemy.py's.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiosqlite
import pytest
from _kit.poll import until

from agentflow._errors import CheckpointConflict
from agentflow.exec.checkpoints import SealedCheckpoint
from agentflow.exec.checkpoints.sqlalchemy import SQLAlchemyCheckpointStore
from agentflow.exec.seal import Sealer

SEALER = Sealer(b"k" * 32)


def checkpoint(run_id: str, step: int, status: str = "running") -> SealedCheckpoint:
    return SEALER.seal_checkpoint(run_id, step, "f", status, 0, time.time(), {"step": step})


@dataclass
class Traced:
    """A store over `path` whose connections report each statement they run."""

    path: Path
    same_thread: bool = False
    statements: list[str] = field(default_factory=list)

    async def _connect(self) -> aiosqlite.Connection:
        conn = await aiosqlite.connect(self.path, check_same_thread=self.same_thread)
        await conn.set_trace_callback(self.statements.append)
        return conn

    def store(self) -> SQLAlchemyCheckpointStore:
        url = f"sqlite+aiosqlite:///{self.path}"
        return SQLAlchemyCheckpointStore(url, engine_options={"async_creator": self._connect})

    async def ran(self, operation: Callable[[], Awaitable[object]]) -> list[str]:
        """The statements `operation` ran."""
        self.statements.clear()
        await operation()
        return list(self.statements)


@pytest.fixture
def traced(tmp_path: Path) -> Traced:
    return Traced(tmp_path / "runs.db")


@pytest.fixture
async def store(traced: Traced) -> AsyncIterator[SQLAlchemyCheckpointStore]:
    async with traced.store() as opened:
        await opened.setup()
        yield opened


async def test_each_write_is_one_transaction_that_takes_the_write_lock_before_it_reads(
    traced: Traced, store: SQLAlchemyCheckpointStore
) -> None:
    # Given a store whose tables are set up
    started = SEALER.seal_call("r", 0, 0, "started", {"tool": "t"})
    done = SEALER.seal_call("r", 0, 1, "done", {"tool": "t"})
    writes: dict[str, Callable[[], Awaitable[object]]] = {
        "take_lease": lambda: store.take_lease("r", "w", "tok", 30),
        "save": lambda: store.save("r", 0, checkpoint("r", 0)),
        "record_call": lambda: store.record_call("r", started),
        "save_after_calls": lambda: store.save_after_calls("r", 1, checkpoint("r", 1), [done]),
        "renew_lease": lambda: store.renew_lease("r", "tok", 30),
        "release_lease": lambda: store.release_lease("r", "tok"),
    }
    for name, operation in writes.items():
        # When each write of a run is made
        statements = await traced.ran(operation)
        # Then it is one BEGIN IMMEDIATE transaction, committed, which reads nothing before the lock
        assert statements.count("BEGIN IMMEDIATE") == 1 and statements.count("COMMIT") == 1, (name, statements)
        begin = statements.index("BEGIN IMMEDIATE")
        assert not any(s.lstrip().startswith("SELECT") for s in statements[:begin]), (name, statements)
    assert (await store.latest("r")).step == 1


async def test_reads_take_no_write_lock(traced: Traced, store: SQLAlchemyCheckpointStore) -> None:
    # Given a run with a checkpoint and a lease
    await store.save("r", 0, checkpoint("r", 0))
    await store.take_lease("r", "w", "tok", 30)
    reads: dict[str, Callable[[], Awaitable[object]]] = {
        "latest": lambda: store.latest("r"),
        "head": lambda: store.head("r"),
        "leases": lambda: store.leases(["r", "other"]),
        "peek_markers": lambda: store.peek_markers(["agentflow/cancel/r"]),
    }
    for name, operation in reads.items():
        # When the hot reads of a run are made
        statements = await traced.ran(operation)
        # Then none of them waits for the write lock (a writer elsewhere does not hold them up)
        assert statements and "BEGIN IMMEDIATE" not in statements, (name, statements)


async def test_a_refused_write_rolls_back_and_the_store_carries_on(
    traced: Traced, store: SQLAlchemyCheckpointStore
) -> None:
    # Given a run at step 0
    await store.save("r", 0, checkpoint("r", 0))

    # When a save is refused by the rules (step 0 again)
    async def refused() -> None:
        with pytest.raises(CheckpointConflict, match="not next"):
            await store.save("r", 0, checkpoint("r", 0))

    statements = await traced.ran(refused)
    # Then its transaction was rolled back, not committed, and the next save lands
    assert "ROLLBACK" in statements and "COMMIT" not in statements
    await store.save("r", 1, checkpoint("r", 1))
    assert (await store.latest("r")).step == 1


async def test_a_write_waits_for_another_writers_lock_while_the_loop_runs(
    traced: Traced, store: SQLAlchemyCheckpointStore
) -> None:
    # Given another connection (another process, say) holding the file's write lock
    other = sqlite3.connect(traced.path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        traced.statements.clear()
        # When the store saves
        saving = asyncio.create_task(store.save("r", 0, checkpoint("r", 0)))
        # Then the save waits for the lock (busy timeout), the event loop running meanwhile (this poll runs on it)
        await until(lambda: "BEGIN IMMEDIATE" in traced.statements, "the save waiting for the write lock")
        assert not saving.done()
        # And it lands once the lock is released
        other.execute("COMMIT")
        await saving
    finally:
        other.close()
    assert (await store.latest("r")).step == 0


async def test_a_write_cancelled_while_waiting_for_the_lock_leaves_the_store_working(
    traced: Traced, store: SQLAlchemyCheckpointStore
) -> None:
    # Given a save waiting for a lock another connection holds
    other = sqlite3.connect(traced.path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        traced.statements.clear()
        saving = asyncio.create_task(store.save("r", 0, checkpoint("r", 0)))
        await until(lambda: "BEGIN IMMEDIATE" in traced.statements, "the save waiting for the write lock")
        # When the save is cancelled, and the lock then released
        saving.cancel()
        other.execute("COMMIT")
        with pytest.raises(asyncio.CancelledError):
            await saving
    finally:
        other.close()
    # Then the store carries on: the run's saves land, in order
    await store.save("r", 0, checkpoint("r", 0))
    await store.save("r", 1, checkpoint("r", 1))
    assert [c.step for c in await store.history("r")] == [0, 1]


async def test_a_connection_bound_to_its_thread_serves_every_operation(traced: Traced) -> None:
    # Given connections opened with check_same_thread (only aiosqlite's thread may use them)
    traced.same_thread = True
    async with traced.store() as store:
        # When a run's writes and reads are made
        await store.save("r", 0, checkpoint("r", 0))
        await store.take_lease("r", "w", "tok", 30)
        # Then each did what it should
        assert (await store.latest("r")).step == 0
        assert set(await store.leases(["r"])) == {"r"}
