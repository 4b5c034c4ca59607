"""The two deployments `bench.workers_scaling` grows one worker at a time, and what each one counts.

Both run P3's flow (``chain10``: 10 supersteps, one trivial idempotent tool each) on
``celery -A workers worker -P prefork -c 1`` processes, started one at a time
(`bench.celery_steps._Side`):

- `RedisConfig`: one Redis as broker, result backend and checkpoint store (the default
  deployment), a private ``redis-server`` so that its counters are this benchmark's alone.
- `RabbitPgConfig`: RabbitMQ as the broker (quorum queues, publisher confirms; no
  results) and PostgreSQL as the store (`docs/scale-out.md`), in a virtual host and a
  database of their own.

Each one reads its counters in two halves: `instant` (CPU from ``/proc`` and Redis's
own counts, exact at any moment) right at a round's edges, and `settled` (PostgreSQL's
transaction counts, RabbitMQ's connection counts) once PostgreSQL has published its
backends' counts. `costs` turns two readings into figures per superstep.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from bench._celery_apps import STEPS, chain, make_bare_app
from bench._scaling_probes import (
    OURS,
    PgDatabase,
    PrivateRedis,
    RabbitVhost,
    RedisMonitor,
    connection_delta,
    cpu_s,
    pid_of,
    redis_counters,
    split_by_owner,
)
from bench._suite import Context
from bench.celery_steps import _Side, _until, _wait_ready

#: Runs whose Redis keys' ``MEMORY USAGE`` is summed for the bytes stored per run.
_MEMORY_SAMPLE = 20
T = TypeVar("T")
#: Plain round trips timed for the store server's floor.
FLOOR_TRIPS = 3000
#: Seconds between two looks at whether every run is done.
POLL_S = 0.05


async def _steady(read: Callable[[], Awaitable[T]]) -> T:
    """Read until two readings in a row are the same (each `read` takes its own time); return the last."""
    last = await read()
    deadline = time.monotonic() + 120
    while (now := await read()) != last:
        if time.monotonic() > deadline:
            raise TimeoutError("the counts did not settle")
        last = now
    return now


class _Config:
    """What both deployments share: the workers, the client, the runs started."""

    key = ""
    label = ""

    def __init__(self, ctx: Context, name: str, values: dict[str, Any]) -> None:
        from config import Settings

        self.side = _Side(name, ctx.tag, "redis://127.0.0.1:6379/0", ctx.key, 1, ctx.tmp)
        self.side.values.pop("redis_url")  # each deployment names its own servers
        self.side.values.update(values)
        self.side.settings = Settings(**self.side.values)
        self.run_ids: list[str] = []
        self.polls = 0
        #: This process's CPU in the rounds: the client starting runs (and this benchmark's looks at them).
        self.client_cpu_s = 0.0
        self.client: Any = None
        self.app: Any = None

    def open_client(self) -> None:
        from agentflow.celery import FlowClient
        from workers.build import build

        self.app, tasks = build(self.side.settings)
        self.client = FlowClient(tasks)

    async def add_worker(self) -> None:
        names = self.side.start_workers("workers", count=1)
        await asyncio.to_thread(_wait_ready, self.app, names, self.side.procs, self.side.tmp)

    @property
    def workers(self) -> int:
        return len(self.side.procs)

    async def round(self, runs: int) -> float:
        """Seconds from the first start of `runs` runs until every one is done."""
        began, cpu = time.perf_counter(), time.process_time()
        for _ in range(runs):
            self.run_ids.append(await self.client.start(chain.name, {"n": 0}))
        await _until(self.done, timeout_s=900, poll_s=POLL_S)
        self.client_cpu_s += time.process_time() - cpu
        return time.perf_counter() - began

    async def done(self) -> bool:
        self.polls += 1
        return not await self.unfinished()

    def common(self) -> dict[str, Any]:
        """The readings both deployments take: the workers' CPU, this process's, the looks taken."""
        return {
            "workers_cpu": cpu_s([p.pid for p in self.side.procs]),
            "client_cpu": self.client_cpu_s,
            "polls": self.polls,
        }

    async def setup(self) -> None:
        raise NotImplementedError

    async def unfinished(self) -> int:
        raise NotImplementedError

    async def instant(self) -> dict[str, Any]:
        raise NotImplementedError

    async def settled(self) -> dict[str, Any]:
        raise NotImplementedError

    def costs(self, before: dict[str, Any], after: dict[str, Any], steps: int) -> dict[str, Any]:
        raise NotImplementedError

    async def stored_per_run(self) -> dict[str, Any]:
        raise NotImplementedError

    async def count_round(self, runs: int) -> dict[str, Any]:
        """One more round of `runs` runs with the broker's traffic counted by what it is; figures per superstep."""
        raise NotImplementedError

    async def floor_us(self) -> float:
        """The store server's CPU (µs) for one plain round trip (``PING``, ``SELECT 1``), one after another."""
        raise NotImplementedError

    async def close(self) -> None:
        self.side.stop()


class RedisConfig(_Config):
    """One Redis (a private server) as broker, result backend and store."""

    key, label = "redis", "Redis (broker and store)"

    def __init__(self, ctx: Context) -> None:
        import redis.asyncio

        self.server = PrivateRedis(ctx.tmp)
        self.ctx = ctx
        super().__init__(ctx, "rds", {"redis_url": self.server.url})
        self.redis = redis.asyncio.Redis.from_url(self.server.url)
        self.prefix = self.side.settings.key_prefix

    async def setup(self) -> None:
        await self.server.ready(self.redis)
        self.open_client()

    async def unfinished(self) -> int:
        return int(await self.redis.zcard(f"{self.prefix}:unfinished:{chain.name}"))

    async def instant(self) -> dict[str, Any]:
        return {**self.common(), **await redis_counters(self.redis)}

    async def settled(self) -> dict[str, Any]:
        return {}

    def costs(self, before: dict[str, Any], after: dict[str, Any], steps: int) -> dict[str, Any]:
        calls = {
            name: n - before["calls"].get(name, 0)
            for name, n in after["calls"].items()
            if name not in OURS and n > before["calls"].get(name, 0)
        }
        usec = {name: after["exec_us"][name] - before["exec_us"].get(name, 0.0) for name in calls}
        return {
            "worker_cpu_ms": 1e3 * (after["workers_cpu"] - before["workers_cpu"]) / steps,
            "client_cpu_ms": 1e3 * (after["client_cpu"] - before["client_cpu"]) / steps,
            "redis_commands": sum(calls.values()) / steps,
            "redis_cpu_us": 1e6 * (after["cpu_s"] - before["cpu_s"]) / steps,
            "memory_per_run": (after["used_memory"] - before["used_memory"]) / (steps / STEPS),
            "commands": {name: n / steps for name, n in sorted(calls.items(), key=lambda kv: -kv[1])},
            "command_us": {name: us / steps for name, us in usec.items()},
        }

    async def bare_tasks(self, chains: int) -> dict[str, float]:
        """P3's other side on this server: `chains` bare chains of Celery tasks through one worker, its CPU per task.

        Each task only enqueues the next (the last one counts its chain done), with agentflow's
        Celery settings: what a superstep's task costs before agentflow does anything.
        """
        side = _Side("bare", self.ctx.tag, self.server.url, self.ctx.key, 1, self.ctx.tmp)
        app, queue = make_bare_app(side.settings), side.values["queue"]
        done_key = f"{side.settings.key_prefix}:bench:done"

        async def chains_done(first: int, count: int) -> None:
            for i in range(first, first + count):
                args = (str(i), 0, STEPS)
                await asyncio.to_thread(app.send_task, "bench.chain_step", args=args, task_id=f"bc-{i}-0", queue=queue)
            target = first + count

            async def done() -> bool:
                return int(await self.redis.get(done_key) or 0) >= target

            await _until(done, timeout_s=900, poll_s=0.2)

        try:
            names = side.start_workers("bench._celery_apps:bare", count=1)
            await asyncio.to_thread(_wait_ready, app, names, side.procs, side.tmp)
            await chains_done(0, 2)  # warm-up
            worker, server = cpu_s([p.pid for p in side.procs]), (await redis_counters(self.redis))["cpu_s"]
            await chains_done(2, chains)
            tasks = chains * STEPS
            return {
                "worker_cpu_ms": 1e3 * (cpu_s([p.pid for p in side.procs]) - worker) / tasks,
                "redis_cpu_us": 1e6 * ((await redis_counters(self.redis))["cpu_s"] - server) / tasks,
            }
        finally:
            side.stop()

    async def floor_us(self) -> float:
        before: float = (await redis_counters(self.redis))["cpu_s"]
        for _ in range(FLOOR_TRIPS):
            await self.redis.ping()
        after: float = (await redis_counters(self.redis))["cpu_s"]
        return 1e6 * (after - before) / FLOOR_TRIPS

    async def stored_per_run(self) -> dict[str, Any]:
        usage: list[int] = []
        for run_id in self.run_ids[:: max(1, len(self.run_ids) // _MEMORY_SAMPLE)][:_MEMORY_SAMPLE]:
            keys = [k async for k in self.redis.scan_iter(match=f"{self.prefix}:run:{{{run_id}}}:*", count=100)]
            usage.append(sum([int(await self.redis.memory_usage(k) or 0) for k in keys]))
        return {
            "runs": len(self.run_ids),
            "store_keys_per_run": sum(usage) / len(usage),
        }

    async def count_round(self, runs: int) -> dict[str, Any]:
        """With ``MONITOR`` on: the commands and round trips of the store and of Celery, and the scripts' commands."""
        monitor = RedisMonitor(self.server.url)
        try:
            await monitor.start(self.redis)
            await self.round(runs)
            await _steady(lambda: asyncio.sleep(0.5, monitor.settled_count()))
        finally:
            await monitor.stop()
        found, steps = split_by_owner(monitor.seen, f"{self.prefix}:celery:"), runs * STEPS
        out: dict[str, Any] = {"lua": {name: n / steps for name, n in found["lua"].items()}}
        for owner in ("store", "celery"):
            part = found[owner]
            out[owner] = {
                "sent": part["sent"] / steps,
                "round_trips": part["round_trips"] / steps,
                "by_name": {name: n / steps for name, n in sorted(part["by_name"].items(), key=lambda kv: -kv[1])},
            }
        return out

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            await self.redis.aclose()
            self.server.stop()


class RabbitPgConfig(_Config):
    """RabbitMQ (a virtual host of ours) as the broker, PostgreSQL (a database of ours) as the store."""

    key, label = "rabbit_pg", "RabbitMQ + PostgreSQL"

    def __init__(self, ctx: Context, pg_admin_url: str) -> None:
        self.vhost = RabbitVhost(f"{ctx.tag}-scaling")
        self.db = PgDatabase(pg_admin_url, ctx.tag.lower())
        super().__init__(ctx, "rmq", {"broker_url": self.vhost.url, "store_url": self.db.url})
        self.table_prefix = f"{self.side.settings.key_prefix.lower().replace('-', '_')}_"
        self.conn: Any = None
        self.beam = pid_of("beam.smp")

    async def setup(self) -> None:
        import asyncpg

        await asyncio.to_thread(self.vhost.create)
        await self.db.create()
        self.open_client()
        self.conn = await asyncpg.connect(self.db.url.replace("postgresql+asyncpg://", "postgresql://", 1))
        self.own_pid = await self.conn.fetchval("SELECT pg_backend_pid()")

    async def unfinished(self) -> int:
        return int(
            await self.conn.fetchval(
                f"SELECT count(*) FROM \"{self.table_prefix}runs\" WHERE flow = $1 AND status IN ('running', 'paused')",
                chain.name,
            )
        )

    async def instant(self) -> dict[str, Any]:
        found = await self.db.counters(self.own_pid)
        return {
            **self.common(),
            "backend_cpu": found["backend_cpu"],
            "beam_cpu": cpu_s([self.beam], children=False) if self.beam else 0.0,
        }

    async def settled(self) -> dict[str, Any]:
        found = await self.db.counters(self.own_pid)
        return {"xacts": found["xacts"], "connections": await asyncio.to_thread(self.vhost.connections)}

    def costs(self, before: dict[str, Any], after: dict[str, Any], steps: int) -> dict[str, Any]:
        backends = sum(cpu - before["backend_cpu"].get(pid, 0.0) for pid, cpu in after["backend_cpu"].items())
        sockets = connection_delta(before["connections"], after["connections"])
        return {
            "worker_cpu_ms": 1e3 * (after["workers_cpu"] - before["workers_cpu"]) / steps,
            "client_cpu_ms": 1e3 * (after["client_cpu"] - before["client_cpu"]) / steps,
            "pg_xacts": (after["xacts"] - before["xacts"] - (after["polls"] - before["polls"])) / steps,
            "pg_cpu_us": 1e6 * backends / steps,
            "rabbit_cpu_us": 1e6 * (after["beam_cpu"] - before["beam_cpu"]) / steps,
            "rabbit_reads": sockets.get("recv_cnt", 0) / steps,
            "rabbit_writes": sockets.get("send_cnt", 0) / steps,
            "rabbit_bytes": (sockets.get("recv_oct", 0) + sockets.get("send_oct", 0)) / steps,
        }

    async def floor_us(self) -> float:
        before = cpu_s([self.own_pid], children=False)
        for _ in range(FLOOR_TRIPS):
            await self.conn.fetchval("SELECT 1")
        return 1e6 * (cpu_s([self.own_pid], children=False) - before) / FLOOR_TRIPS

    async def stored_per_run(self) -> dict[str, Any]:
        tables = await PgDatabase.stored_bytes(self.conn, self.table_prefix)
        runs = len(self.run_ids)
        return {
            "runs": runs,
            "disk_per_run": sum(t["disk"] for t in tables.values()) / runs,
            "row_bytes_per_run": sum(t["row_bytes"] for t in tables.values()) / runs,
            "tables": tables,
        }

    async def count_round(self, runs: int) -> dict[str, Any]:
        """Bind two queues of ours (task messages, task events) to the exchanges, run `runs` runs, count copies."""
        exchanges = await asyncio.to_thread(self.vhost.topic_exchanges)
        tasks_q, events_q = f"sink-tasks-{secrets.token_hex(3)}", f"sink-events-{secrets.token_hex(3)}"
        await asyncio.to_thread(self.vhost.sink, tasks_q, [x for x in exchanges if x != "celeryev"], "#")
        await asyncio.to_thread(self.vhost.sink, events_q, ["celeryev"], "task.#")
        await self.round(runs)
        last = await _steady(lambda: asyncio.to_thread(self.vhost.queue_lengths))  # events may still be on the way
        steps = runs * STEPS
        return {"task_messages": last.get(tasks_q, 0) / steps, "event_messages": last.get(events_q, 0) / steps}

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            try:
                if self.conn is not None:
                    await self.conn.close()
                await self.db.drop()
            finally:
                await asyncio.to_thread(self.vhost.delete)
