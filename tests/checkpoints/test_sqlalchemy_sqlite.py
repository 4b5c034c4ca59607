"""SQLAlchemyCheckpointStore's SQLite fast path (`sqlalchemy._sqlite`): where each operation runs and what it commits.

Each store here opens its connections through ``async_creator``, with SQLite's trace
callback reporting every statement and the thread that ran it, so a test sees whether an
operation ran on the event loop's thread or on aiosqlite's, and which transactions it made.
The rules themselves are the conformance suite's and test_sqlalchemy.py's.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
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
    """A store over `path` whose connections report each statement as (thread id, SQL)."""

    path: Path
    same_thread: bool = False
    synchronous: str | None = None
    statements: list[tuple[int, str]] = field(default_factory=list)
    connections: list[aiosqlite.Connection] = field(default_factory=list)

    @property
    def opened(self) -> int:
        return len(self.connections)

    async def _connect(self) -> aiosqlite.Connection:
        conn = await aiosqlite.connect(self.path, check_same_thread=self.same_thread)
        if self.synchronous is not None:
            await conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        await conn.set_trace_callback(lambda sql: self.statements.append((threading.get_ident(), sql)))
        self.connections.append(conn)
        return conn

    def store(self, **options: object) -> SQLAlchemyCheckpointStore:
        url = f"sqlite+aiosqlite:///{self.path}"
        return SQLAlchemyCheckpointStore(url, engine_options={"async_creator": self._connect, **options})

    async def ran(self, operation: Callable[[], Awaitable[object]]) -> list[tuple[int, str]]:
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


def sql(ran: list[tuple[int, str]]) -> list[str]:
    return [statement for _, statement in ran]


async def test_each_hot_operation_runs_on_the_loop_thread_as_one_job(
    traced: Traced, store: SQLAlchemyCheckpointStore
) -> None:
    # Given a store whose tables are set up
    loop_thread = threading.get_ident()
    step0 = checkpoint("r", 0)
    started = SEALER.seal_call("r", 0, 0, "started", {"tool": "t"})
    done = SEALER.seal_call("r", 0, 1, "done", {"tool": "t"})
    operations: dict[str, Callable[[], Awaitable[object]]] = {
        "take_lease": lambda: store.take_lease("r", "w", "tok", 30),
        "save": lambda: store.save("r", 0, step0),
        "record_call": lambda: store.record_call("r", started),
        "save_after_calls": lambda: store.save_after_calls("r", 1, checkpoint("r", 1), [done]),
        "leases": lambda: store.leases(["r", "other"]),
        "latest": lambda: store.latest("r"),
        "head": lambda: store.head("r"),
        "renew_lease": lambda: store.renew_lease("r", "tok", 30),
        "release_lease": lambda: store.release_lease("r", "tok"),
    }
    for name, operation in operations.items():
        # When each hot operation of a run is made
        ran = await traced.ran(operation)
        # Then every statement ran on the event loop's thread (no round trip to aiosqlite's)
        assert ran and {thread for thread, _ in ran} == {loop_thread}, (name, ran)
        # And a write is one transaction, taking the write lock before it reads
        statements = sql(ran)
        if name in ("leases", "latest", "head"):
            assert not any(s.startswith(("BEGIN", "COMMIT")) for s in statements), (name, statements)
        else:
            begin = statements.index("BEGIN IMMEDIATE")
            assert statements.count("BEGIN IMMEDIATE") == 1 and statements.count("COMMIT") == 1, (name, statements)
            assert not any(s.startswith("SELECT") for s in statements[:begin]), (name, statements)
    # And one connection served them all, kept between operations
    assert traced.opened == 1


async def test_a_refused_write_rolls_back_and_keeps_its_connection(
    traced: Traced, store: SQLAlchemyCheckpointStore
) -> None:
    # Given a run at step 0
    await store.save("r", 0, checkpoint("r", 0))

    # When a save is refused by the rules (step 0 again)
    async def refused() -> None:
        with pytest.raises(CheckpointConflict, match="not next"):
            await store.save("r", 0, checkpoint("r", 0))

    ran = await traced.ran(refused)
    # Then its transaction was rolled back, not committed, and the connection is used again
    assert "ROLLBACK" in sql(ran) and "COMMIT" not in sql(ran)
    await store.save("r", 1, checkpoint("r", 1))
    assert (await store.latest("r")).step == 1
    assert traced.opened == 1


@pytest.mark.parametrize(("level", "lowered"), [("FULL", True), ("NORMAL", False), ("EXTRA", False)])
async def test_only_lease_commits_skip_the_flush_and_the_level_is_left_as_it_was(
    traced: Traced, level: str, lowered: bool
) -> None:
    # Given connections opened at a synchronous level of the user's choosing
    traced.synchronous = level
    async with traced.store() as store:
        await store.setup()
        # When a lease is taken and released, and a checkpoint saved
        lease_ops = sql(await traced.ran(lambda: store.take_lease("r", "w", "tok", 30)))
        lease_ops += sql(await traced.ran(lambda: store.release_lease("r", "tok")))
        save_ops = sql(await traced.ran(lambda: store.save("r", 0, checkpoint("r", 0))))
        # Then at FULL a lease's commit runs at NORMAL and FULL is set again right after it; at any
        # other level nothing is changed
        changes = [s for s in lease_ops if s.startswith("PRAGMA synchronous =")]
        assert changes == (["PRAGMA synchronous = NORMAL", "PRAGMA synchronous = FULL"] * 2 if lowered else [])
        if lowered:
            assert lease_ops.index("PRAGMA synchronous = NORMAL") < lease_ops.index("BEGIN IMMEDIATE")
            assert lease_ops.index("COMMIT") < lease_ops.index("PRAGMA synchronous = FULL")
        # And a save commits at the connection's own level, which is the same after all of them
        assert not any(s.startswith("PRAGMA synchronous") for s in save_ops)
        assert traced.opened == 1
        async with traced.connections[0].execute("PRAGMA synchronous") as cursor:
            assert await cursor.fetchone() == ({"NORMAL": 1, "FULL": 2, "EXTRA": 3}[level],)


async def test_a_write_waits_for_another_writers_lock_off_the_loop(
    traced: Traced, store: SQLAlchemyCheckpointStore
) -> None:
    # Given another connection (another process, say) holding the file's write lock
    loop_thread = threading.get_ident()
    other = sqlite3.connect(traced.path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        traced.statements.clear()
        # When the store saves
        saving = asyncio.create_task(store.save("r", 0, checkpoint("r", 0)))

        def waiting_off_the_loop() -> bool:
            return any(thread != loop_thread and s == "BEGIN IMMEDIATE" for thread, s in traced.statements)

        # Then its inline attempt gave up at once and the save waits on aiosqlite's thread, the
        # loop running meanwhile (this poll runs on it)
        await until(waiting_off_the_loop, "the save waiting for the lock on aiosqlite's thread")
        assert (loop_thread, "BEGIN IMMEDIATE") in traced.statements
        assert not saving.done()
        # And it lands once the lock is released
        other.execute("COMMIT")
        await saving
    finally:
        other.close()
    assert (await store.latest("r")).step == 0


async def test_a_write_cancelled_while_waiting_leaves_the_store_working(
    traced: Traced, store: SQLAlchemyCheckpointStore
) -> None:
    # Given a save waiting on aiosqlite's thread for a lock another connection holds
    loop_thread = threading.get_ident()
    other = sqlite3.connect(traced.path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        traced.statements.clear()
        saving = asyncio.create_task(store.save("r", 0, checkpoint("r", 0)))
        await until(
            lambda: any(t != loop_thread and s == "BEGIN IMMEDIATE" for t, s in traced.statements),
            "the save waiting for the lock on aiosqlite's thread",
        )
        # When the save is cancelled, and the lock then released
        saving.cancel()
        other.execute("COMMIT")
        with pytest.raises(asyncio.CancelledError):
            await saving
    finally:
        other.close()
    # Then the job handed to the thread ran to its end there (a cancelled write may land, as on
    # any store), its connection was not lent again but closed, and the store carries on
    # on a new connection
    assert (await store.latest("r")).step == 0
    await store.save("r", 1, checkpoint("r", 1))
    assert [c.step for c in await store.history("r")] == [0, 1]
    assert traced.opened == 2


async def test_a_connection_bound_to_its_thread_runs_every_job_there(traced: Traced) -> None:
    # Given connections opened with check_same_thread (only aiosqlite's thread may use them)
    traced.same_thread = True
    loop_thread = threading.get_ident()
    async with traced.store() as store:
        await store.setup()
        # When a run's writes and reads are made
        ran = await traced.ran(lambda: store.save("r", 0, checkpoint("r", 0)))
        ran += await traced.ran(lambda: store.take_lease("r", "w", "tok", 30))
        ran += await traced.ran(lambda: store.latest("r"))
        # Then each ran on aiosqlite's thread, one job each, and did what it should
        assert ran and loop_thread not in {thread for thread, _ in ran}
        assert sql(ran).count("BEGIN IMMEDIATE") == 2
        assert (await store.latest("r")).step == 0
        assert set(await store.leases(["r"])) == {"r"}
