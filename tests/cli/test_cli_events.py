"""``agentflow events RUN_ID``: a run's stored events, one line each, every one checked; ``--follow`` goes on live.

The kit's runs were made by a runner that records events, so each has its stream in the
store. A line is ``CURSOR  DATE TIME  NAME  FIELDS``; what the reader did not take as an
event is a ``PROBLEM`` line, and events missing before another a ``GAP`` line.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
from contextlib import closing
from pathlib import Path

import pytest
import runs_kit
from _kit.poll import until
from _kit.processes import ctrl_c_reaches_children
from runs_kit import one_line_error
from test_cli_stores import _drop_tables, _forget

from agentflow._events import Event, Events
from agentflow.exec.checkpoints import SQLiteCheckpointStore
from agentflow.exec.checkpoints.urls import open_store
from agentflow.exec.run import events as run_events
from agentflow.exec.seal import Sealer

ROOT = Path(__file__).resolve().parents[2]
APP = "runs_kit:app"
#: What refund-1's stream holds: it started, and paused for the refund's approval.
PAUSED = ["checkpoint.saved", "run.started", "node.started", "checkpoint.saved", "run.paused"]
#: The first entry of it: every event up to the save that paused the run and gave its lease up, which
#: carried them (run.paused is emitted after that save, and appended on its own).
CARRIED = PAUSED[:4]


def names(stdout: str) -> list[str]:
    """The event names of the lines (the fourth column; a problem line's third says PROBLEM)."""
    return [line.split()[2] if line.split()[1] == "-" else line.split()[3] for line in stdout.splitlines()]


def cursors(stdout: str) -> list[str]:
    return [line.split()[0] for line in stdout.splitlines()]


def entry(cursor: str) -> int:
    """The stored entry (one append) an event's cursor points into: its row id in SQLite."""
    return int(cursor.split("~")[1] if "~" in cursor else cursor)


def change_entry(db: Path, cursor: str, sql: str) -> None:
    """Run `sql` on the events table behind agentflow's back (``?`` is the id of the entry `cursor` is in)."""
    with closing(sqlite3.connect(db)) as conn, conn:
        conn.execute(sql, (entry(cursor),))


def forge_entry(db: Path, cursor: str, find: bytes, to: bytes) -> None:
    """Change bytes of a stored entry's payload behind agentflow's back (its signature stays as it was)."""
    with closing(sqlite3.connect(db)) as conn, conn:
        (payload,) = conn.execute("SELECT payload FROM events WHERE id = ?", (entry(cursor),)).fetchone()
        conn.execute("UPDATE events SET payload = ? WHERE id = ?", (payload.replace(find, to), entry(cursor)))


def append_entries(db: Path, run_id: str, entries: list[list[str]]) -> None:
    """Append `entries` to the run's stream as one later holder would: one writer, one append per entry."""

    async def append() -> None:
        async with SQLiteCheckpointStore(db) as store:
            recorder = run_events._Recorder(store, Sealer(runs_kit.KEY), run_id)
            for names in entries:
                for name in names:
                    recorder(Event(name, run_id, {"node": "refund"}))
                await recorder.drain()

    runs_kit.in_thread(append)


def test_events_prints_each_stored_event_on_one_line(agentflow):
    # When the operator lists the events of the paused refund-1
    result = agentflow("events", "refund-1")
    # Then each event is one line: its cursor, its time, its name and the fields that say what happened
    assert result.exit_code == 0, result.output
    assert names(result.stdout) == PAUSED
    lines = result.stdout.splitlines()
    cursor, day, time, name, *fields = lines[3].split()
    assert re.fullmatch(r"\d+|\d*~\d+~\d+", cursor) and len(day) == 10 and len(time) == 12 and time[8] == "."
    assert (name, fields) == ("checkpoint.saved", ["step=1", "status=paused", "flow=refunds", "segment=0"])
    assert lines[4].split()[3:] == ["run.paused", 'pending=["0/refund/0/' + lines[4].split('"0/refund/0/')[1]]
    assert result.stderr == ""


def test_after_a_cursor_prints_only_the_events_after_it(agentflow):
    every = agentflow("events", "refund-1").stdout
    result = agentflow("events", "refund-1", "--after", cursors(every)[1])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == every.splitlines()[2:]
    # And after the last one there is nothing yet: stdout stays empty, stderr says so
    last = agentflow("events", "refund-1", "--after", cursors(every)[-1])
    assert last.exit_code == 0 and last.stdout == ""
    assert last.stderr == f"no events of run refund-1 stored after {cursors(every)[-1]}\n"


def test_a_cursor_the_store_never_gave_is_one_line(agentflow):
    result = agentflow("events", "refund-1", "--after", "nope")
    assert result.exit_code == 2
    assert "--after 'nope'" in one_line_error(result) and "the first column of agentflow events" in result.stderr


def test_an_unknown_run_is_one_line(agentflow):
    result = agentflow("events", "order-9")
    assert result.exit_code == 2
    assert one_line_error(result) == "agentflow: no run 'order-9' in this store"


def test_nothing_of_a_run_whose_rows_fail_their_check_is_shown(agentflow):
    # Given tamper-1, whose checkpoint 1 was changed behind agentflow's back: When its events are asked for
    result = agentflow("events", "tamper-1")
    # Then none is printed, and the one line says why and what names the failing rows
    assert result.exit_code == 1 and result.stdout == ""
    assert "agentflow verify tamper-1 names them" in one_line_error(result)


def test_a_forged_entry_is_a_problem_line_and_the_command_exits_1(agentflow, db):
    # Given the entry that holds refund-1's run.started, its name changed in the store
    every = cursors(agentflow("events", "refund-1").stdout)
    forge_entry(db, every[1], b"run.started", b"run.startex")
    # When the events are listed
    result = agentflow("events", "refund-1")
    # Then the entry (every event of that write) is one PROBLEM line with the reason and nothing of its data,
    # and the entry after it is shown as it was stored
    assert result.exit_code == 1
    problem, paused = result.stdout.splitlines()
    assert problem.split()[:3] == [str(entry(every[1])), "-", "PROBLEM"]
    assert names(paused) == ["run.paused"]
    assert "signature does not match" in problem and "startex" not in result.stdout
    assert "1 stored event(s) did not check (PROBLEM above)" in one_line_error(result)


def test_a_replayed_copy_of_an_entry_is_a_problem_line_per_event(agentflow, db):
    # Given a byte-for-byte copy of the entry holding refund-1's node.started appended to its stream again
    node_started = cursors(agentflow("events", "refund-1").stdout)[2]
    copy = "INSERT INTO events (run_id, payload, kid, sig) SELECT run_id, payload, kid, sig FROM events WHERE id = ?"
    change_entry(db, node_started, copy)
    # When the events are listed, Then each event of the copy is a PROBLEM line naming it a replay
    result = agentflow("events", "refund-1")
    assert result.exit_code == 1
    assert names(result.stdout) == [*PAUSED, *["PROBLEM"] * len(CARRIED)]
    assert all("is a copy of an event already read" in line for line in result.stdout.splitlines()[len(PAUSED) :])


def test_events_missing_between_two_are_a_gap_line_before_the_next(agentflow, db):
    # Given a later holder of refund-1 that appended three entries, the middle one then deleted
    append_entries(db, "refund-1", [["node.started"], ["node.finished", "checkpoint.saved"], ["run.paused"]])
    every = cursors(agentflow("events", "refund-1").stdout)
    assert len(every) == len(PAUSED) + 4
    change_entry(db, every[len(PAUSED) + 1], "DELETE FROM events WHERE id = ?")
    # When the events are listed
    result = agentflow("events", "refund-1")
    # Then a GAP line says what is missing, before the event that follows it (which checks, and is printed)
    assert result.exit_code == 1
    assert names(result.stdout) == [*PAUSED, "node.started", "GAP", "run.paused"]
    gap = result.stdout.splitlines()[len(PAUSED) + 1]
    assert gap.split()[0] == every[-1] and "events 1 to 2 of writer" in gap and "are missing before" in gap
    assert "events are missing in 1 place(s) (GAP above)" in one_line_error(result)


class Following:
    """``agentflow events RUN_ID --follow`` in a process of its own; its stdout collected line by line as it comes."""

    def __init__(self, url: str, run_id: str) -> None:
        env = {**os.environ, "AGENTFLOW_CHECKPOINT_KEYS": runs_kit.KEY_TEXT, **runs_kit.ALLOW_DEMO_KEY}
        env["PYTHONFAULTHANDLER"] = "1"  # a follower that hangs prints every thread's stack when aborted (`close`)
        env.pop("AGENTFLOW_WORKERS", None)
        with ctrl_c_reaches_children():
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "agentflow.cli", "events", run_id, "--follow", "--store", url],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def names(self) -> list[str]:
        return names("\n".join(self.lines))

    def ended(self) -> bool:
        return self.proc.poll() is not None

    def close(self) -> str:
        """Stop it if it still runs (SIGABRT first: its stacks go to stderr); return its stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGABRT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.wait(timeout=30)
        self._reader.join(timeout=30)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        err = self.proc.stderr.read()
        self.proc.stdout.close()
        self.proc.stderr.close()
        return err


async def test_follow_prints_new_events_as_the_run_moves_and_ends_with_the_run(agentflow, url):
    # Given the operator follows the paused refund-1, and has seen what it did so far
    following = Following(url, "refund-1")
    try:
        await until(lambda: following.names() == PAUSED, "the stored events printed", timeout_s=60)
        assert not following.ended()  # a paused run is followed until it goes on
        # When someone approves it
        approved = await asyncio.to_thread(agentflow, "resume", "refund-1", "--app", APP, "--approve")
        assert approved.exit_code == 0, approved.output
        # Then the new events are printed as the run makes them, and the command ends with the run, exit code 0
        await until(following.ended, "the follower ending with the run", timeout_s=30)
    finally:
        err = following.close()
    assert following.proc.returncode == 0, err
    assert following.names()[len(PAUSED) :] == [
        "checkpoint.saved",
        "node.started",
        "tool.started",
        "tool.finished",
        "node.finished",
        "checkpoint.saved",
        "run.finished",
    ]
    assert following.lines[-1].split()[3:] == ["run.finished", "status=done", "flow=refunds"]


async def test_ctrl_c_stops_following_and_says_where_to_go_on_from(url):
    # Given the operator follows the paused refund-1 (which nobody moves) and has seen its events
    following = Following(url, "refund-1")
    try:
        await until(lambda: following.names() == PAUSED, "the stored events printed", timeout_s=60)
        # When they press Ctrl-C
        following.proc.send_signal(signal.SIGINT)
        with contextlib.suppress(AssertionError):  # one that did not stop is killed below, and its stderr shown
            await until(following.ended, "the follower stopping on Ctrl-C", timeout_s=30)
    finally:
        err = following.close()
    # Then it stops with exit code 130 and gives the command that goes on after the last event printed
    code = following.proc.returncode
    assert code == 130, f"exit {code} (-6: it did not stop, and was aborted); stderr: {err}"
    last = following.lines[-1].split()[0]
    assert err == f"stopped following run refund-1; go on with: agentflow events refund-1 --after {last} --follow\n"


async def _pause_a_recorded_refund(url: str) -> None:
    store = open_store(url, must_exist=False)
    try:
        runner = runs_kit.app.runner(store, runs_kit.KEY, events=Events(record=True))
        await runner.run(runs_kit.refunds, {"order": "o-9", "amount": 5}, run_id="r-9")
    finally:
        await store.aclose()


@pytest.fixture(
    params=[
        pytest.param("sqlalchemy", id="sqlalchemy-sqlite"),
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def store_url(request, tmp_path, unique_prefix):
    """A store of each kind but SQLite's own (the kit's), with r-9 paused for approval and its events recorded."""
    if request.param == "sqlalchemy":
        url = f"sqlite+aiosqlite:///{tmp_path / 'sql.db'}?table_prefix=t_"
    elif request.param == "redis":
        url = f"{request.getfixturevalue('redis_url')}?prefix={unique_prefix()}"
    else:
        prefix = f"{unique_prefix()}_"
        url = f"{request.getfixturevalue('postgres_url')}?table_prefix={prefix}"
    runs_kit.in_thread(lambda: _pause_a_recorded_refund(url))
    yield url
    if request.param == "redis":
        runs_kit.in_thread(lambda: _forget(url))
    elif request.param == "postgres":
        runs_kit.in_thread(lambda: _drop_tables(request.getfixturevalue("postgres_url"), prefix))


def test_events_read_on_from_a_cursor_and_follow_on_every_store(agentflow, store_url):
    # Given r-9, paused, in a store whose cursors are its own (numbers in SQL, stream ids in Redis)
    every = agentflow("events", "r-9", "--store", store_url)
    assert every.exit_code == 0, every.output
    assert names(every.stdout) == PAUSED
    # When the operator reads on after the second event, Then they get the rest
    rest = agentflow("events", "r-9", "--after", cursors(every.stdout)[1], "--store", store_url)
    assert rest.stdout.splitlines() == every.stdout.splitlines()[2:]
    # When the run was approved and the operator follows it after its pause, Then they get the rest of it and it ends
    assert agentflow("resume", "r-9", "--app", APP, "--approve", "--store", store_url).exit_code == 0
    followed = agentflow("events", "r-9", "--follow", "--after", cursors(every.stdout)[-1], "--store", store_url)
    assert followed.exit_code == 0, followed.output
    assert names(followed.stdout)[0] == "checkpoint.saved" and names(followed.stdout)[-1] == "run.finished"


def test_a_copy_appended_after_the_cursor_is_a_problem_line_read_with_after(agentflow, db):
    # Given refund-1's stream, and a byte copy of the entry holding its node.started appended after its last entry
    every = cursors(agentflow("events", "refund-1").stdout)
    copy = "INSERT INTO events (run_id, payload, kid, sig) SELECT run_id, payload, kid, sig FROM events WHERE id = ?"
    change_entry(db, every[2], copy)
    # When the events after the last genuine one are listed (the original lies before that cursor)
    result = agentflow("events", "refund-1", "--after", every[-1])
    # Then each event of the copy is a PROBLEM line naming it a replay, none is shown as real, and the exit code is 1
    assert result.exit_code == 1
    assert names(result.stdout) == ["PROBLEM"] * len(CARRIED)
    assert all("is a copy of an event already read" in line for line in result.stdout.splitlines())
