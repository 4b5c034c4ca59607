"""SQLAlchemyCheckpointStore on SQLite (aiosqlite) and PostgreSQL (asyncpg): its own behaviour and failures.

The contract shared by every store is in test_conformance.py; here are the rules again on
both databases, plus what only this backend has: table prefixes, schema versions, URL
checks, clear connection errors, several event loops, and writers in several processes.
"""

from __future__ import annotations

import asyncio
import gc
import json
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _kit.stores import run_sql
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from agentflow._errors import CheckpointConflict, CheckpointError, CheckpointNotFound, CheckpointStoreCorrupt
from agentflow.exec.checkpoints import SealedCall, SealedCheckpoint
from agentflow.exec.checkpoints.records import LeaseMove
from agentflow.exec.checkpoints.sqlalchemy import MIGRATIONS, SQLAlchemyCheckpointStore
from agentflow.exec.seal import Sealer

SEALER = Sealer(b"k" * 32)
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Backend:
    """One database under test: where it is and how a store reaches this test's private part of it."""

    name: str
    url: str
    engine_options: dict[str, Any]

    def store(self, table_prefix: str = "agentflow_") -> SQLAlchemyCheckpointStore:
        return SQLAlchemyCheckpointStore(self.url, table_prefix=table_prefix, engine_options=self.engine_options)

    async def sql(self, statement: str) -> list[Any]:
        """Run raw SQL beside the store (to read or damage its tables)."""
        engine = create_async_engine(self.url, **self.engine_options)
        try:
            async with engine.begin() as conn:
                result = await conn.execute(text(statement))
                return list(result.all()) if result.returns_rows else []
        finally:
            await engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """A fresh SQLite file, or a fresh PostgreSQL schema (dropped afterwards) reached through search_path."""
    if request.param == "sqlite":
        yield Backend("sqlite", f"sqlite+aiosqlite:///{tmp_path / 'runs.db'}", {})
        return
    url: str = request.getfixturevalue("postgres_url")  # skips (or fails under CI) when PostgreSQL is down
    schema = f"t_{uuid.uuid4().hex}"
    asyncio.run(run_sql(url, f"CREATE SCHEMA {schema}"))
    try:
        yield Backend("postgres", url, {"connect_args": {"server_settings": {"search_path": schema}}})
    finally:
        asyncio.run(run_sql(url, f"DROP SCHEMA {schema} CASCADE"))


@pytest.fixture
async def store(backend: Backend) -> AsyncIterator[SQLAlchemyCheckpointStore]:
    async with backend.store() as opened:
        yield opened


def checkpoint(
    run_id: str, step: int, status: str = "running", *, flow: str = "f", segment: int = 0, saved_at: float = 0.0
) -> SealedCheckpoint:
    return SEALER.seal_checkpoint(run_id, step, flow, status, segment, saved_at or time.time(), {"step": step})


def record(run_id: str, segment: int, seq: int, kind: str = "started") -> SealedCall:
    return SEALER.seal_call(run_id, segment, seq, kind, {"tool": "t", "seq": seq})


async def save_steps(
    store: SQLAlchemyCheckpointStore, run_id: str, *statuses: str, flow: str = "f"
) -> list[SealedCheckpoint]:
    rows = [checkpoint(run_id, step, status, flow=flow) for step, status in enumerate(statuses)]
    for row in rows:
        await store.save(run_id, row.step, row)
    return rows


# -- compare-and-set -------------------------------------------------------------------


async def test_step_zero_only_for_a_new_run(store: SQLAlchemyCheckpointStore) -> None:
    # Given a store that has never seen run "r"
    # When its first save is step 1
    # Then it is refused, and nothing is stored
    with pytest.raises(CheckpointConflict, match="no step 0"):
        await store.save("r", 1, checkpoint("r", 1))
    with pytest.raises(CheckpointNotFound):
        await store.latest("r")
    # When step 0 is saved, and then step 0 once more
    await store.save("r", 0, checkpoint("r", 0))
    # Then the second step 0 is refused: the run exists
    with pytest.raises(CheckpointConflict, match="not next"):
        await store.save("r", 0, checkpoint("r", 0))


async def test_each_save_is_exactly_one_past_the_latest(store: SQLAlchemyCheckpointStore) -> None:
    # Given a run at step 0
    await save_steps(store, "r", "running")
    # When a writer skips ahead to step 2, Then it conflicts
    with pytest.raises(CheckpointConflict, match="step 2 is not next"):
        await store.save("r", 2, checkpoint("r", 2))
    # When step 1 is saved, Then it is the latest
    await store.save("r", 1, checkpoint("r", 1))
    assert (await store.latest("r")).step == 1


@pytest.mark.parametrize("ended", ["done", "cancelled"])
async def test_an_ended_run_takes_no_more_saves(store: SQLAlchemyCheckpointStore, ended: str) -> None:
    # Given a run that ended at step 1
    await save_steps(store, "r", "running", ended)
    # When anyone saves step 2
    # Then it conflicts, naming how the run ended
    with pytest.raises(CheckpointConflict, match=f"ended \\({ended}\\) at step 1"):
        await store.save("r", 2, checkpoint("r", 2))


async def test_a_run_never_changes_flow(store: SQLAlchemyCheckpointStore) -> None:
    # Given a run of flow "f"
    await save_steps(store, "r", "running")
    # When step 1 comes from flow "g"
    # Then it conflicts: the run belongs to "f"
    with pytest.raises(CheckpointConflict, match="belongs to flow 'f', not 'g'"):
        await store.save("r", 1, checkpoint("r", 1, flow="g"))


async def test_a_row_for_another_run_or_step_is_refused(store: SQLAlchemyCheckpointStore) -> None:
    # Given rows sealed for other arguments
    # When they are saved under run "r" step 0
    # Then they are refused before anything is written
    with pytest.raises(ValueError):
        await store.save("r", 0, checkpoint("other", 0))
    with pytest.raises(ValueError):
        await store.save("r", 0, checkpoint("r", 1))
    assert await store.history("r") == []


# -- call log --------------------------------------------------------------------------


async def test_a_stale_started_record_is_fenced(store: SQLAlchemyCheckpointStore) -> None:
    # Given worker A holds the run with segment 0 and starts a call
    await store.save("r", 0, checkpoint("r", 0, segment=0))
    await store.record_call("r", record("r", 0, 0))
    # When worker B claims the run with segment 1
    await store.save("r", 1, checkpoint("r", 1, segment=1))
    # Then A may not start another call...
    with pytest.raises(CheckpointConflict, match="segment 0 was fenced off by segment 1"):
        await store.record_call("r", record("r", 0, 1))
    # ...but may still close the one it started, and B starts calls in its own segment
    await store.record_call("r", record("r", 0, 1, kind="done"))
    await store.record_call("r", record("r", 1, 0))
    assert [(c.segment, c.seq, c.kind) for c in await store.calls("r")] == [
        (0, 0, "started"),
        (0, 1, "done"),
        (1, 0, "started"),
    ]


async def test_no_call_starts_after_the_run_ended(store: SQLAlchemyCheckpointStore) -> None:
    # Given a run that is done
    await save_steps(store, "r", "done")
    # When a call starts, Then it is refused
    with pytest.raises(CheckpointConflict, match="ended"):
        await store.record_call("r", record("r", 0, 0))


async def test_call_records_are_numbered_per_segment_without_gaps(store: SQLAlchemyCheckpointStore) -> None:
    # Given a run at step 0 (segment 0), When a call is logged before its run exists, Then not found
    with pytest.raises(CheckpointNotFound):
        await store.record_call("r", record("r", 0, 0))
    await save_steps(store, "r", "running")
    # When the first record is numbered 1, Then it leaves a gap and is refused
    with pytest.raises(CheckpointConflict, match="out of sequence"):
        await store.record_call("r", record("r", 0, 1))
    # When 0 and 1 are logged, Then 1 again (taken) and 3 (gap) are refused
    await store.record_call("r", record("r", 0, 0))
    await store.record_call("r", record("r", 0, 1, kind="done"))
    for seq in (1, 3):
        with pytest.raises(CheckpointConflict, match="out of sequence"):
            await store.record_call("r", record("r", 0, seq, kind="done"))
    # Then the records come back ordered and unchanged (their signatures still check)
    stored = await store.calls("r")
    assert [(c.segment, c.seq) for c in stored] == [(0, 0), (0, 1)]
    assert [SEALER.open_call(c, "r")["seq"] for c in stored] == [0, 1]


# -- reading ---------------------------------------------------------------------------


async def test_history_is_kept_and_latest_is_the_newest(store: SQLAlchemyCheckpointStore) -> None:
    # Given five saves of one run
    rows = await save_steps(store, "r", "running", "running", "paused", "running", "done")
    # When history and latest are read
    history = await store.history("r")
    latest = await store.latest("r")
    # Then every row is kept, oldest first, exactly as written; latest is the last one
    assert list(history) == rows
    assert latest == rows[-1]
    assert SEALER.open_checkpoint(latest, "r") == {"step": 4}
    assert await store.history("unknown") == []
    with pytest.raises(CheckpointNotFound):
        await store.latest("unknown")


async def test_list_unfinished_and_list_runs(store: SQLAlchemyCheckpointStore) -> None:
    # Given runs of flow "f" that are running, paused and done, and a running run of flow "g"
    now = time.time()
    for run_id, status, flow, age in [("a", "running", "f", 3), ("b", "paused", "f", 2), ("c", "done", "f", 1),
                                      ("d", "running", "g", 0)]:  # fmt: skip
        await store.save(run_id, 0, checkpoint(run_id, 0, status, flow=flow, saved_at=now - age))
    # When the unfinished runs of "f" are listed, Then they are the running and paused ones
    assert sorted(await store.list_unfinished("f")) == ["a", "b"]
    assert await store.list_unfinished("nobody") == []
    # When runs are listed, Then newest first, filtered by flow and cut at the limit
    assert [c.run_id for c in await store.list_runs()] == ["d", "c", "b", "a"]
    assert [c.run_id for c in await store.list_runs("f")] == ["c", "b", "a"]
    assert [c.run_id for c in await store.list_runs(limit=2)] == ["d", "c"]
    assert await store.list_runs(limit=0) == []
    # Then a run listed shows its latest checkpoint
    await store.save("a", 1, checkpoint("a", 1, "paused", saved_at=now + 1))
    assert [(c.run_id, c.step) for c in await store.list_runs("f", limit=1)] == [("a", 1)]


async def test_delete_forgets_checkpoints_and_calls(store: SQLAlchemyCheckpointStore) -> None:
    # Given a run with checkpoints and calls, and another run
    await save_steps(store, "r", "running", "running")
    await store.record_call("r", record("r", 0, 0))
    await save_steps(store, "other", "running")
    # When "r" is deleted (twice: the second time there is nothing to delete)
    await store.delete("r")
    await store.delete("r")
    # Then nothing of it is left, the other run is untouched, and "r" can start afresh at step 0
    with pytest.raises(CheckpointNotFound):
        await store.latest("r")
    assert await store.history("r") == [] and await store.calls("r") == []
    assert [c.run_id for c in await store.list_runs()] == ["other"]
    await store.save("r", 0, checkpoint("r", 0))


# -- tenants and schema ----------------------------------------------------------------


async def test_table_prefixes_isolate_tenants(backend: Backend) -> None:
    # Given two tenants in the same database, with different table prefixes
    async with backend.store("tenant_a_") as a, backend.store("tenant_b_") as b:
        # When both save a run with the same id, in different flows
        await a.save("r", 0, checkpoint("r", 0, flow="fa"))
        await b.save("r", 0, checkpoint("r", 0, flow="fb"))
        await b.save("r", 1, checkpoint("r", 1, flow="fb"))
        # Then each sees only its own
        assert [c.step for c in await a.history("r")] == [0]
        assert (await b.latest("r")).flow == "fb"
        assert await a.list_unfinished("fb") == []
        await a.delete("r")
        assert (await b.latest("r")).step == 1
    tables = {row[0] for row in await backend.sql(_TABLES_SQL[backend.name])}
    assert {f"tenant_{t}_{n}" for t in "ab" for n in ("meta", "checkpoints", "runs", "calls")} <= tables


_TABLES_SQL = {
    "sqlite": "SELECT name FROM sqlite_master WHERE type = 'table'",
    "postgres": "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()",
}


async def test_schema_version_is_recorded(backend: Backend) -> None:
    # Given a store on an empty database
    async with backend.store() as store:
        # When it is first used
        await store.list_runs()
        await store.setup()  # and set up again: nothing to do
    # Then the meta table records how many migrations ran
    assert await backend.sql("SELECT value FROM agentflow_meta WHERE key = 'schema_version'") == [
        (str(len(MIGRATIONS)),)
    ]


async def test_a_newer_schema_version_is_refused(backend: Backend) -> None:
    # Given tables that a newer agentflow migrated further
    async with backend.store() as store:
        await save_steps(store, "r", "running")
    newer = len(MIGRATIONS) + 1
    await backend.sql(f"UPDATE agentflow_meta SET value = '{newer}' WHERE key = 'schema_version'")
    # When this agentflow opens them
    async with backend.store() as store:
        # Then it refuses, naming the store and both versions
        with pytest.raises(CheckpointStoreCorrupt, match=f"schema version {newer}.*up to {len(MIGRATIONS)}") as caught:
            await store.latest("r")
    assert "SQLAlchemyCheckpointStore(" in str(caught.value)


async def test_tables_of_schema_version_4_gain_the_markers_table_and_drop_markers_kept_as_leases(
    backend: Backend,
) -> None:
    # Given tables at schema version 4 (before the markers table) whose leases table holds a real
    # run's lease, one of a run whose id differs from the markers' only in case, and two markers
    # kept there as leases of ids under agentflow/
    async with backend.store() as store:
        await save_steps(store, "r", "running")
        held = await store.take_lease("r", "A", "token-r", 3600)
        other = await store.take_lease("Agentflow/r", "B", "token-b", 3600)
    await backend.sql("DROP TABLE agentflow_markers")
    await backend.sql("UPDATE agentflow_meta SET value = '4' WHERE key = 'schema_version'")
    for run_id in ("agentflow/cancel/r", "agentflow/sweep"):
        await backend.sql(f"INSERT INTO agentflow_leases VALUES ('{run_id}', 'C', 'token-c', 9999999999.0)")
    # When this agentflow uses them and puts a marker
    async with backend.store() as store:
        marker = await store.put_marker("cancel/r", "please", "token-m", 60)
        # Then the marker is kept, the runs' leases are held as before, and the run's rows are kept
        assert await store.peek_markers(["cancel/r"]) == {"cancel/r": marker}
        assert await store.leases(["r", "Agentflow/r"]) == {"r": held, "Agentflow/r": other}
        assert (await store.latest("r")).step == 0
    # And the schema is current, the old markers are gone from the leases table, the new one is in its own
    assert await backend.sql("SELECT value FROM agentflow_meta WHERE key = 'schema_version'") == [
        (str(len(MIGRATIONS)),)
    ]
    assert await backend.sql("SELECT run_id FROM agentflow_leases ORDER BY run_id") == [("Agentflow/r",), ("r",)]
    assert await backend.sql("SELECT key, value, token FROM agentflow_markers") == [("cancel/r", "please", "token-m")]


async def test_a_save_whose_events_cannot_be_appended_after_it_is_still_a_stored_save(
    backend: Backend, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a run whose holder gives its lease up with its next save, carrying the run's events,
    # and an events table that refuses the append that follows the save's transaction
    async with backend.store() as store:
        await save_steps(store, "r", "running")
        held = await store.take_lease("r", "A", "token-r", 3600)

        async def refused(run_id: str, events: Any) -> None:
            raise ConnectionError("the events append was cut off")

        monkeypatch.setattr(store._events, "append", refused)
        event = Sealer(b"k" * 32).seal_event("r", {"pos": ["w", 0], "events": [["n", 1.0, {}]]})
        # When the save is made, Then it returns: the step is stored and the lease free, as the caller is told
        await store.save_after_calls_moving(
            "r", 1, checkpoint("r", 1), [], LeaseMove(held.token, None, "A", 30), [event]
        )
        assert (await store.latest("r")).step == 1 and await store.leases(["r"]) == {}
    # And the lost events are logged, naming the run and the step
    assert any("'r': step 1 saved, but its 1 event entries" in r.getMessage() for r in caplog.records)


async def test_tables_of_schema_version_5_gain_the_writes_that_move_a_lease(backend: Backend) -> None:
    # Given tables at schema version 5, before a write could move a lease (on PostgreSQL: no write_moving function)
    async with backend.store() as store:
        await save_steps(store, "r", "running")
        held = await store.take_lease("r", "A", "token-r", 3600)
    if backend.name == "postgres":
        await backend.sql("DROP FUNCTION agentflow_write_moving")
    await backend.sql("UPDATE agentflow_meta SET value = '5' WHERE key = 'schema_version'")
    # When this agentflow opens them and saves a step giving the lease up with it
    async with backend.store() as store:
        step = checkpoint("r", 1)
        await store.save_after_calls_moving("r", 1, step, [], LeaseMove(held.token, None, "A", 30))
        # Then the step is saved and the lease is free, and the schema is current
        assert (await store.latest("r")).step == 1 and await store.leases(["r"]) == {}
    assert await backend.sql("SELECT value FROM agentflow_meta WHERE key = 'schema_version'") == [
        (str(len(MIGRATIONS)),)
    ]


async def test_a_marker_row_of_the_wrong_type_is_corrupt(store: SQLAlchemyCheckpointStore, backend: Backend) -> None:
    await store.put_marker("k", "v", "t", 60)
    # Given a marker whose value no longer is text (a blob on SQLite, NULL on PostgreSQL)
    for statement in _MARKER_DAMAGE[backend.name]:
        await backend.sql(statement)
    # When it is read, Then it is corrupt, naming the key and the column
    with pytest.raises(CheckpointStoreCorrupt, match=r"marker row 'k' is unreadable: value is"):
        await store.peek_markers(["k"])


_MARKER_DAMAGE = {
    "sqlite": ["UPDATE agentflow_markers SET value = X'6B' WHERE key = 'k'"],
    "postgres": [
        "ALTER TABLE agentflow_markers ALTER COLUMN value DROP NOT NULL",
        "UPDATE agentflow_markers SET value = NULL WHERE key = 'k'",
    ],
}


async def test_a_latest_pointer_changed_by_hand_is_mended_by_relist(
    store: SQLAlchemyCheckpointStore, backend: Backend
) -> None:
    # Given a run whose latest pointer was changed by hand to a step that is not stored
    rows = await save_steps(store, "r", "running")
    await backend.sql("UPDATE agentflow_runs SET step = 7 WHERE run_id = 'r'")
    # When its latest checkpoint is read, Then it is the newest stored row: latest reads the rows
    assert await store.latest("r") == rows[0]
    # And the run is stuck until relisted: the compare-and-set reads the pointer
    with pytest.raises(CheckpointConflict, match="latest is 7"):
        await store.save("r", 1, checkpoint("r", 1))
    # When it is relisted, Then the pointer names the newest row again and the run carries on
    assert await store.relist("r") == rows[0]
    assert await backend.sql("SELECT step FROM agentflow_runs WHERE run_id = 'r'") == [(0,)]
    await store.save("r", 1, checkpoint("r", 1))
    assert (await store.latest("r")).step == 1


async def test_an_unreadable_row_is_reported_as_corrupt(store: SQLAlchemyCheckpointStore, backend: Backend) -> None:
    await save_steps(store, "r", "running")
    # Given a row whose field no longer has its type
    for statement in _DAMAGE[backend.name]:
        await backend.sql(statement)
    # When it is read, Then it is corrupt too
    with pytest.raises(CheckpointStoreCorrupt, match="run 'r' is unreadable"):
        await store.history("r")


_DAMAGE = {
    "sqlite": ["UPDATE agentflow_checkpoints SET kid = X'6B' WHERE run_id = 'r'"],  # a blob in a TEXT column
    "postgres": [
        "ALTER TABLE agentflow_checkpoints ALTER COLUMN kid DROP NOT NULL",
        "UPDATE agentflow_checkpoints SET kid = NULL WHERE run_id = 'r'",
    ],
}


# -- construction and connection errors ------------------------------------------------


@pytest.mark.parametrize(
    ("url", "suggested"),
    [
        ("postgresql://u:secret@db.example/app", "postgresql+asyncpg://u:***@db.example/app"),
        ("postgresql+psycopg2://u:secret@db.example/app", "postgresql+asyncpg://u:***@db.example/app"),
        ("postgres://u:secret@db.example/app", "postgresql+asyncpg://u:***@db.example/app"),
        ("sqlite:///runs.db", "sqlite+aiosqlite:///runs.db"),
    ],
)
def test_a_sync_url_is_refused_with_the_async_form(url: str, suggested: str) -> None:
    # Given a URL with a sync driver
    # When a store is built on it
    # Then a ValueError says how to write it, without the password
    with pytest.raises(ValueError, match="async driver") as caught:
        SQLAlchemyCheckpointStore(url)
    assert suggested in str(caught.value)
    assert "secret" not in str(caught.value)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("not a url", "needs a database URL"),
        ("mysql+aiomysql://u:secret@db/app", "supports PostgreSQL and SQLite"),
        ("sqlite+aiosqlite://", "needs a SQLite file"),
        ("sqlite+aiosqlite:///:memory:", "needs a SQLite file"),
    ],
)
def test_other_urls_are_refused(url: str, message: str) -> None:
    # Given a URL this store cannot use, When a store is built on it, Then a ValueError says why
    with pytest.raises(ValueError, match=message) as caught:
        SQLAlchemyCheckpointStore(url)
    assert "secret" not in str(caught.value)


@pytest.mark.parametrize("prefix", ["", "Tenant_", "1x", "a-b", "a b", "x" * 41, "drop table;"])
def test_a_table_prefix_must_be_a_plain_name(prefix: str) -> None:
    # Given a prefix that is not a plain lower-case SQL name, When used, Then ValueError
    with pytest.raises(ValueError, match="table_prefix"):
        SQLAlchemyCheckpointStore("sqlite+aiosqlite:///runs.db", table_prefix=prefix)


async def test_an_unreachable_server_gives_one_clear_error() -> None:
    # Given a store pointed at a port where nothing listens
    store = SQLAlchemyCheckpointStore("postgresql+asyncpg://postgres:secret@127.0.0.1:1/test")
    try:
        # When it is used
        with pytest.raises(CheckpointError) as caught:
            await store.latest("r")
    finally:
        await store.aclose()
    # Then one CheckpointError names the server (password hidden) and the reason
    assert type(caught.value) is CheckpointError
    message = str(caught.value)
    assert message.startswith(
        "SQLAlchemyCheckpointStore cannot reach postgresql+asyncpg://postgres:***@127.0.0.1:1/test: "
    )
    assert "Connect call failed" in message and "secret" not in message


@pytest.mark.postgres
async def test_a_missing_database_gives_one_clear_error(postgres_url: str) -> None:
    # Given a store pointed at a database that does not exist
    missing = f"agentflow_missing_{uuid.uuid4().hex[:8]}"
    url = postgres_url.rsplit("/", 1)[0] + f"/{missing}"
    # When it is used, Then one CheckpointError says so
    async with SQLAlchemyCheckpointStore(url) as store:
        with pytest.raises(CheckpointError, match=f'cannot reach .*/{missing}: database "{missing}" does not exist'):
            await store.list_runs()


def test_a_missing_sqlite_directory_gives_one_clear_error(tmp_path: Path) -> None:
    # Given a SQLite file in a directory that does not exist
    store = SQLAlchemyCheckpointStore(f"sqlite+aiosqlite:///{tmp_path / 'nope' / 'runs.db'}")

    async def use() -> None:
        async with store:
            await store.list_runs()

    # When it is used, Then one CheckpointError says the directory is missing
    with pytest.raises(CheckpointError, match=f"cannot reach .*: no directory {tmp_path / 'nope'}"):
        asyncio.run(use())


# -- event loops -----------------------------------------------------------------------


def test_the_store_works_across_asyncio_run_calls(backend: Backend) -> None:
    # Given one store object
    store = backend.store()
    # When it is used from one asyncio.run, then from another (without aclose in between)
    asyncio.run(store.save("r", 0, checkpoint("r", 0)))
    asyncio.run(store.save("r", 1, checkpoint("r", 1)))

    async def read_and_close() -> list[int]:
        async with store:
            return [c.step for c in await store.history("r")]

    # Then each loop gets a working engine (and each is disposed when its loop ends)
    assert asyncio.run(read_and_close()) == [0, 1]
    gc.collect()  # an engine left open by a finished loop would warn here


def test_a_loop_closed_without_shutdown_is_left_behind(tmp_path: Path) -> None:
    # Given a store used on a loop that was closed by hand, without shutting down its generators
    # (SQLite: its connections live on threads, so the next loop can still close them)
    store = SQLAlchemyCheckpointStore(f"sqlite+aiosqlite:///{tmp_path / 'runs.db'}")
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(store.save("r", 0, checkpoint("r", 0)))
    finally:
        loop.close()

    async def use_and_close() -> list[int]:
        async with store:
            return [c.step for c in await store.history("r")]

    # When it is used from a new loop
    # Then it works, and the old loop's engine is disposed without warnings
    assert asyncio.run(use_and_close()) == [0]
    gc.collect()  # an undisposed connection would warn here


# only the PostgreSQL fast path installs functions
@pytest.mark.parametrize("backend", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
async def test_dropping_the_tables_drops_the_functions(backend: Backend) -> None:
    # Given a tenant's tables, set up with their functions
    async with backend.store("t_") as store:
        await store.setup()
    functions = "SELECT proname FROM pg_proc WHERE pronamespace = current_schema()::regnamespace ORDER BY proname"
    assert await backend.sql(functions) == [("t_release_lease",), ("t_take_lease",), ("t_write",), ("t_write_moving",)]
    # When the tables are dropped by prefix, as the tests and the benchmarks drop them (CASCADE)
    for table in ("meta", "checkpoints", "runs", "calls", "leases", "events"):
        await backend.sql(f"DROP TABLE IF EXISTS t_{table} CASCADE")
    # Then no function is left behind
    assert await backend.sql(functions) == []


async def test_a_pool_of_one_connection_serves_every_operation(backend: Backend) -> None:
    # Given a store whose pool holds one connection and may open no other (and gives up after 2 s)
    options = backend.engine_options | {"pool_size": 1, "max_overflow": 0, "pool_timeout": 2}
    store = SQLAlchemyCheckpointStore(backend.url, engine_options=options)
    async with store:
        # When the one-round-trip operations (which keep their connection for the next one) and
        # the transactions (listings, relist, delete) take turns, and several run at once
        await save_steps(store, "r", "running")
        await store.record_call("r", record("r", 0, 0))
        assert (await store.list_runs())[0].run_id == "r"
        await store.take_lease("r", "A", "token", 30)
        assert await store.relist("r") is not None
        await asyncio.gather(*(store.latest("r") for _ in range(5)), store.history("r"), store.leases(["r"]))
        await store.save_after_calls("r", 1, checkpoint("r", 1), [record("r", 0, 1, "done")])
        # Then none waited for a connection the store kept for itself
        assert [c.step for c in await store.history("r")] == [0, 1]
        await store.delete("r")
        assert await store.stored_runs() == []


async def test_the_store_can_be_used_again_after_aclose(backend: Backend) -> None:
    # Given a store that was closed
    store = backend.store()
    async with store:
        await save_steps(store, "r", "running")
    # When it is used again, Then it reconnects
    await store.save("r", 1, checkpoint("r", 1))
    assert (await store.latest("r")).step == 1
    await store.aclose()


async def test_coroutines_racing_for_one_step_one_wins(store: SQLAlchemyCheckpointStore) -> None:
    # Given a run at step 0, and one new run id
    await save_steps(store, "old", "running")
    # When 10 coroutines each save step 1 of the old run and step 0 of the new one at once
    old = [store.save("old", 1, checkpoint("old", 1, segment=1)) for _ in range(10)]
    new = [store.save("new", 0, checkpoint("new", 0)) for _ in range(10)]
    results = await asyncio.gather(*old, *new, return_exceptions=True)
    # Then exactly one of each wins; the others conflict
    for batch in (results[:10], results[10:]):
        assert sum(r is None for r in batch) == 1
        assert all(isinstance(r, CheckpointConflict) for r in batch if r is not None), batch


# -- processes -------------------------------------------------------------------------

RACER = """
import asyncio, json, sys, time
from pathlib import Path
from agentflow._errors import CheckpointConflict
from agentflow.exec.seal import Sealer
from agentflow.exec.checkpoints.sqlalchemy import SQLAlchemyCheckpointStore

async def attempt(store, run_id, step, me):
    row = Sealer(b"k" * 32).seal_checkpoint(run_id, step, "race", "running", step, time.time(), {"racer": me})
    try:
        await store.save(run_id, step, row)
    except CheckpointConflict:
        return "conflict"
    return "won"

async def main(url, options, gate, me):
    old = SQLAlchemyCheckpointStore(url, engine_options=options)
    fresh = SQLAlchemyCheckpointStore(url, table_prefix="fresh_", engine_options=options)  # tables not made yet
    await old.history("old")  # connected before the start
    (gate / f"ready-{me}").touch()
    while not (gate / "go").exists():
        await asyncio.sleep(0.001)
    results = await asyncio.gather(attempt(old, "old", 1, me), attempt(fresh, "new", 0, me))
    await old.aclose()
    await fresh.aclose()
    print(json.dumps(results))

url, options, gate, me = sys.argv[1:]
asyncio.run(main(url, json.loads(options), Path(gate), int(me)))
"""


@pytest.mark.slow
def test_processes_racing_for_one_step_one_wins(backend: Backend, tmp_path: Path) -> None:
    # Given a run at step 0, and a table prefix no process has set up yet
    async def prepare() -> None:
        async with backend.store() as store:
            await store.save("old", 0, checkpoint("old", 0, flow="race"))

    asyncio.run(prepare())
    script, gate = tmp_path / "racer.py", tmp_path / "gate"
    script.write_text(RACER)
    gate.mkdir()
    # When 4 processes, released together, each save step 1 of that run and step 0 of a new
    # run under the new prefix (so they also race to create its tables)
    argv = [str(script), backend.url, json.dumps(backend.engine_options), str(gate)]
    racers = [
        subprocess.Popen([sys.executable, *argv, str(i)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for i in range(4)
    ]
    try:
        deadline = time.monotonic() + 60
        while len(list(gate.glob("ready-*"))) < 4 and time.monotonic() < deadline:
            assert all(r.poll() is None for r in racers), [r.communicate() for r in racers if r.poll() is not None]
            time.sleep(0.01)
        (gate / "go").touch()
        outputs = [r.communicate(timeout=60) for r in racers]
    finally:
        for r in racers:
            r.kill()
    assert all(r.returncode == 0 for r in racers), [err.decode() for _, err in outputs]
    results = [json.loads(out) for out, _ in outputs]
    # Then exactly one process wins each save, and the others get CheckpointConflict
    for which in (0, 1):
        assert sorted(r[which] for r in results) == ["conflict"] * 3 + ["won"], results
    winner = next(i for i, r in enumerate(results) if r[0] == "won")

    async def check() -> None:
        async with backend.store() as old, backend.store("fresh_") as fresh:
            assert SEALER.open_checkpoint(await old.latest("old"), "old") == {"racer": winner}
            assert [c.step for c in await fresh.history("new")] == [0]

    asyncio.run(check())


async def test_head_is_the_latest_checkpoint_and_the_records_per_segment(store: SQLAlchemyCheckpointStore) -> None:
    # Given a run with two checkpoints, two records in segment 0 and one in segment 1
    await store.save("h1", 0, checkpoint("h1", 0))
    await store.record_call("h1", record("h1", 0, 0))
    await store.record_call("h1", record("h1", 0, 1, "done"))
    await store.save("h1", 1, checkpoint("h1", 1, segment=1))
    await store.record_call("h1", record("h1", 1, 0))
    # When its head is read, Then it is the latest checkpoint and the count of each segment
    latest, counts = await store.head("h1")
    assert latest == await store.latest("h1")
    assert counts == {0: 2, 1: 1}
    # And an unknown run is not found
    with pytest.raises(CheckpointNotFound):
        await store.head("nobody")
