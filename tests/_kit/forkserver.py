"""Warm worker processes for the kit scripts: each one is forked from a parent that has done the imports.

A kit script (tests/crash/crashkit.py, tests/protocol/ownership_worker.py, ...) spends 0.3 to
1.5 s importing before it does anything. So one server process per script (and per pytest
process, xdist worker or not) imports the script once, as a module (its ``main`` does not run),
with the modules it names in ``PRELOAD``, and then forks one child per request. Several
children of one server may run at once.

Moving parts:
- The test process (`ForkServer`): starts the server on first use, as
  ``python -m _kit.forkserver SCRIPT`` in the script's folder with `_kit.specs.child_env`;
  writes one JSON request a line to its stdin (argv, cwd, environment, where fds 1 and 2
  go: two files, or one for both) and reads JSON lines from its stdout: ``spawned`` (the
  pid, at once) for each request,
  ``ended`` (the exit code) when a child ends. `run` forks a child and waits for it to end
  (``subprocess.run``'s form); `_kit.forkpopen.spawn` hands back a running child
  (``subprocess.Popen``'s form: signals, ``poll``, ``wait``, its stdout line by line).
- The server (`serve`): a single-threaded ``select`` over its stdin and a pidfd per running
  child; forks a child for each request and replies with its pid; reaps each child that
  ends and reports its exit code as `subprocess` gives it (``-9``: killed by SIGKILL).
- The child: fd 0 is /dev/null, fds 1 and 2 the request's files (opened by the server, which
  closes its copies after the fork; a FIFO the test reads works as a pipe), and every other
  fd is closed; it takes the request's cwd, environment and ``sys.argv``, runs ``main(argv)``,
  flushes and leaves with ``os._exit`` (the exit code of a fresh interpreter: 0, the
  ``SystemExit`` code, or 1 with the traceback on stderr).

Invariants:
- At a fork the server has one thread, no event loop, no store, no socket, and no open file
  but its stdio, its two pipes to the test, the pidfds of its running children and the new
  child's two output files (checked at start where the OS can tell). The child closes all but
  its stdio first, so children share nothing open: each opens its own stores, clients and loop.
- A child is a real process, the server's child: a signal sent to its pid acts on it alone
  (SIGKILL ends it as it ends a fresh interpreter, with no cleanup; SIGSTOP freezes it, and
  the server does not mistake a stop for an end); the server reports ``-9`` for a SIGKILL.
- Fresh randomness: `random` reseeds itself in a forked child (``os.register_at_fork``);
  ``os.urandom``, `secrets` and ``uuid4`` ask the kernel. Only the ``str`` hash seed is the
  server's (it is fixed when an interpreter starts).
- A timeout of `run`: the test process kills the child (through a pidfd: never another
  process that took its pid), it is reaped, and `run` raises `subprocess.TimeoutExpired`, as
  ``subprocess.run`` does.
- The server exits at EOF on its stdin: when the test process closes it (at exit, or when a
  request was interrupted) or dies. Every child still running (or stopped) is killed and
  reaped first, and the output folder removed. A server that died is replaced at the next request.
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
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from _kit.specs import child_env

#: How long the test process waits for a reply the server gives at once (a spawn, a killed child's end).
GRACE_S = 30.0
#: The longest the test process holds the server's reply pipe while it waits (other threads may ask too).
SLICE_S = 0.05

Main = Callable[[list[str]], object]


# -- the test process's side -----------------------------------------------------------------


class ForkServer:
    """One server process for one kit script, owned by the process that started it (thread-safe)."""

    def __init__(self, script: Path) -> None:
        """Start the server: it imports `script` before it answers its first request."""
        self.script = script
        self.owner = os.getpid()
        self.folder = Path(tempfile.mkdtemp(prefix=f"forkserver-{script.stem}-"))
        self.count = 0
        self.lock = threading.Lock()
        self.ended: dict[int, int] = {}  # exit codes reported and not yet asked for, by pid
        self.spawned: int | None = None
        self.pending = b""
        cmd = [sys.executable, "-m", "_kit.forkserver", str(script), str(self.folder)]
        self.proc = subprocess.Popen(
            cmd, cwd=script.parent, env=child_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
        )

    def alive(self) -> bool:
        """The server is still there to ask (it may have been killed, or closed after an interruption)."""
        return self.proc.poll() is None and self.proc.stdin is not None and not self.proc.stdin.closed

    def paths(self) -> tuple[Path, Path]:
        """Two fresh paths in the server's folder, for one child's stdout and stderr."""
        with self.lock:
            self.count += 1
            return self.folder / f"{self.count}.out", self.folder / f"{self.count}.err"

    def spawn(
        self, args: list[str], stdout: Path, stderr: Path, *, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> int:
        """Fork one child running the script's ``main(args)`` with fds 1 and 2 on `stdout` and `stderr`; its pid.

        A path that is a FIFO must be open for reading already (the server opens it without waiting).
        The same path for both gives one file, as ``2>&1`` does. The child's environment is `env`
        (default: this process's, with tests/ importable), its working folder `cwd` (default: the
        script's).

        Raises:
            AssertionError: the server died or did not answer.
        """
        assert self.proc.stdin is not None
        request = {"argv": args, "cwd": str(cwd or self.script.parent), "env": env or child_env()}
        request |= {"stdout": str(stdout), "stderr": str(stderr)}
        with self.lock:
            try:
                _write_all(self.proc.stdin.fileno(), json.dumps(request).encode() + b"\n")
                deadline = time.monotonic() + GRACE_S
                while self.spawned is None:
                    if not self._read(deadline):
                        raise AssertionError(f"the fork server of {self.script.name} did not answer")
            except BaseException:
                self.close()  # interrupted mid-request: the server kills its children and goes
                raise
            pid, self.spawned = self.spawned, None
        return pid

    def returncode(self, pid: int, timeout_s: float | None) -> int | None:
        """Child `pid`'s exit code once it ended (asked once); None if it is still running after `timeout_s`."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            with self.lock:
                if pid not in self.ended:
                    now = time.monotonic()
                    self._read(now + SLICE_S if deadline is None else min(deadline, now + SLICE_S))
                if pid in self.ended:
                    return self.ended.pop(pid)
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def _read(self, deadline: float) -> bool:
        """Take in what the server said until `deadline` (lock held); False if it said nothing."""
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], max(deadline - time.monotonic(), 0.0))
        if not ready:
            return False
        chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
        if not chunk:
            raise AssertionError(f"the fork server of {self.script.name} died")
        *lines, self.pending = (self.pending + chunk).split(b"\n")
        for line in lines:
            reply = json.loads(line)
            if "spawned" in reply:
                self.spawned = reply["spawned"]
            else:
                self.ended[reply["ended"]] = reply["returncode"]
        return True

    def run(self, args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        """Fork one child running the script's ``main(args)`` and wait for it; its exit code and output.

        Raises:
            subprocess.TimeoutExpired: the child ran longer than `timeout_s` (it was killed).
            AssertionError: the server died or did not answer.
        """
        out, err = self.paths()
        cmd = [sys.executable, str(self.script), *args]
        pid = self.spawn(args, out, err)
        timed_out = False
        try:
            code = self.returncode(pid, timeout_s)
            if code is None:
                timed_out = True
                kill(pid)
                code = self.returncode(pid, GRACE_S)
        except BaseException:
            self.close()  # interrupted: the server kills the child and goes; the next request starts another
            raise
        if code is None:
            self.close()
            raise AssertionError(f"the fork server of {self.script.name} did not reap a killed child")
        stdout, stderr = _take(out), _take(err)
        if timed_out:
            raise subprocess.TimeoutExpired(cmd, timeout_s, stdout, stderr)
        return subprocess.CompletedProcess(cmd, code, stdout, stderr)

    def close(self) -> None:
        """Stop the server (EOF on its stdin: it kills its children) and wait for it; remove its output folder."""
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
_servers_lock = threading.Lock()


def server(script: Path) -> ForkServer:
    """The warm server of `script` in this process (started, or restarted if it died, as needed)."""
    script = script.resolve()
    with _servers_lock:
        found = _servers.get(script)
        if found is None or not found.alive():
            if found is not None:
                found.close()
            if not _servers:
                atexit.register(close_all)
            found = _servers[script] = ForkServer(script)
        return found


def run(script: Path, args: list[str], timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run `script`'s ``main(args)`` in a child forked from its warm server, to its end (as ``subprocess.run``)."""
    return server(script).run(args, timeout_s)


def close_all() -> None:
    """Stop every server this process started (registered with `atexit` on the first one)."""
    while _servers:
        _servers.popitem()[1].close()


def send_signal(pid: int, sig: int) -> bool:
    """Send `sig` to process `pid` through a pidfd; False if it had ended already.

    The pidfd names the process itself: a signal sent through it never reaches another process
    that took the pid (a child of a server is reaped, and its pid freed, as soon as it ends).
    """
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    try:
        signal.pidfd_send_signal(pidfd, sig)
    except ProcessLookupError:
        return False
    finally:
        os.close(pidfd)
    return True


def kill(pid: int) -> None:
    """SIGKILL to process `pid`, if it is still there."""
    send_signal(pid, signal.SIGKILL)


def _write_all(fd: int, data: bytes) -> None:
    """Write all of `data` (a request may be larger than a pipe writes at once)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _take(path: Path) -> str:
    """The text a child wrote to `path` (nothing if it never opened it); the file is removed."""
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    finally:
        path.unlink(missing_ok=True)


# -- the server ------------------------------------------------------------------------------


def serve(script: Path, folder: Path) -> None:
    """Import `script`, then fork a child for each request on stdin, reporting each end, until EOF.

    At EOF it also removes `folder`, its test process's output folder: an xdist worker leaves
    without running its `atexit` handlers.
    """
    sys.path.insert(0, str(script.parent))  # as ``python script.py`` puts its folder first
    main = _load(script)
    requests, replies = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)  # a stray print of the server goes to stderr, never into a reply
    os.close(null)
    _check_quiet(keep={0, 1, 2, requests, replies})
    running: dict[int, int] = {}  # pid by pidfd
    pending = b""
    while True:
        ready, _, _ = select.select([requests, *running], [], [])
        for pidfd in ready:
            if pidfd != requests:
                pid = running.pop(pidfd)
                os.close(pidfd)
                _, status = os.waitpid(pid, 0)
                _reply(replies, ended=pid, returncode=os.waitstatus_to_exitcode(status))
        if requests in ready:
            chunk = os.read(requests, 1 << 16)
            if not chunk:
                _stop(running)  # EOF: the test process closed us or died
                shutil.rmtree(folder, ignore_errors=True)
                return
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                pid = _fork(script, main, json.loads(line))
                running[os.pidfd_open(pid)] = pid
                _reply(replies, spawned=pid)


def _reply(replies: int, **fields: Any) -> None:
    os.write(replies, json.dumps(fields).encode() + b"\n")


def _stop(running: dict[int, int]) -> None:
    """Kill and reap every child still running (a stopped one too: SIGKILL ends it)."""
    for pidfd, pid in running.items():
        os.kill(pid, signal.SIGKILL)  # not reaped yet, so `pid` is still this child
        os.waitpid(pid, 0)
        os.close(pidfd)


def _fork(script: Path, main: Main, request: dict[str, Any]) -> int:
    """Fork a child for `request` with its two output files; the server keeps no copy of them."""
    out = _open_output(request["stdout"])
    err = os.dup(out) if request["stderr"] == request["stdout"] else _open_output(request["stderr"])
    try:
        pid = os.fork()
        if pid == 0:
            _child(script, main, request, out, err)
    finally:
        os.close(out)
        os.close(err)
    return pid


def _open_output(path: str) -> int:
    """Open `path` for writing without waiting: a FIFO nobody reads fails at once rather than block the server."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK, 0o600)
    os.set_blocking(fd, True)
    return fd


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


def _child(script: Path, main: Main, request: dict[str, Any], out: int, err: int) -> NoReturn:
    """Run ``main`` as a fresh interpreter would run the script, then leave without the server's cleanup."""
    code = 1
    try:
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # the server's pipes, the other children's pidfds, out and err
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


def _exit_code(exc: SystemExit) -> int:
    """The exit code an interpreter leaves with for `exc`: None is 0, a message is printed and is 1."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    serve(Path(sys.argv[1]), Path(sys.argv[2]))
