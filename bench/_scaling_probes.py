"""What `bench.workers_scaling` reads around its rounds: CPU from ``/proc``, and each server's own counters.

Each configuration gets servers, or parts of servers, that only it uses, so that a
counter's change over a round is that round's work and nobody else's:

- `PrivateRedis`: a ``redis-server`` of its own on a free port (no persistence, as
  ``scripts/services.sh`` starts the shared one); ``INFO commandstats`` counts its
  commands and ``INFO cpu`` its main thread's CPU.
- `PgDatabase`: a database of its own on the shared PostgreSQL server, dropped afterwards;
  ``pg_stat_database`` counts its transactions (each of the store's operations is one
  statement in autocommit, so one transaction per round trip) and the backends connected
  to it are found in ``pg_stat_activity`` for their CPU. PostgreSQL publishes a backend's
  counts when it has been idle a while (at most `PG_STATS_IDLE_S`), so they are read
  after that long without work.
- `RabbitVhost`: a virtual host of its own on the shared RabbitMQ; ``rabbitmqctl
  list_connections`` gives each of its connections' socket reads and writes and bytes.
  RabbitMQ counts no messages unless a statistics plugin is on (it is not here), so a
  round whose messages are counted binds queues of its own to the exchanges (`sink`).
  The server's CPU (``beam.smp``) is the whole node's, shared with other virtual hosts.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Clock ticks per second of ``/proc/<pid>/stat``'s CPU times.
_TICK = os.sysconf("SC_CLK_TCK")
#: PostgreSQL flushes an idle backend's statistics within 10 s (``PGSTAT_IDLE_INTERVAL``); a little more.
PG_STATS_IDLE_S = 11.0
RABBITMQ_URL = os.environ.get("BENCH_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672")


def cpu_s(pids: list[int], *, children: bool = True) -> float:
    """CPU seconds (user + system, all threads) of processes `pids` and, with `children`, their descendants."""
    total, todo, seen = 0.0, list(pids), set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split() if children else []
        except OSError:  # gone
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14 and 15 of the line)
        todo += [int(kid) for kid in kids]
    return total


def pid_of(command: str) -> int | None:
    """The first process whose command name (``/proc/<pid>/comm``) is `command`."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == command:
                    return int(entry.name)
            except OSError:
                continue
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class PrivateRedis:
    """A ``redis-server`` of our own, on loopback, without persistence."""

    def __init__(self, tmp: Path) -> None:
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        argv = ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no"]
        argv += ["--dir", str(tmp)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)

    async def ready(self, client: Any) -> None:
        deadline = time.monotonic() + 20
        while True:
            try:
                await client.ping()
                return
            except Exception:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server on port {self.port} did not come up") from None
                await asyncio.sleep(0.05)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


async def redis_counters(client: Any) -> dict[str, Any]:
    """Calls per command, the main thread's CPU seconds and ``used_memory`` of a Redis server."""
    stats = await client.info("commandstats")
    cpu = await client.info("cpu")
    memory = await client.info("memory")
    calls = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}
    return {
        "calls": calls,
        "exec_us": {name.removeprefix("cmdstat_"): float(v["usec"]) for name, v in stats.items()},
        "cpu_s": float(cpu["used_cpu_user_main_thread"]) + float(cpu["used_cpu_sys_main_thread"]),
        "used_memory": int(memory["used_memory"]),
    }


#: Commands this benchmark sends itself (its looks at the runs, its readings), left out of every count.
OURS = frozenset({"zcard", "info", "ping", "monitor", "memory", "scan"})
#: A client's command this soon after its previous one (or after the last command its script ran) was
#: sent with it: no client gets a reply and sends again this fast, so it is one round trip.
BATCH_S = 50e-6


class RedisMonitor:
    """Every command a Redis server runs while it watches (``MONITOR``): who sent it, and when."""

    def __init__(self, url: str) -> None:
        import redis.asyncio

        self.client = redis.asyncio.Redis.from_url(url)
        self.seen: list[tuple[float, str, str]] = []  # (time, client or "lua", the command: its words, unquoted)
        self.task: asyncio.Task[None] | None = None

    async def start(self, probe: Any) -> None:
        """Start watching; return once a ``PING`` from `probe` shows that it is."""
        self.task = asyncio.create_task(self._listen())
        deadline = time.monotonic() + 10
        while not any(cmd.upper().startswith("PING") for _, _, cmd in self.seen):
            if time.monotonic() > deadline:
                raise RuntimeError("MONITOR showed nothing")
            await probe.ping()
            await asyncio.sleep(0.05)

    async def _listen(self) -> None:
        async with self.client.monitor() as watch:
            async for info in watch.listen():
                who = "lua" if info["client_type"] == "lua" else f"{info['client_address']}:{info['client_port']}"
                self.seen.append((float(info["time"]), who, info["command"]))

    def settled_count(self) -> int:
        """The commands seen but a worker's idle ones (its ``BRPOP`` and heartbeat), to tell when work has stopped."""
        return sum(1 for _, _, cmd in self.seen if not cmd.upper().startswith("BRPOP") and "heartbeat" not in cmd)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        await self.client.aclose()


def split_by_owner(seen: list[tuple[float, str, str]], marker: str) -> dict[str, Any]:
    """Count the commands of Celery's connections (any command naming `marker`, its key prefix) and the others'.

    Returns per owner (``celery``, ``store``): commands sent, round trips (a client's commands
    closer than `BATCH_S` to its previous one, or to the end of the script it ran, are one),
    and commands by name; and ``lua``: the commands the store's scripts ran inside the server.
    """
    celery = {who for _, who, cmd in seen if marker in cmd or cmd.upper().startswith("BRPOP")}
    counts: dict[str, dict[str, Any]] = {k: {"sent": 0, "round_trips": 0, "by_name": {}} for k in ("celery", "store")}
    lua: dict[str, int] = {}
    last: dict[str, float] = {}
    running = ""  # the client whose script the server is running (its commands show as "lua" next)
    for at, who, cmd in seen:
        name = cmd.split(" ", 1)[0].lower()
        if who == "lua":
            lua[name] = lua.get(name, 0) + 1
            if running:
                last[running] = at
            continue
        running = who if name in ("evalsha", "eval") else ""
        if name in OURS:
            continue
        owner = counts["celery" if who in celery else "store"]
        owner["sent"] += 1
        owner["by_name"][name] = owner["by_name"].get(name, 0) + 1
        if at - last.get(who, float("-inf")) > BATCH_S:
            owner["round_trips"] += 1
        last[who] = at
    return {**counts, "lua": lua}


@dataclass
class PgDatabase:
    """A database of our own on the PostgreSQL server at `admin_url` (a ``postgresql://`` URL)."""

    admin_url: str
    name: str

    @property
    def url(self) -> str:
        """The database's URL for the store (``postgresql+asyncpg://``)."""
        base = self.admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://", 1)
        return f"{base}/{self.name}"

    async def create(self) -> None:
        import asyncpg

        conn = await asyncpg.connect(self.admin_url)
        try:
            await conn.execute(f'CREATE DATABASE "{self.name}"')
        finally:
            await conn.close()

    async def drop(self) -> None:
        import asyncpg

        conn = await asyncpg.connect(self.admin_url)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        finally:
            await conn.close()

    async def counters(self, exclude_pid: int) -> dict[str, Any]:
        """Transactions committed and rolled back in the database, and its backends' CPU (but `exclude_pid`'s)."""
        import asyncpg

        conn = await asyncpg.connect(self.admin_url)  # another database: these reads are not counted in ours
        try:
            row = await conn.fetchrow(
                "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = $1", self.name
            )
            pids = [
                int(r["pid"])
                for r in await conn.fetch("SELECT pid FROM pg_stat_activity WHERE datname = $1", self.name)
                if int(r["pid"]) != exclude_pid
            ]
        finally:
            await conn.close()
        assert row is not None
        return {
            "xacts": int(row["xact_commit"]) + int(row["xact_rollback"]),
            "backend_cpu": {pid: cpu_s([pid], children=False) for pid in pids},
        }

    @staticmethod
    async def stored_bytes(conn: Any, table_prefix: str) -> dict[str, dict[str, int]]:
        """Per table of the store: its size on disk (with indexes and TOAST), its rows' bytes, its row count."""
        names = [
            r["tablename"]
            for r in await conn.fetch(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND starts_with(tablename, $1)",
                table_prefix,
            )
        ]
        found = {}
        for name in names:
            row = await conn.fetchrow(
                "SELECT pg_total_relation_size(quote_ident($1)::regclass) AS disk, "
                f'coalesce(sum(pg_column_size(t.*)), 0) AS row_bytes, count(*) AS rows FROM "{name}" t',
                name,
            )
            found[name.removeprefix(table_prefix)] = {k: int(row[k]) for k in ("disk", "row_bytes", "rows")}
        return found


def _ctl(*args: str) -> str:
    done = subprocess.run(["rabbitmqctl", "-q", *args], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {done.stdout}{done.stderr}")
    return done.stdout


class RabbitVhost:
    """A virtual host of our own on the machine's RabbitMQ (the guest user may use it)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.url = f"{RABBITMQ_URL}/{name}"

    def create(self) -> None:
        _ctl("add_vhost", self.name)
        _ctl("set_permissions", "-p", self.name, RABBITMQ_URL.split("://", 1)[1].split(":", 1)[0], ".*", ".*", ".*")

    def delete(self) -> None:
        """Delete the vhost, once the node runs its app again if someone stopped it meanwhile (the tests do)."""
        try:
            _ctl("delete_vhost", self.name)
        except RuntimeError:
            _ctl("await_startup", "--timeout", "300")
            _ctl("delete_vhost", self.name)

    def connections(self) -> dict[str, dict[str, int]]:
        """Each connection to the vhost: the broker's socket reads and writes and the bytes both ways."""
        columns = ("recv_cnt", "send_cnt", "recv_oct", "send_oct")
        out = _ctl("list_connections", "vhost", "name", *columns, "--no-table-headers")
        found = {}
        for line in out.splitlines():
            parts = line.split("\t")
            if len(parts) == 2 + len(columns) and parts[0] == self.name:
                found[parts[1]] = {c: int(v) for c, v in zip(columns, parts[2:], strict=True)}
        return found

    def queue_lengths(self) -> dict[str, int]:
        out = _ctl("list_queues", "-p", self.name, "name", "messages", "--no-table-headers")
        return {name: int(n) for name, n in (line.split("\t") for line in out.splitlines() if "\t" in line)}

    def topic_exchanges(self) -> list[str]:
        out = _ctl("list_exchanges", "-p", self.name, "name", "type", "--no-table-headers")
        pairs = [line.split("\t") for line in out.splitlines() if "\t" in line]
        return [name for name, kind in pairs if kind == "topic" and name and not name.startswith("amq.")]

    def sink(self, queue: str, exchanges: list[str], routing_key: str) -> None:
        """Declare classic queue `queue`, bound to each of `exchanges` by `routing_key`: it keeps a copy of each."""
        from kombu.connection import Connection

        with Connection(self.url) as conn:  # type: ignore[no-untyped-call]  # kombu ships no types
            channel = conn.channel()
            channel.queue_declare(queue=queue, durable=False, auto_delete=False)
            for exchange in exchanges:
                channel.queue_bind(queue=queue, exchange=exchange, routing_key=routing_key)


def connection_delta(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, int]:
    """The summed change of each counter over the connections (a connection opened meanwhile counts from 0)."""
    total: dict[str, int] = {}
    for name, counts in after.items():
        for key, value in counts.items():
            total[key] = total.get(key, 0) + value - before.get(name, {}).get(key, 0)
    return total
