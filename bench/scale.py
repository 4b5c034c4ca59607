"""P8: scale. 10,000 runs through 2 Celery workers on one Redis, sampled while they go.

The deployment is P3's agentflow side (`bench.celery_steps`): 2 workers, ``celery -A
workers worker -P prefork -c 1``, the Redis store, broker and result backend on one
server, the 10-superstep flow ``chain10`` (`bench._celery_apps`). All the runs are started
at once with `FlowClient.start` (each saves its step 0 and enqueues its first superstep);
Celery's queue is first in, first out, so the runs advance in waves and most finish near
the end. Every few seconds a sampler reads:

- the supersteps done: the sum over the runs of their latest step (``HGET`` of each run's
  latest hash, pipelined), so the rate is exact whatever the order the runs finish in;
- the runs still unfinished (the store's ``unfinished`` index);
- Redis's ``used_memory``, and the RSS of each worker's processes (``/proc``).

Reported: the completion time, supersteps/s over time (its first and last thirds compared:
flat means no slowing as the store grows), Redis memory per finished run (``used_memory``
after minus before, over the runs; and ``MEMORY USAGE`` of the keys of sampled runs, the
store's own share, the rest being Celery's results and queues), and each worker's RSS at
the start and at the end. Its keys are removed afterwards.

Run alone: ``python -m bench --only scale`` (``--quick``: 300 runs); about 10 minutes here.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

from bench._celery_apps import STEPS, chain
from bench._report import Report, Table
from bench._suite import Context
from bench.celery_steps import _Side, _until, _wait_ready

TITLE = "P8: 10,000 runs through 2 Celery workers on one Redis (completion, supersteps/s over time, memory)"
#: Seconds between samples.
SAMPLE_S = 3.0
#: Runs whose keys' MEMORY USAGE is read at the end.
_MEMORY_SAMPLE = 50
#: A finished run's keys in the store (`RedisCheckpointStore`'s layout).
_PARTS = ("cp", "latest", "calls", "next", "events", "packed")


def _rss_mib(pid: int) -> float:
    """The resident set of process `pid` and its children (a prefork worker and its pool), in MiB."""
    total, todo = 0.0, [pid]
    while todo:
        proc = todo.pop()
        try:
            status = Path(f"/proc/{proc}/status").read_text()
            kids = Path(f"/proc/{proc}/task/{proc}/children").read_text().split()
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0) / 1024
        todo += [int(kid) for kid in kids]
    return total


class _Sampler:
    """Samples the runs' progress, Redis's memory and the workers' RSS."""

    def __init__(self, redis: Any, prefix: str, pids: list[int]) -> None:
        self.redis, self.prefix, self.pids = redis, prefix, pids
        self.run_ids: list[str] = []
        self.samples: list[dict[str, Any]] = []
        self.began = time.perf_counter()

    async def steps_done(self) -> int:
        done = 0
        for start in range(0, len(self.run_ids), 2000):
            pipe = self.redis.pipeline(transaction=False)
            for run_id in self.run_ids[start : start + 2000]:
                pipe.hget(f"{self.prefix}:run:{{{run_id}}}:latest", "step")
            done += sum(int(step or 0) for step in await pipe.execute())
        return done

    async def sample(self) -> dict[str, Any]:
        row = {
            "t_s": time.perf_counter() - self.began,
            "started": len(self.run_ids),
            "steps": await self.steps_done(),
            "unfinished": int(await self.redis.zcard(f"{self.prefix}:unfinished:{chain.name}")),
            "used_memory": int((await self.redis.info("memory"))["used_memory"]),
            "rss_mib": [_rss_mib(pid) for pid in self.pids],
        }
        self.samples.append(row)
        return row

    async def every(self, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)
            await self.sample()


async def _measure(ctx: Context, url: str, runs: int) -> dict[str, Any]:
    import redis.asyncio

    from agentflow.celery import FlowClient
    from workers.build import build

    side = _Side("scale", ctx.tag, url, ctx.key, 1, ctx.tmp)
    app, tasks = build(side.settings)
    client = FlowClient(tasks)
    prefix = side.settings.key_prefix
    r = redis.asyncio.Redis.from_url(url)
    try:
        names = side.start_workers("workers")
        await asyncio.to_thread(_wait_ready, app, names, side.procs, side.tmp)
        sampler = _Sampler(r, prefix, [p.pid for p in side.procs])
        for _ in range(4):  # warm-up: imports, connections, scripts loaded
            sampler.run_ids.append(await client.start(chain.name, {"n": 0}))
        await _until(lambda: _none_left(r, prefix), timeout_s=120, poll_s=0.05)
        warm = len(sampler.run_ids)
        before = await sampler.sample()
        sampler.began, before["t_s"] = time.perf_counter(), 0.0
        ticking = asyncio.create_task(sampler.every(SAMPLE_S))
        began = time.perf_counter()
        for _ in range(runs):
            sampler.run_ids.append(await client.start(chain.name, {"n": 0}))
        started_s = time.perf_counter() - began
        await _until(lambda: _none_left(r, prefix), timeout_s=7200, poll_s=0.5)
        total_s = time.perf_counter() - began
        ticking.cancel()
        after = await sampler.sample()
        usage: dict[str, list[int]] = {part: [] for part in _PARTS}
        for run_id in sampler.run_ids[warm :: max(1, runs // _MEMORY_SAMPLE)][:_MEMORY_SAMPLE]:
            for part in _PARTS:
                usage[part].append(int(await r.memory_usage(f"{prefix}:run:{{{run_id}}}:{part}") or 0))
        return {
            "runs": runs,
            "steps_per_run": STEPS,
            "start_s": started_s,
            "total_s": total_s,
            "before": before,
            "after": after,
            "samples": sampler.samples,
            "store_bytes_per_run": {part: statistics.median(found) for part, found in usage.items() if found},
            "steps_expected": (runs + warm) * STEPS,
        }
    finally:
        side.stop()
        keys = [k async for k in r.scan_iter(match=f"{prefix}*", count=1000)]
        for i in range(0, len(keys), 500):
            await r.delete(*keys[i : i + 500])
        await r.aclose()


async def _none_left(r: Any, prefix: str) -> bool:
    return not await r.zcard(f"{prefix}:unfinished:{chain.name}")


def _rates(samples: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(time, supersteps/s) between consecutive samples."""
    return [
        (b["t_s"], (b["steps"] - a["steps"]) / (b["t_s"] - a["t_s"]))
        for a, b in zip(samples, samples[1:], strict=False)
        if b["t_s"] > a["t_s"]
    ]


async def run(ctx: Context) -> Report:
    report = Report("scale", TITLE)
    url = ctx.services.redis_url
    if url is None:
        report.notes.append(f"skipped: {ctx.services.redis_why}")
        return report
    found = await _measure(ctx, url, ctx.sized(10_000, 300))
    samples = found["samples"]
    rates = [rate for _, rate in _rates(samples[1:])]  # from the first sample after the start
    third = max(1, len(rates) // 3)
    first, last = rates[:third], rates[-third:]
    runs, total = found["runs"], found["total_s"]
    before, after = found["before"], found["after"]
    memory = (after["used_memory"] - before["used_memory"]) / runs
    table = Table(
        f"{runs:,} runs of {STEPS} supersteps, 2 workers x prefork -c 1, one Redis (samples every {SAMPLE_S:.0f} s)",
        ["measured", "value"],
    )
    table.add("all runs started (FlowClient.start, one after another)", f"{found['start_s']:.1f} s")
    table.add("all runs finished", f"{total:.1f} s ({runs * STEPS / total:.0f} supersteps/s on average)")
    table.add(
        "supersteps/s, first third / last third of the samples (median)",
        f"{statistics.median(first):.0f} / {statistics.median(last):.0f}"
        f" ({statistics.median(last) / statistics.median(first):.2f}x)"
        if rates
        else "",
    )
    table.add("Redis used_memory per finished run (store, results, queues)", f"{memory / 1024:.1f} KiB")
    parts = found["store_bytes_per_run"]
    table.add(
        "the store's keys of a finished run (MEMORY USAGE, median of each)",
        f"{sum(parts.values()) / 1024:.1f} KiB: " + ", ".join(f"{k} {v / 1024:.1f}" for k, v in parts.items()),
    )
    table.add(
        "worker RSS, before the runs -> after (MiB, each worker with its pool)",
        ", ".join(f"{a:.1f} -> {b:.1f}" for a, b in zip(before["rss_mib"], after["rss_mib"], strict=True)),
    )
    table.add("supersteps done / expected", f"{after['steps']:,} / {found['steps_expected']:,}")
    report.tables.append(table)
    report.data = found
    return report


def plot(report: Report, out_dir: Path) -> list[Path]:
    """Supersteps/s over time, Redis memory and the workers' RSS over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = report.data.get("samples", [])
    if len(samples) < 3:
        return []
    rates = _rates(samples[1:])
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    top.plot([t for t, _ in rates], [r for _, r in rates], color="tab:blue")
    top.set_ylabel("supersteps/s")
    top.set_ylim(bottom=0)
    top.set_title(
        f"{report.data['runs']:,} runs x {report.data['steps_per_run']} supersteps, 2 Celery workers, one Redis"
    )
    top.grid(alpha=0.3)
    times = [s["t_s"] for s in samples]
    bottom.plot(times, [s["used_memory"] / 2**20 for s in samples], color="tab:red", label="Redis used_memory")
    for i in range(len(samples[0]["rss_mib"])):
        bottom.plot(times, [s["rss_mib"][i] for s in samples], label=f"worker {i + 1} RSS (with its pool)")
    bottom.set_ylabel("MiB")
    bottom.set_xlabel("seconds since the first start")
    bottom.set_ylim(bottom=0)
    bottom.legend(fontsize=8)
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "bench-scale.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
