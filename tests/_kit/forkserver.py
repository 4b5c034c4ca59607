"""Warm worker processes for the kit scripts: each one is forked from a parent that has done the imports.

A kit script (tests/crash/crashkit.py, tests/loop/loopkit.py, tests/agent/agentkit.py) spends
0.3 to 1.3 s importing before it runs or recovers its one run. So one server process per script
(and per pytest process, xdist worker or not) imports the script once, as a module (its
``main`` does not run), with the modules it names in ``PRELOAD``, and then forks one child per
`run`.

Moving parts:
- The test process (`run`, `ForkServer`): starts the server on first use, as
  ``python -m _kit.forkserver SCRIPT`` in the script's folder with `_kit.specs.child_env`;
  writes one JSON request a line to its stdin (argv, cwd, environment, two output files,
  timeout) and reads one JSON reply a line from its stdout, one request at a time.
- The server (`serve`): for each request, forks a child, waits for it (a pidfd), reaps it and
  replies with its exit code as `subprocess` gives it (``-9``: killed by SIGKILL).
- The child: fds 0, 1 and 2 become /dev/null and the two output files, the server's pipes are
  closed; it takes the request's cwd, environment and ``sys.argv``, runs ``main(argv)``,
  flushes and leaves with ``os._exit`` (the exit code of a fresh interpreter: 0, the
  ``SystemExit`` code, or 1 with the traceback on stderr).

Invariants:
- At a fork the server has one thread, no event loop, no store, no socket, and no open file
  but its stdio and its two pipes to the test (checked at start where the OS can tell).
  So children share nothing open: each opens its own stores, clients and loop.
- A child is a real process: the SIGKILL a kit sends itself ends it as it ends a fresh
  interpreter, with no cleanup; the server reports ``-9`` and `run` hands it on.
- Fresh randomness: `random` reseeds itself in a forked child (``os.register_at_fork``);
  ``os.urandom``, `secrets` and ``uuid4`` ask the kernel. Only the ``str`` hash seed is the
  server's (it is fixed when an interpreter starts).
- A timeout: the server kills and reaps the child, replies ``timed_out``, and `run` raises
  `subprocess.TimeoutExpired`, as ``subprocess.run`` does.
- The server exits at EOF on its stdin: when the test process closes it (at exit, or when a
  request was interrupted) or dies. A child still running then is killed first. A server that
  died is replaced at the next `run`.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import importlib.util
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, NoReturn

from _kit.specs import child_env

#: How long the test process waits for a reply beyond the child's own timeout (the server answers at once).
GRACE_S = 30.0

Main = Callable[[list[str]], object]


# -- the test process's side -----------------------------------------------------------------


class ForkServer:
    """One server process for one kit script, owned by the process that started it."""

    def __init__(self, script: Path) -> None:
        """Start the server: it imports `script` before it answers its first request."""
        self.script = script
        self.owner = os.getpid()
        self.folder = Path(tempfile.mkdtemp(prefix=f"forkserver-{script.stem}-"))
        self.count = 0
        cmd = [sys.executable, "-m", "_kit.forkserver", str(script)]
        self.proc = subprocess.Popen(
            cmd, cwd=script.parent, env=child_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )

    def alive(self) -> bool:
        """The server is still there to ask (it may have been killed, or closed after an interruption)."""
        return self.proc.poll() is None and self.proc.stdin is not None and not self.proc.stdin.closed

    def run(self, args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        """Fork one child running the script's ``main(args)``; its exit code and output.

        Raises:
            subprocess.TimeoutExpired: the child ran longer than `timeout_s` (it was killed).
            AssertionError: the server died or did not answer.
        """
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.count += 1
        out, err = (self.folder / f"{self.count}.{name}" for name in ("out", "err"))
        cmd = [sys.executable, str(self.script), *args]
        request = {
            "argv": args,
            "cwd": str(self.script.parent),
            "env": child_env(),
            "stdout": str(out),
            "stderr": str(err),
            "timeout_s": timeout_s,
        }
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
            ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s + GRACE_S)
            line = self.proc.stdout.readline() if ready else b""
        except BaseException:
            self.close()  # interrupted mid-request: the server kills the child and goes; the next run starts another
            raise
        if not line:
            self.close()
            raise AssertionError(f"the fork server of {self.script.name} died or did not answer")
        reply = json.loads(line)
        stdout, stderr = _take(out), _take(err)
        if reply["timed_out"]:
            raise subprocess.TimeoutExpired(cmd, timeout_s, stdout, stderr)
        return subprocess.CompletedProcess(cmd, reply["returncode"], stdout, stderr)

    def close(self) -> None:
        """Stop the server (EOF on its stdin) and wait for it; remove its output folder."""
        if os.getpid() != self.owner:
            return  # a forked copy of the test process owns nothing
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        shutil.rmtree(self.folder, ignore_errors=True)


_servers: dict[Path, ForkServer] = {}


def run(script: Path, args: list[str], timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run `script`'s ``main(args)`` in a child forked from its warm server (started, or restarted, as needed)."""
    script = script.resolve()
    server = _servers.get(script)
    if server is None or not server.alive():
        if server is not None:
            server.close()
        if not _servers:
            atexit.register(close_all)
        server = _servers[script] = ForkServer(script)
    return server.run(args, timeout_s)


def close_all() -> None:
    """Stop every server this process started (registered with `atexit` on the first one)."""
    while _servers:
        _servers.popitem()[1].close()


def _take(path: Path) -> str:
    """The text a child wrote to `path` (nothing if it never opened it); the file is removed."""
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    finally:
        path.unlink(missing_ok=True)


# -- the server ------------------------------------------------------------------------------


def serve(script: Path) -> None:
    """Import `script`, then fork a child for each request on stdin until EOF (the test process went)."""
    sys.path.insert(0, str(script.parent))  # as ``python script.py`` puts its folder first
    main = _load(script)
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)  # a stray print of the server goes to stderr, never into a reply
    os.close(null)
    _check_quiet(keep={0, 1, 2, requests.fileno(), replies})
    for line in requests:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(script, main, request, inherited=(requests.fileno(), replies))
        reply = _wait(pid, request["timeout_s"], requests)
        os.write(replies, json.dumps(reply).encode() + b"\n")


def _load(script: Path) -> Main:
    """Import `script` as the module named for its file, then the modules it lists in ``PRELOAD``; its ``main``."""
    spec = importlib.util.spec_from_file_location(script.stem, script)
    assert spec is not None and spec.loader is not None, script
    module = importlib.util.module_from_spec(spec)
    sys.modules[script.stem] = module
    spec.loader.exec_module(module)
    for name in getattr(module, "PRELOAD", ()):
        importlib.import_module(name)
    main: Main = module.main
    return main


def _check_quiet(keep: set[int]) -> None:
    """Fail unless the server is safe to fork: one thread, and no open file but `keep` (where /proc tells)."""
    assert threading.active_count() == 1, f"the imports started threads: {threading.enumerate()}"
    fds = Path("/proc/self/fd")
    if fds.is_dir():
        listed = os.listdir(fds)  # its own fd is closed again by now
        extra = {int(fd) for fd in listed} - keep
        open_now = {fd for fd in extra if _is_open(fd)}
        assert not open_now, f"the imports left files open: {[os.readlink(fds / str(fd)) for fd in open_now]}"


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _wait(pid: int, timeout_s: float, requests: IO[bytes]) -> dict[str, Any]:
    """Reap child `pid`: its exit code, or killed after `timeout_s`, or killed because the test process went."""
    pidfd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([pidfd, requests.fileno()], [], [], timeout_s)
    finally:
        os.close(pidfd)
    ended = pidfd in ready
    if not ended:
        os.kill(pid, signal.SIGKILL)  # not reaped yet, so `pid` is still this child
    _, status = os.waitpid(pid, 0)
    if not ended and ready:
        sys.exit(0)  # EOF: the test process closed us or died; the child is gone too
    return {"returncode": os.waitstatus_to_exitcode(status), "timed_out": not ended}


def _child(script: Path, main: Main, request: dict[str, Any], inherited: tuple[int, ...]) -> NoReturn:
    """Run ``main`` as a fresh interpreter would run the script, then leave without the server's cleanup."""
    code = 1
    try:
        for fd in inherited:
            os.close(fd)
        _redirect(request["stdout"], 1)
        _redirect(request["stderr"], 2)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [str(script), *request["argv"]]
        main(list(request["argv"]))
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _redirect(path: str, fd: int) -> None:
    opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(opened, fd)
    os.close(opened)


def _exit_code(exc: SystemExit) -> int:
    """The exit code an interpreter leaves with for `exc`: None is 0, a message is printed and is 1."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
