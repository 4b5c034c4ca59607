"""A running child of a kit script's warm fork server, handled as a `subprocess.Popen` is.

`spawn(script, args)` forks a child from the script's server (`_kit.forkserver`) and hands
back a `Child` at once: its ``pid`` (a real process, the server's child), ``send_signal``,
``kill``, ``poll``, ``wait(timeout)`` and ``returncode`` as ``Popen`` has them, and
``stdout``, a text stream read line by line as the child writes (a FIFO made for the child,
open for reading before the fork: it ends when the child ends). Its stderr goes to a file:
the one asked for, or one of the server's, read with `Child.stderr_text`. Several children
run at once. `spawn_logged` hands back a `Forked` (the same, without the stream) whose stdout
and stderr go to one log file, in an environment and folder of the caller's: a long-lived
process such as a Celery worker (tests/celery/celery_main.py).

Signals go through a pidfd: SIGKILL, SIGSTOP and SIGCONT act on the child itself, never on
the server, and never on a process that took a reaped child's pid.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

from _kit import forkserver


class Forked:
    """One child of a fork server, handled as a ``Popen``: its pid, signals, ``poll`` and ``wait``."""

    def __init__(self, server: forkserver.ForkServer, pid: int, args: list[str]) -> None:
        self._server = server
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit code if the child ended (``-N``: killed by signal N), else None."""
        if self.returncode is None:
            self.returncode = self._server.returncode(self.pid, 0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait until the child ended; its exit code.

        Raises:
            subprocess.TimeoutExpired: it still runs after `timeout` seconds.
        """
        if self.returncode is None:
            self.returncode = self._server.returncode(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Send `sig` to the child, unless it has ended."""
        if self.poll() is None:
            forkserver.send_signal(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Child(Forked):
    """A child whose stdout is a stream of lines (a FIFO) and whose stderr is a file."""

    def __init__(self, script: Path, args: list[str], stderr: Path | None = None) -> None:
        """Fork the child; the server of `script` is started first if need be."""
        server = forkserver.server(script)
        out, err = server.paths()
        self._err, self._own_err = (stderr, False) if stderr is not None else (err, True)
        os.mkfifo(out, 0o600)
        try:
            reader = os.open(out, os.O_RDONLY | os.O_NONBLOCK)  # open before the server opens it for the child
            try:
                pid = server.spawn(args, out, self._err)
            except BaseException:
                os.close(reader)
                raise
        finally:
            out.unlink()
        super().__init__(server, pid, [sys.executable, str(script), *args])
        os.set_blocking(reader, True)
        self.stdout: IO[str] = os.fdopen(reader, "r")

    def stderr_text(self) -> str:
        """What the child wrote to its stderr so far."""
        try:
            return self._err.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def close(self) -> None:
        """Close its stdout; remove the stderr file the server made for it (the child must have ended)."""
        self.stdout.close()
        if self._own_err:
            self._err.unlink(missing_ok=True)


def spawn(script: Path, args: list[str], stderr: Path | None = None) -> Child:
    """Fork a child running `script`'s ``main(args)`` from its warm server, as ``Popen`` starts ``python script``."""
    return Child(script, args, stderr)


def spawn_logged(script: Path, args: list[str], log: Path, *, env: dict[str, str], cwd: Path) -> Forked:
    """Fork a child running `script`'s ``main(args)`` with stdout and stderr both in `log` (``> log 2>&1``).

    It runs in `cwd` with the environment `env` (nothing of the test process's but what `env` holds).
    """
    server = forkserver.server(script)
    pid = server.spawn(args, log, log, env=env, cwd=cwd)
    return Forked(server, pid, [sys.executable, str(script), *args])
