"""The SQLite file under `SQLiteCheckpointStore`: its schema, its connections and the thread that waits.

This module owns everything about the database file itself, not the store's rules:

- The schema (`MIGRATIONS`), one script per version, and bringing a file up to date (version
  2 added the ``leases`` table, 3 the ``events`` table, 4 the ``markers`` table, so an older
  file gains them on first open). The version is kept in ``agentflow_meta``; migrating
  takes the write lock, so with several processes opening a new file at once exactly one
  of them does it, and a file written by a newer agentflow is refused.
- Opening a connection (`_connect`): WAL journal, the ``synchronous`` setting and the busy
  timeout, so writers queue for SQLite's lock instead of failing and readers carry on.
- Write transactions (`in_immediate`): ``BEGIN IMMEDIATE`` ... ``COMMIT``, rolled back on any
  failure, so the store's compare-and-set read and its insert are atomic against every
  other connection to the file.
- The worker thread (`_Worker`): one per store, it owns the main connection (opening the
  file and migrating the schema on first use) and runs every statement that has to wait.
"""

from __future__ import annotations

import errno
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TypeVar

from agentflow._errors import CheckpointError, CheckpointStoreCorrupt

_T = TypeVar("_T")

#: The schema, one SQL script per version: a database at version N has run the first N.
#: Append only; never edit a script that has shipped.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE checkpoints (
        run_id TEXT NOT NULL, step INTEGER NOT NULL, flow TEXT NOT NULL, status TEXT NOT NULL,
        segment INTEGER NOT NULL, saved_at REAL NOT NULL,
        payload BLOB NOT NULL, kid TEXT NOT NULL, sig TEXT NOT NULL,
        PRIMARY KEY (run_id, step)
    );
    CREATE TABLE runs (
        run_id TEXT NOT NULL PRIMARY KEY, flow TEXT NOT NULL, status TEXT NOT NULL,
        step INTEGER NOT NULL, saved_at REAL NOT NULL
    );
    CREATE INDEX runs_by_flow_status ON runs (flow, status);
    CREATE INDEX runs_by_saved_at ON runs (saved_at);
    CREATE TABLE calls (
        run_id TEXT NOT NULL, segment INTEGER NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL,
        payload BLOB NOT NULL, kid TEXT NOT NULL, sig TEXT NOT NULL,
        PRIMARY KEY (run_id, segment, seq)
    );
    """,
    # 2: run leases (`sqlite._leases`); a file made at version 1 gains the table on first open.
    """
    CREATE TABLE leases (
        run_id TEXT NOT NULL PRIMARY KEY, owner TEXT NOT NULL, token TEXT NOT NULL, expires_at REAL NOT NULL
    );
    """,
    # 3: each run's event stream (`sqlite._events`); the id is the cursor, in append order.
    """
    CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL,
        payload BLOB NOT NULL, kid TEXT NOT NULL, sig TEXT NOT NULL
    );
    CREATE INDEX events_by_run ON events (run_id, id);
    """,
    # 4: markers (`sqlite._markers`), apart from the leases. No run takes an id under 'agentflow/'
    # (`rules.check_new_run_id`), so lease rows of such ids hold no run and go: markers are read
    # from their own table only. substr, not LIKE: LIKE ignores case, and 'Agentflow/x' is a run's id.
    """
    CREATE TABLE markers (
        key TEXT NOT NULL PRIMARY KEY, value TEXT NOT NULL, token TEXT NOT NULL, expires_at REAL NOT NULL
    );
    DELETE FROM leases WHERE substr(run_id, 1, 10) = 'agentflow/';
    """,
]


def _statements(script: str) -> Iterator[str]:
    """Split a migration script into statements (``executescript`` would commit our transaction)."""
    pending = ""
    for piece in script.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \t\r\n;"):
                yield pending.strip()
            pending = ""


def in_immediate(conn: sqlite3.Connection, job: Callable[[sqlite3.Connection], _T]) -> _T:
    """Run `job` between ``BEGIN IMMEDIATE`` and ``COMMIT``; roll back if anything fails."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = job(conn)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return result


def unflushed(conn: sqlite3.Connection, job: Callable[[sqlite3.Connection], _T], level: str) -> _T:
    """Run `job` as `in_immediate` does, its commit not waiting for the disk; `level` is restored after.

    At ``synchronous=NORMAL`` a WAL commit survives a crash of any process (the OS holds
    it) and is made durable by the next commit that syncs the log. Only a power loss can
    drop it, and that ends every process on the host, so it is for writes that matter only
    to live processes: leases (the setting cannot change inside a transaction, so it is
    set around it).
    """
    if level != "FULL":
        return in_immediate(conn, job)
    conn.execute("PRAGMA synchronous = NORMAL")
    try:
        return in_immediate(conn, job)
    finally:
        conn.execute(f"PRAGMA synchronous = {level}")


def _schema_version(conn: sqlite3.Connection, path: Path) -> int:
    """Return the schema version recorded in the database (0 for a database agentflow never used)."""
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'agentflow_meta'").fetchone() is None:
        return 0
    row = conn.execute("SELECT value FROM agentflow_meta WHERE key = 'schema_version'").fetchone()
    if row is None:
        return 0
    try:
        return int(row[0])
    except (TypeError, ValueError):
        raise CheckpointStoreCorrupt(f"{path}: schema_version {row[0]!r} is not a number") from None


def _apply_migrations(conn: sqlite3.Connection, path: Path) -> None:
    """Bring the schema up to date; the caller holds the write lock, so one process does it."""
    conn.execute("CREATE TABLE IF NOT EXISTS agentflow_meta (key TEXT PRIMARY KEY, value TEXT)")
    version = _schema_version(conn, path)
    if version > len(MIGRATIONS):
        raise CheckpointStoreCorrupt(
            f"{path} was written by a newer agentflow (schema version {version}; this one knows up to "
            f"{len(MIGRATIONS)}): upgrade agentflow on this worker"
        )
    for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
        try:
            for statement in _statements(script):
                conn.execute(statement)
        except sqlite3.OperationalError as exc:
            raise CheckpointError(f"{path}: schema migration {number} failed ({exc})") from exc
    conn.execute(
        "INSERT OR REPLACE INTO agentflow_meta (key, value) VALUES ('schema_version', ?)", (str(len(MIGRATIONS)),)
    )


def _enable_wal(conn: sqlite3.Connection, busy_timeout_s: float) -> None:
    """Switch the database to WAL, retrying while another connection holds it busy.

    Changing the journal mode can fail with ``SQLITE_BUSY`` without calling the busy
    handler (seen when several processes open a new file at once), so wait here instead.
    """
    deadline = time.monotonic() + busy_timeout_s
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            busy = getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_BUSY
            if not busy or time.monotonic() >= deadline:
                raise
        time.sleep(0.01)


def _connect(path: Path, busy_timeout_s: float, synchronous: str) -> sqlite3.Connection:
    """Open the database, configure the connection and bring the schema up to date.

    Raises:
        FileNotFoundError: the database's directory does not exist.
        IsADirectoryError: the path is a directory.
        CheckpointStoreCorrupt: the file is not an SQLite database, or a newer agentflow wrote it.
    """
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "the checkpoint database path is a directory", str(path))
    if not path.parent.is_dir():
        raise FileNotFoundError(
            errno.ENOENT, f"directory {path.parent} does not exist (create it before using the store)", str(path)
        )
    # The timeout is SQLite's busy timeout: a writer waits this long for another's lock.
    conn = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None)
    try:
        _enable_wal(conn, busy_timeout_s)
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        # Take the write lock only when the schema needs work, not on every connect.
        if _schema_version(conn, path) != len(MIGRATIONS):
            in_immediate(conn, partial(_apply_migrations, path=path))
    except BaseException as exc:
        conn.close()
        if isinstance(exc, sqlite3.DatabaseError) and getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_NOTADB:
            raise CheckpointStoreCorrupt(
                f"{path} is not an SQLite database (or is encrypted); give the store a new file"
            ) from exc
        raise
    return conn


class _Worker:
    """One thread and the connection living on it; created on first use, dropped by `aclose`."""

    def __init__(self, opener: Callable[[], sqlite3.Connection]) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentflow-sqlite")
        self._opener = opener
        self._conn: sqlite3.Connection | None = None

    def run(self, job: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run `job` on the worker thread, opening the connection first if needed."""
        if self._conn is None:
            self._conn = self._opener()
        return job(self._conn)

    def close(self) -> None:
        """Close the connection (on the worker thread, which owns it)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
