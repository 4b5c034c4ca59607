"""SQLiteCheckpointStore: the SQLite-only behaviour (WAL, schema versions, threads, processes) and its rules."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import closing, contextmanager
from functools import partial
from pathlib import Path
from typing import Literal

import pytest

from agentflow._errors import CheckpointConflict, CheckpointNotFound, CheckpointStoreCorrupt
from agentflow.exec.checkpoints import SealedCall, SealedCheckpoint
from agentflow.exec.checkpoints.sqlite import MIGRATIONS, SQLiteCheckpointStore
from agentflow.exec.checkpoints.sqlite.file import unflushed
from agentflow.exec.seal import Sealer

SEALER = Sealer(b"k" * 32)
REPO = Path(__file__).resolve().parents[2]


def checkpoint(
    run_id: str,
    step: int,
    *,
    flow: str = "f",
    status: str = "running",
    segment: int = 0,
    saved_at: float | None = None,
) -> SealedCheckpoint:
    when = 1_000.5 + step if saved_at is None else saved_at
    return SEALER.seal_checkpoint(run_id, step, flow, status, segment, when, {"step": step})


def call(run_id: str, segment: int, seq: int, kind: str = "started") -> SealedCall:
    return SEALER.seal_call(run_id, segment, seq, kind, {"seq": seq})


@contextmanager
def raw(path: Path) -> Iterator[sqlite3.Connection]:
    """A plain sqlite3 connection, to look at or tamper with the file behind the store's back."""
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        yield conn


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "runs.db"


@pytest.fixture
async def sqlite_store(db_path: Path) -> AsyncIterator[SQLiteCheckpointStore]:
    async with SQLiteCheckpointStore(db_path) as store:
        yield store


# -- opening the file -------------------------------------------------------------------


async def test_wal_mode_is_on(sqlite_store: SQLiteCheckpointStore, db_path: Path) -> None:
    # Given a store that has been used once
    await sqlite_store.save("r", 0, checkpoint("r", 0))
    # Then the file is in WAL mode (a property of the file, so any connection sees it)
    with raw(db_path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


@pytest.mark.parametrize(("synchronous", "expected"), [("FULL", 2), ("NORMAL", 1)])
async def test_connection_settings_are_applied(
    db_path: Path, synchronous: Literal["NORMAL", "FULL"], expected: int
) -> None:
    async with SQLiteCheckpointStore(db_path, busy_timeout_s=2.5, synchronous=synchronous) as store:
        # `_run` executes on the store's own connection: these pragmas are per connection.
        assert await store._run(lambda c: c.execute("PRAGMA synchronous").fetchone()[0]) == expected
        assert await store._run(lambda c: c.execute("PRAGMA busy_timeout").fetchone()[0]) == 2500


@pytest.mark.parametrize(("synchronous", "expected"), [("FULL", 2), ("NORMAL", 1)])
async def test_lease_writes_leave_the_synchronous_level_as_set(
    db_path: Path, synchronous: Literal["NORMAL", "FULL"], expected: int
) -> None:
    # Given a store whose lease commits do not wait for the disk (a lease matters to live processes only)
    async with SQLiteCheckpointStore(db_path, synchronous=synchronous) as store:
        await store._run(lambda c: None)  # the schema is in place: statements run inline from now on
        # When a lease is taken, renewed and released, inline and on the worker thread
        await store.take_lease("r", "A", "token", 30)
        await store.renew_lease("r", "token", 30)
        await store._run(partial(unflushed, job=lambda c: None, level=synchronous))
        assert await store.release_lease("r", "token")
        # Then both connections are back at the store's level for the saves and records that follow
        assert store._inline_connection().execute("PRAGMA synchronous").fetchone()[0] == expected
        assert await store._run(lambda c: c.execute("PRAGMA synchronous").fetchone()[0]) == expected


async def test_schema_version_is_recorded(sqlite_store: SQLiteCheckpointStore, db_path: Path) -> None:
    await sqlite_store.list_runs()
    with raw(db_path) as conn:
        version = conn.execute("SELECT value FROM agentflow_meta WHERE key = 'schema_version'").fetchone()[0]
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert version == str(len(MIGRATIONS))
    assert {"agentflow_meta", "checkpoints", "runs", "calls"} <= tables


async def test_database_from_a_newer_agentflow_is_refused(db_path: Path) -> None:
    # Given a database whose schema version is past what this code knows
    async with SQLiteCheckpointStore(db_path) as store:
        await store.list_runs()
    with raw(db_path) as conn:
        conn.execute("UPDATE agentflow_meta SET value = ? WHERE key = 'schema_version'", (str(len(MIGRATIONS) + 1),))
    # When a store opens it, Then it refuses, naming the file and the cause
    async with SQLiteCheckpointStore(db_path) as store:
        with pytest.raises(CheckpointStoreCorrupt, match="newer agentflow") as caught:
            await store.list_runs()
    assert str(db_path) in str(caught.value)


async def test_a_file_of_schema_version_3_gains_the_markers_table_and_drops_markers_kept_as_leases(
    db_path: Path,
) -> None:
    # Given a file at schema version 3 (before the markers table) whose leases table holds a real
    # run's lease, one of a run whose id differs from the markers' only in case, and two markers
    # kept there as leases of ids under agentflow/
    later = time.time() + 3600
    with raw(db_path) as conn:
        for script in MIGRATIONS[:3]:
            conn.executescript(script)
        conn.execute("CREATE TABLE agentflow_meta (key TEXT PRIMARY KEY, value TEXT)")
        conn.execute("INSERT INTO agentflow_meta VALUES ('schema_version', '3')")
        conn.executemany(
            "INSERT INTO leases VALUES (?, ?, ?, ?)",
            [
                ("r", "A", "token-r", later),
                ("Agentflow/r", "B", "token-b", later),
                ("agentflow/cancel/r", "C", "token-c", later),
                ("agentflow/sweep", "D", "token-d", later),
            ],
        )
    # When this agentflow opens it and puts a marker
    async with SQLiteCheckpointStore(db_path) as store:
        marker = await store.put_marker("cancel/r", "please", "token-m", 60)
        # Then the marker is kept, and the runs' leases are held as before
        assert await store.peek_markers(["cancel/r"]) == {"cancel/r": marker}
        assert {run_id: lease.token for run_id, lease in (await store.leases(["r", "Agentflow/r"])).items()} == {
            "r": "token-r",
            "Agentflow/r": "token-b",
        }
    # And the schema is current, the old markers are gone from the leases table, the new one is in its own
    with raw(db_path) as conn:
        assert conn.execute("SELECT value FROM agentflow_meta").fetchone() == (str(len(MIGRATIONS)),)
        assert conn.execute("SELECT run_id FROM leases ORDER BY run_id").fetchall() == [("Agentflow/r",), ("r",)]
        assert conn.execute("SELECT key, value, token FROM markers").fetchall() == [("cancel/r", "please", "token-m")]


async def test_a_marker_row_of_the_wrong_type_is_corrupt(sqlite_store: SQLiteCheckpointStore, db_path: Path) -> None:
    # Given a marker whose value was changed by hand to a blob
    await sqlite_store.put_marker("k", "v", "t", 60)
    with raw(db_path) as conn:
        conn.execute("UPDATE markers SET value = X'6B' WHERE key = 'k'")
    # When it is read, Then the store reports the row, naming the key and the column
    with pytest.raises(CheckpointStoreCorrupt, match=r"marker 'k' in .*column value holds bytes"):
        await sqlite_store.peek_markers(["k"])


async def test_file_that_is_not_a_database_is_refused(db_path: Path) -> None:
    junk = b"these are not the pages of an SQLite database\n" * 100
    db_path.write_bytes(junk)
    async with SQLiteCheckpointStore(db_path) as store:
        with pytest.raises(CheckpointStoreCorrupt, match="not an SQLite database") as caught:
            await store.latest("r")
    assert str(db_path) in str(caught.value)
    assert db_path.read_bytes() == junk  # left as it was


async def test_missing_directory_is_reported_on_first_use_and_the_store_recovers(tmp_path: Path) -> None:
    path = tmp_path / "not-yet" / "runs.db"
    store = SQLiteCheckpointStore(path)  # constructing touches nothing
    with pytest.raises(FileNotFoundError, match="does not exist") as caught:
        await store.list_runs()
    assert str(path) in str(caught.value)
    # Once the directory exists, the same store opens it
    path.parent.mkdir()
    await store.save("r", 0, checkpoint("r", 0))
    await store.aclose()


@pytest.mark.parametrize("path", [":memory:", ""])
def test_in_memory_database_is_refused(path: str) -> None:
    with pytest.raises(ValueError, match="MemoryCheckpointStore"):
        SQLiteCheckpointStore(path)


def test_store_is_shared_across_processes() -> None:
    assert SQLiteCheckpointStore.in_process is False


# -- compare-and-set --------------------------------------------------------------------


async def test_a_new_run_starts_at_step_0(sqlite_store: SQLiteCheckpointStore) -> None:
    with pytest.raises(CheckpointConflict, match="no step 0"):
        await sqlite_store.save("r", 1, checkpoint("r", 1))
    await sqlite_store.save("r", 0, checkpoint("r", 0))


async def test_step_0_of_an_existing_run_conflicts(sqlite_store: SQLiteCheckpointStore) -> None:
    await sqlite_store.save("r", 0, checkpoint("r", 0))
    with pytest.raises(CheckpointConflict, match="not next"):
        await sqlite_store.save("r", 0, checkpoint("r", 0, segment=7))
    assert (await sqlite_store.latest("r")).segment == 0


async def test_each_save_is_exactly_one_past_the_latest(sqlite_store: SQLiteCheckpointStore) -> None:
    await sqlite_store.save("r", 0, checkpoint("r", 0))
    with pytest.raises(CheckpointConflict, match="not next"):
        await sqlite_store.save("r", 2, checkpoint("r", 2))
    await sqlite_store.save("r", 1, checkpoint("r", 1))
    with pytest.raises(CheckpointConflict, match="not next"):
        await sqlite_store.save("r", 1, checkpoint("r", 1))


@pytest.mark.parametrize("end", ["done", "cancelled"])
async def test_an_ended_run_takes_no_more_saves(sqlite_store: SQLiteCheckpointStore, end: str) -> None:
    await sqlite_store.save("r", 0, checkpoint("r", 0))
    await sqlite_store.save("r", 1, checkpoint("r", 1, status=end))
    with pytest.raises(CheckpointConflict, match="ended"):
        await sqlite_store.save("r", 2, checkpoint("r", 2))


async def test_a_run_never_changes_flow(sqlite_store: SQLiteCheckpointStore) -> None:
    await sqlite_store.save("r", 0, checkpoint("r", 0, flow="a"))
    with pytest.raises(CheckpointConflict, match="belongs to flow 'a'"):
        await sqlite_store.save("r", 1, checkpoint("r", 1, flow="b"))


async def test_checkpoint_must_carry_the_run_and_step_it_is_saved_as(sqlite_store: SQLiteCheckpointStore) -> None:
    with pytest.raises(ValueError):
        await sqlite_store.save("r", 0, checkpoint("other", 0))


async def test_concurrent_saves_of_one_step_in_one_process_have_one_winner(db_path: Path) -> None:
    # Given two store objects on one file and a run at step 0
    async with SQLiteCheckpointStore(db_path) as first, SQLiteCheckpointStore(db_path) as second:
        await first.save("r", 0, checkpoint("r", 0))
        # When ten saves of step 1 race through both stores
        saves = [(first, second)[i % 2].save("r", 1, checkpoint("r", 1, segment=i)) for i in range(10)]
        results = await asyncio.gather(*saves, return_exceptions=True)
    # Then exactly one wins and every other one conflicts
    assert sum(r is None for r in results) == 1
    assert all(isinstance(r, CheckpointConflict) for r in results if r is not None)


# -- call log: fencing and numbering ----------------------------------------------------


async def test_started_record_of_a_fenced_segment_conflicts(sqlite_store: SQLiteCheckpointStore) -> None:
    # Given a worker on segment 0 that logged a call, and a second worker that took the run over at step 1
    await sqlite_store.save("r", 0, checkpoint("r", 0, segment=0))
    await sqlite_store.record_call("r", call("r", 0, 0))
    await sqlite_store.save("r", 1, checkpoint("r", 1, segment=1))
    # When the first worker tries to start another call, Then it is fenced off
    with pytest.raises(CheckpointConflict, match="fenced"):
        await sqlite_store.record_call("r", call("r", 0, 1))
    # But it may still close the call it had started
    await sqlite_store.record_call("r", call("r", 0, 1, kind="done"))
    await sqlite_store.record_call("r", call("r", 1, 0))


async def test_no_call_starts_after_the_run_ended(sqlite_store: SQLiteCheckpointStore) -> None:
    await sqlite_store.save("r", 0, checkpoint("r", 0, status="done"))
    with pytest.raises(CheckpointConflict, match="ended"):
        await sqlite_store.record_call("r", call("r", 0, 0))


async def test_a_call_needs_a_checkpoint_first(sqlite_store: SQLiteCheckpointStore) -> None:
    with pytest.raises(CheckpointNotFound):
        await sqlite_store.record_call("r", call("r", 0, 0))


async def test_out_of_sequence_record_conflicts(sqlite_store: SQLiteCheckpointStore) -> None:
    await sqlite_store.save("r", 0, checkpoint("r", 0))
    with pytest.raises(CheckpointConflict, match="out of sequence"):
        await sqlite_store.record_call("r", call("r", 0, 1))  # a gap
    await sqlite_store.record_call("r", call("r", 0, 0))
    with pytest.raises(CheckpointConflict, match="out of sequence"):
        await sqlite_store.record_call("r", call("r", 0, 0, kind="done"))  # a taken position
    assert [c.seq for c in await sqlite_store.calls("r")] == [0]


async def test_calls_come_back_by_segment_then_seq(sqlite_store: SQLiteCheckpointStore) -> None:
    await sqlite_store.save("r", 0, checkpoint("r", 0, segment=0))
    await sqlite_store.save("r", 1, checkpoint("r", 1, segment=1))
    written = [call("r", 1, 0), call("r", 0, 0, kind="done"), call("r", 1, 1, kind="done"), call("r", 0, 1, "done")]
    for record in written:
        await sqlite_store.record_call("r", record)
    assert await sqlite_store.calls("r") == [written[1], written[3], written[0], written[2]]


async def test_primary_key_turns_a_duplicate_into_conflict(sqlite_store: SQLiteCheckpointStore, db_path: Path) -> None:
    # Given a log whose first record was removed behind the store's back (segment 0 holds only seq 1)
    await sqlite_store.save("r", 0, checkpoint("r", 0))
    await sqlite_store.record_call("r", call("r", 0, 0))
    await sqlite_store.record_call("r", call("r", 0, 1, kind="done"))
    with raw(db_path) as conn:
        conn.execute("DELETE FROM calls WHERE seq = 0")
    # When a record numbered by the count (1) arrives, Then the primary key refuses it as a conflict
    with pytest.raises(CheckpointConflict, match="already stored"):
        await sqlite_store.record_call("r", call("r", 0, 1))


# -- history, listings, delete ----------------------------------------------------------


async def test_every_checkpoint_is_kept_and_latest_is_the_newest(sqlite_store: SQLiteCheckpointStore) -> None:
    rows = [checkpoint("r", step, saved_at=1_700_000_000.123456 + step) for step in range(4)]
    for row in rows:
        await sqlite_store.save("r", row.step, row)
    # Rows come back exactly as given: same payload bytes, same float time, same signature
    assert list(await sqlite_store.history("r")) == rows
    assert await sqlite_store.latest("r") == rows[-1]
    SEALER.open_checkpoint(await sqlite_store.latest("r"), "r")


async def test_latest_of_an_unknown_run_is_not_found(sqlite_store: SQLiteCheckpointStore) -> None:
    with pytest.raises(CheckpointNotFound):
        await sqlite_store.latest("nobody")
    assert await sqlite_store.history("nobody") == []


async def test_list_unfinished_names_the_flows_running_and_paused_runs(sqlite_store: SQLiteCheckpointStore) -> None:
    await sqlite_store.save("running", 0, checkpoint("running", 0))
    await sqlite_store.save("paused", 0, checkpoint("paused", 0))
    await sqlite_store.save("paused", 1, checkpoint("paused", 1, status="paused"))
    await sqlite_store.save("done", 0, checkpoint("done", 0))
    await sqlite_store.save("done", 1, checkpoint("done", 1, status="done"))
    await sqlite_store.save("elsewhere", 0, checkpoint("elsewhere", 0, flow="g"))
    assert sorted(await sqlite_store.list_unfinished("f")) == ["paused", "running"]
    assert await sqlite_store.list_unfinished("g") == ["elsewhere"]
    assert await sqlite_store.list_unfinished("h") == []


async def test_list_runs_gives_each_runs_latest_newest_first(sqlite_store: SQLiteCheckpointStore) -> None:
    await sqlite_store.save("old", 0, checkpoint("old", 0, saved_at=10.0))
    await sqlite_store.save("new", 0, checkpoint("new", 0, saved_at=20.0))
    await sqlite_store.save("other", 0, checkpoint("other", 0, flow="g", saved_at=30.0))
    await sqlite_store.save("old", 1, checkpoint("old", 1, status="done", saved_at=40.0))
    everything = await sqlite_store.list_runs()
    assert [(c.run_id, c.step) for c in everything] == [("old", 1), ("other", 0), ("new", 0)]
    assert [c.run_id for c in await sqlite_store.list_runs(flow="f")] == ["old", "new"]
    assert [c.run_id for c in await sqlite_store.list_runs(limit=2)] == ["old", "other"]


async def test_delete_removes_everything_of_the_run(sqlite_store: SQLiteCheckpointStore, db_path: Path) -> None:
    await sqlite_store.save("r", 0, checkpoint("r", 0))
    await sqlite_store.record_call("r", call("r", 0, 0))
    await sqlite_store.save("kept", 0, checkpoint("kept", 0))
    await sqlite_store.delete("r")
    await sqlite_store.delete("never-existed")
    with pytest.raises(CheckpointNotFound):
        await sqlite_store.latest("r")
    assert await sqlite_store.calls("r") == []
    assert [c.run_id for c in await sqlite_store.list_runs()] == ["kept"]
    with raw(db_path) as conn:
        for table in ("checkpoints", "runs", "calls"):
            assert conn.execute(f"SELECT COUNT(*) FROM {table} WHERE run_id = 'r'").fetchone()[0] == 0
    # The id is free again: a new run may start at step 0
    await sqlite_store.save("r", 0, checkpoint("r", 0))


# -- unreadable rows --------------------------------------------------------------------


async def test_checkpoint_row_of_the_wrong_type_is_corrupt(sqlite_store: SQLiteCheckpointStore, db_path: Path) -> None:
    await sqlite_store.save("r", 0, checkpoint("r", 0))
    with raw(db_path) as conn:
        conn.execute("UPDATE checkpoints SET payload = 'text, not bytes'")
    with pytest.raises(CheckpointStoreCorrupt, match=r"run 'r', step 0.*column payload holds str"):
        await sqlite_store.latest("r")


async def test_call_row_of_the_wrong_type_is_corrupt(sqlite_store: SQLiteCheckpointStore, db_path: Path) -> None:
    await sqlite_store.save("r", 0, checkpoint("r", 0))
    await sqlite_store.record_call("r", call("r", 0, 0))
    with raw(db_path) as conn:
        conn.execute("UPDATE calls SET seq = 'zero'")
    with pytest.raises(CheckpointStoreCorrupt, match=r"run 'r'.*column seq holds str"):
        await sqlite_store.calls("r")


async def test_null_column_is_corrupt(db_path: Path) -> None:
    # Given a file at the current version whose tables were made by hand without NOT NULL
    with raw(db_path) as conn:
        conn.execute("CREATE TABLE agentflow_meta (key TEXT PRIMARY KEY, value TEXT)")
        conn.execute("INSERT INTO agentflow_meta VALUES ('schema_version', ?)", (str(len(MIGRATIONS)),))
        conn.execute("CREATE TABLE checkpoints (run_id, step, flow, status, segment, saved_at, payload, kid, sig)")
        conn.execute("INSERT INTO checkpoints VALUES ('r', 0, 'f', 'running', 0, 1.5, x'7b7d', NULL, 'sig')")
    # When the row is read, Then it is reported as corrupt, naming the run, the row and the column
    async with SQLiteCheckpointStore(db_path) as store:
        with pytest.raises(CheckpointStoreCorrupt, match=r"run 'r', step 0.*column kid holds NULL"):
            await store.latest("r")


# -- threads, loops and closing ---------------------------------------------------------


def test_usable_from_one_asyncio_run_after_another(db_path: Path) -> None:
    store = SQLiteCheckpointStore(db_path)
    asyncio.run(store.save("r", 0, checkpoint("r", 0)))
    asyncio.run(store.save("r", 1, checkpoint("r", 1)))
    assert asyncio.run(store.latest("r")).step == 1
    asyncio.run(store.aclose())


async def test_all_work_runs_on_one_dedicated_thread(sqlite_store: SQLiteCheckpointStore) -> None:
    threads = {await sqlite_store._run(lambda _: threading.current_thread()) for _ in range(5)}
    assert len(threads) == 1
    assert threading.current_thread() not in threads


async def test_aclose_stops_the_thread_and_the_store_reopens(db_path: Path) -> None:
    store = SQLiteCheckpointStore(db_path)
    await store.save("r", 0, checkpoint("r", 0))
    worker = await store._run(lambda _: threading.current_thread())
    # When the store is closed, Then its thread ends
    await store.aclose()
    worker.join(timeout=5)
    assert not worker.is_alive()
    # And the store can be used again: it reopens on a new thread
    await store.save("r", 1, checkpoint("r", 1))
    assert (await store.latest("r")).step == 1
    await store.aclose()
    await store.aclose()  # closing twice is harmless


async def test_async_with_gives_the_store_and_closes_it(db_path: Path) -> None:
    store = SQLiteCheckpointStore(db_path)
    async with store as entered:
        assert entered is store
        worker = await store._run(lambda _: threading.current_thread())
    worker.join(timeout=5)
    assert not worker.is_alive()


# -- several processes on one file ------------------------------------------------------

# One racer process: connects, says it is ready, waits for the ``go`` file, then either
# saves step 1 of run ``r`` or appends 50 call records to its own segment.
_RACER = """
import asyncio, sys, time
from pathlib import Path
from agentflow._errors import CheckpointConflict
from agentflow.exec.seal import Sealer
from agentflow.exec.checkpoints.sqlite import SQLiteCheckpointStore

async def main(path, mode, worker, barrier):
    sealer = Sealer(b"k" * 32)
    async with SQLiteCheckpointStore(path) as store:
        await store.latest("r")  # connect before the start line, so only the writes race
        (barrier / f"ready-{worker}").touch()
        while not (barrier / "go").exists():
            time.sleep(0.001)
        if mode == "save":
            row = sealer.seal_checkpoint("r", 1, "f", "running", worker, time.time(), {"worker": worker})
            try:
                await store.save("r", 1, row)
            except CheckpointConflict:
                print("conflict")
            else:
                print("won")
        else:
            for seq in range(50):
                await store.record_call("r", sealer.seal_call("r", worker, seq, "done", {"seq": seq}))
            print("appended")

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])))
"""


def _race(db_path: Path, mode: str, barrier: Path, processes: int = 4) -> list[str]:
    """Start the racers, release them together once all are ready, and return what each printed."""
    barrier.mkdir()
    argv = [sys.executable, "-c", _RACER, str(db_path), mode]
    racers = [
        subprocess.Popen([*argv, str(i), str(barrier)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for i in range(processes)
    ]
    try:
        deadline = time.monotonic() + 60
        while len(list(barrier.glob("ready-*"))) < processes:
            if time.monotonic() > deadline or any(r.poll() is not None for r in racers):
                break  # a racer died or hung before the start: its output below says why
            time.sleep(0.01)
        (barrier / "go").touch()
        outputs = [racer.communicate(timeout=60) for racer in racers]
    finally:
        for racer in racers:
            if racer.poll() is None:
                racer.kill()
                racer.wait()
    for racer, (_, err) in zip(racers, outputs, strict=True):
        assert racer.returncode == 0, err.decode()
    return [out.decode().strip() for out, _ in outputs]


def test_processes_racing_to_save_one_step_have_exactly_one_winner(db_path: Path, tmp_path: Path) -> None:
    # Given a run at step 0
    async def setup() -> None:
        async with SQLiteCheckpointStore(db_path) as store:
            await store.save("r", 0, checkpoint("r", 0))

    asyncio.run(setup())
    # When four processes save step 1 at the same moment
    results = _race(db_path, "save", tmp_path / "barrier")
    # Then one wins, the others conflict, and the stored step 1 is the winner's
    assert sorted(results) == ["conflict", "conflict", "conflict", "won"]

    async def check() -> SealedCheckpoint:
        async with SQLiteCheckpointStore(db_path) as store:
            assert len(await store.history("r")) == 2
            return await store.latest("r")

    latest = asyncio.run(check())
    assert SEALER.open_checkpoint(latest, "r") == {"worker": latest.segment}
    assert results[latest.segment] == "won"


def test_processes_appending_calls_at_once_lose_nothing(db_path: Path, tmp_path: Path) -> None:
    async def setup() -> None:
        async with SQLiteCheckpointStore(db_path) as store:
            await store.save("r", 0, checkpoint("r", 0))

    asyncio.run(setup())
    # When four processes each append 50 records to their own segment at once
    assert _race(db_path, "calls", tmp_path / "barrier") == ["appended"] * 4

    async def read() -> list[SealedCall]:
        async with SQLiteCheckpointStore(db_path) as store:
            return list(await store.calls("r"))

    # Then all 200 are there, each segment numbered 0..49 without gaps
    records = asyncio.run(read())
    assert [(r.segment, r.seq) for r in records] == [(seg, seq) for seg in range(4) for seq in range(50)]


async def test_a_free_database_is_written_inline_without_a_thread_hop(db_path: Path) -> None:
    # Given a store whose schema is in place
    store = SQLiteCheckpointStore(db_path)
    await store.save("r", 0, checkpoint("r", 0))
    # When it writes while nobody else holds the lock, Then the statement runs on the calling thread
    seen: list[threading.Thread] = []
    await store._do(lambda conn: seen.append(threading.current_thread()))
    assert seen == [threading.current_thread()]
    await store.aclose()


async def test_a_write_that_must_wait_for_a_lock_does_not_block_the_event_loop(db_path: Path) -> None:
    # Given a store in use, and another connection (another process, say) holding the write lock
    store = SQLiteCheckpointStore(db_path)
    await store.save("r", 0, checkpoint("r", 0))
    other = sqlite3.connect(db_path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    running = asyncio.get_running_loop().create_task(ticker())
    # When the store writes, it waits for the lock on its own thread
    write = asyncio.get_running_loop().create_task(store.record_call("r", call("r", 0, 0)))
    await asyncio.sleep(0.3)
    # Then the loop kept running meanwhile, and the write completes once the lock is released
    assert not write.done()
    assert ticks >= 10
    other.execute("COMMIT")
    other.close()
    await asyncio.wait_for(write, timeout=5)
    running.cancel()
    assert [c.seq for c in await store.calls("r")] == [0]
    await store.aclose()
