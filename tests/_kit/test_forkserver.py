"""The warm fork server: each child is a process of its own that ends as a fresh one would; nothing is left over."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from _kit import forkserver
from _kit.forkpopen import Child, spawn
from _kit.poll import until
from _kit.processes import run_kit

PROBE = Path(__file__).with_name("forkprobe.py")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pidfd and /proc/self/fd are Linux's")


def server_pid() -> int:
    return forkserver._servers[PROBE.resolve()].proc.pid


def state(pid: int) -> str:
    """The process's state letter in /proc (``T``: stopped); the field after the parenthesised name."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_each_child_is_a_process_of_its_own_with_fresh_randomness_and_nothing_shared_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given the probe's server, started by a first run before the environment changes
    first = run_kit(PROBE, "report")
    monkeypatch.setenv("FORKPROBE", "set after the server started")

    # When two more children run
    second, third = run_kit(PROBE, "report"), run_kit(PROBE, "report")

    # Then each has its own pid, its own randomness, only its stdio open, and this call's cwd, argv and environment
    assert first is not None and second is not None and third is not None
    children = [first, second, third]
    assert len({c["pid"] for c in children} | {os.getpid(), server_pid()}) == 5
    assert len({c["random"] for c in children}) == len({c["urandom"] for c in children}) == 3
    assert all(c["fds"] == [0, 1, 2] for c in children), children
    assert all(c["cwd"] == str(PROBE.parent) and c["argv"] == [str(PROBE), "report"] for c in children)
    assert [c["env"] for c in children] == [None, "set after the server started", "set after the server started"]


def test_a_child_that_kills_itself_is_reported_killed_by_sigkill() -> None:
    # When a child sends itself SIGKILL
    # Then it died of it, and run_kit reports it as killed
    assert forkserver.run(PROBE, ["kill"]).returncode == -signal.SIGKILL
    assert run_kit(PROBE, "kill") is None


def test_a_child_that_fails_gives_its_exit_code_and_fails_run_kit_with_its_stderr() -> None:
    # When a child exits with a code, or raises
    # Then its code is the one a fresh interpreter would give, and run_kit fails with the traceback
    assert forkserver.run(PROBE, ["exit", "3"]).returncode == 3
    failed = forkserver.run(PROBE, ["fail"])
    assert failed.returncode == 1 and "RuntimeError: the probe failed as asked" in failed.stderr
    with pytest.raises(AssertionError, match="the probe failed as asked"):
        run_kit(PROBE, "fail")


def test_a_child_past_its_timeout_is_killed_and_reaped(tmp_path: Path) -> None:
    # When a child blocks past its timeout
    pidfile = tmp_path / "pid"
    with pytest.raises(subprocess.TimeoutExpired):
        forkserver.run(PROBE, ["block", str(pidfile)], timeout_s=1.0)

    # Then it is gone, and the server goes on serving
    assert gone(int(pidfile.read_text()))
    assert run_kit(PROBE, "report") is not None


def test_a_dead_server_is_replaced_and_a_closed_one_leaves_no_process() -> None:
    # Given the probe's server, killed
    run_kit(PROBE, "report")
    dead = forkserver._servers[PROBE.resolve()].proc
    dead.kill()
    dead.wait()

    # When a test runs the probe again
    # Then a new server forks it
    assert run_kit(PROBE, "report") is not None
    assert server_pid() != dead.pid

    # And when it is closed (as at exit), it has left
    server = forkserver._servers.pop(PROBE.resolve())
    server.close()
    assert server.proc.returncode == 0 and gone(server.proc.pid)


async def test_a_spawned_child_streams_its_lines_as_it_writes_them_and_two_run_at_once(tmp_path: Path) -> None:
    # Given two children spawned from the probe's server, each waiting at the gate after its first line
    gate = tmp_path / "gate"
    first, second = spawn(PROBE, ["talk", str(gate)]), spawn(PROBE, ["talk", str(gate)])
    try:
        # Then each said hello, with its own pid, while both still run
        assert first.stdout.readline() == f"hello {first.pid}\n"
        assert second.stdout.readline() == f"hello {second.pid}\n"
        assert first.poll() is None and second.poll() is None
        assert len({first.pid, second.pid, server_pid(), os.getpid()}) == 4

        # When the gate opens, Then each says its last line, its stdout ends, and it exits with 0
        gate.touch()
        for child in (first, second):
            assert child.stdout.readline() == "bye\n"
            assert child.stdout.readline() == ""
            assert child.wait(timeout=10) == 0 and child.returncode == 0
    finally:
        for child in (first, second):
            child.kill()
            child.close()


async def test_signals_act_on_the_running_child_itself_and_wait_times_out_while_it_runs(tmp_path: Path) -> None:
    # Given a spawned child that blocks
    child = spawn(PROBE, ["block", str(tmp_path / "pid")])
    try:
        pid_file = tmp_path / "pid"  # created, then written: wait for its text, not for the file alone
        await until(lambda: pid_file.exists() and pid_file.read_text() or None, "the child to write its pid")
        assert int(pid_file.read_text()) == child.pid

        # When it is waited for a short while, Then the wait times out
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=0.2)

        # When it is stopped, Then the kernel shows it stopped, and the server does not take it for ended
        child.send_signal(signal.SIGSTOP)
        await until(lambda: state(child.pid) == "T" or None, "the child to stop")
        assert child.poll() is None and state(server_pid()) != "T"

        # When it is continued, Then it runs again
        child.send_signal(signal.SIGCONT)
        await until(lambda: state(child.pid) != "T" or None, "the child to go on")

        # When it is killed, Then it died of SIGKILL, and the server goes on serving
        child.kill()
        assert child.wait(timeout=10) == -signal.SIGKILL and gone(child.pid)
        assert forkserver._servers[PROBE.resolve()].alive() and run_kit(PROBE, "report") is not None
        child.kill()  # a signal to an ended child is a no-op, as with Popen
    finally:
        child.kill()
        child.close()


def test_a_closed_server_kills_its_running_and_stopped_children_first(tmp_path: Path) -> None:
    # Given two spawned children that block, one of them stopped
    children: list[Child] = [spawn(PROBE, ["block", str(tmp_path / f"pid-{i}")]) for i in range(2)]
    children[0].send_signal(signal.SIGSTOP)

    # When the server is closed (as when the test process goes)
    server = forkserver._servers.pop(PROBE.resolve())
    server.close()

    # Then both children are gone, and the server with them
    assert all(gone(child.pid) for child in children) and gone(server.proc.pid)
    for child in children:
        assert child.stdout.read() == ""
        child.stdout.close()
