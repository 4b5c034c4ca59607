"""The warm fork server: each child is a process of its own that ends as a fresh one would; nothing is left over."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from _kit import forkserver
from _kit.processes import run_kit

PROBE = Path(__file__).with_name("forkprobe.py")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pidfd and /proc/self/fd are Linux's")


def server_pid() -> int:
    return forkserver._servers[PROBE.resolve()].proc.pid


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
