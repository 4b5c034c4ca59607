"""P3: supersteps per second end to end on Celery + Redis, next to bare Celery chained tasks.

Both sides run on the same machine in the same benchmark run, with the same Celery
configuration (`config.Settings.celery()`: Redis broker and result backend, JSON, late
acks, prefetch 1, task events) and the same task options (those `register_tasks` sets:
acks_late, reject/retry on worker lost, time limits), on 2 worker processes each
(``celery worker -P prefork -c C``; C = 1 and 2 are measured):

- agentflow: a 10-node linear flow of one trivial idempotent tool. `FlowClient.start`
  saves step 0 and enqueues the first superstep. Each superstep task goes through the
  run protocol (`FlowRunner.advance`), which holds the run's lease in the checkpoint
  store (`agentflow.exec.run.lease.holding_reading_head`: on Redis one script takes the
  lease and reads the run's head, its latest checkpoint and records per segment). It
  looks for a cancel request, continues the segment after a clean handoff, logs the call
  ``started``, saves ``done`` with the signed checkpoint in one script, appends the
  superstep's events in one script, releases the lease (``release_lease``) and enqueues
  the next superstep: 6 round trips to the store (counted with a recording client). The
  lease's renewal is a timer due after a third of the lease (10 s); these steps end long
  before it, so none of them renews.
- bare Celery: chains of 10 tasks, each enqueueing its successor (same deterministic
  task ids), the last one counting the chain as done.

R runs (chains) start at once; the time runs from the first start until the last run is
done (one Redis read every 20 ms on either side), so the rate is supersteps (tasks) per second of wall time.
The two sides alternate round by round (the order rotating) while all four workers stay
up. Also measured: the latency per step of one run alone.

Run alone: ``python -m bench.celery_steps [--quick]`` (Redis at ``BENCH_REDIS_URL``).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench._celery_apps import STEPS, chain, make_bare_app
from bench._report import Report, Table, Target
from bench._suite import Context
from bench._timing import Series, fmt_ratio, fmt_span

TITLE = "P3: Celery supersteps/s end to end vs bare Celery chained tasks (2 prefork workers)"
#: P3 targets: agentflow's rate at least this fraction of the bare chain's (issue 6, issue 8).
TARGETS = {"issue 6": 0.6, "issue 8": 0.85}
ROOT = Path(__file__).resolve().parent.parent

# ---- the benchmark ----------------------------------------------------------------------


class _Side:
    """One side's settings, worker processes and client."""

    def __init__(self, name: str, tag: str, redis_url: str, key: bytes, concurrency: int, tmp: Path) -> None:
        from config import Settings

        self.name = name
        self.values: dict[str, Any] = {
            "app": "bench._celery_apps:app",
            "redis_url": redis_url,
            "checkpoint_keys": "hex:" + key.hex(),
            "key_prefix": f"{tag}{name}",
            "queue": f"{tag}-{name}",
            "store_allow_volatile": True,  # the machine's Redis keeps nothing on disk: said so
        }
        self.settings = Settings(**self.values)
        self.concurrency = concurrency
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []

    def start_workers(self, app_path: str, count: int = 2) -> list[str]:
        env = {
            **os.environ,
            **{f"AGENTFLOW_{k.upper()}": str(v) for k, v in self.values.items()},
            "PYTHONPATH": str(ROOT),
        }
        names = []
        for i in range(count):
            name = f"{self.name}{i}-{secrets.token_hex(3)}"
            log = open(self.tmp / f"{name}.log", "wb")  # the child keeps its own copy
            argv = [
                sys.executable,
                "-m",
                "celery",
                "-A",
                app_path,
                "worker",
                "-P",
                "prefork",
                "-c",
                str(self.concurrency),
                "-n",
                f"{name}@%h",
                "-Q",
                self.values["queue"],
                "--without-mingle",
                "--without-gossip",
                "-l",
                "WARNING",
            ]
            self.procs.append(
                subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            )
            log.close()
            names.append(f"{name}@{socket.gethostname()}")
        return names

    def stop(self) -> None:
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)


def _wait_ready(celery_app: Any, names: list[str], procs: list[subprocess.Popen[bytes]], tmp: Path) -> None:
    deadline = time.monotonic() + 60
    waiting = set(names)
    while waiting:
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            logs = "\n".join(p.read_text()[-1500:] for p in tmp.glob("*.log"))
            raise RuntimeError(f"workers {sorted(waiting)} did not come up:\n{logs}")
        for reply in celery_app.control.ping(destination=sorted(waiting), timeout=0.5) or []:
            waiting -= set(reply)


async def _until(check: Any, timeout_s: float, poll_s: float = 0.02) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError("the runs did not finish in time")
        await asyncio.sleep(poll_s)


class _Bench:
    """Both sides up; one round of either on demand."""

    def __init__(self, ctx: Context, redis_url: str, concurrency: int) -> None:
        import redis.asyncio

        from agentflow.celery import FlowClient
        from workers.build import build

        tag = f"{ctx.tag}c{concurrency}"
        self.af = _Side("af", tag, redis_url, ctx.key, concurrency, ctx.tmp)
        self.bare = _Side("bare", tag, redis_url, ctx.key, concurrency, ctx.tmp)
        self.af_app, tasks = build(self.af.settings)
        self.client = FlowClient(tasks)
        self.unfinished_key = f"{self.af.settings.key_prefix}:unfinished:{chain.name}"  # the store's index
        self.bare_app = make_bare_app(self.bare.settings)
        self.redis = redis.asyncio.Redis.from_url(redis_url)
        self.done_key = f"{self.bare.settings.key_prefix}:bench:done"
        self.prefixes = [self.af.settings.key_prefix, self.bare.settings.key_prefix]
        self.chains = 0

    def start(self) -> None:
        af_names = self.af.start_workers("workers")
        bare_names = self.bare.start_workers("bench._celery_apps:bare")
        _wait_ready(self.af_app, af_names, self.af.procs, self.af.tmp)
        _wait_ready(self.bare_app, bare_names, self.bare.procs, self.bare.tmp)

    async def agentflow(self, runs: int, poll_s: float = 0.02) -> float:
        """Seconds for `runs` runs of the 10-step flow, started at once, to be done."""

        async def finished() -> bool:  # one ZCARD, as cheap as the bare side's GET
            return not await self.redis.zcard(self.unfinished_key)

        began = time.perf_counter()
        for _ in range(runs):
            await self.client.start(chain.name, {"n": 0})
        await _until(finished, timeout_s=300, poll_s=poll_s)
        return time.perf_counter() - began

    async def celery(self, runs: int, poll_s: float = 0.02) -> float:
        """Seconds for `runs` bare chains of 10 tasks, started at once, to be done."""
        target = int(await self.redis.get(self.done_key) or 0) + runs
        queue = self.bare.values["queue"]

        async def finished() -> bool:
            return int(await self.redis.get(self.done_key) or 0) >= target

        began = time.perf_counter()
        for _ in range(runs):
            self.chains += 1
            chain_id = f"{self.chains}-{secrets.token_hex(4)}"
            await asyncio.to_thread(
                self.bare_app.send_task,
                "bench.chain_step",
                args=(chain_id, 0, STEPS),
                task_id=f"bc-{chain_id}-0",
                queue=queue,
            )
        await _until(finished, timeout_s=300, poll_s=poll_s)
        return time.perf_counter() - began

    async def close(self) -> None:
        self.af.stop()
        self.bare.stop()
        for prefix in self.prefixes:
            keys = [k async for k in self.redis.scan_iter(match=f"{prefix}*", count=1000)]
            for i in range(0, len(keys), 500):
                await self.redis.delete(*keys[i : i + 500])
        await self.redis.aclose()


async def _measure(ctx: Context, redis_url: str, concurrency: int, runs: int, rounds: int) -> dict[str, Any]:
    bench = _Bench(ctx, redis_url, concurrency)
    try:
        bench.start()
        sides = {"agentflow": bench.agentflow, "bare Celery": bench.celery}
        for fn in sides.values():  # warm-up: connections, imports, first-task costs
            await fn(max(4, runs // 10))
        rates: dict[str, list[float]] = {name: [] for name in sides}
        for r in range(rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for name in order:
                seconds = await sides[name](runs)
                rates[name].append(runs * STEPS / seconds)
        latency: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(ctx.sized(7, 3)):
            for name, fn in sides.items():
                latency[name].append(await fn(1, poll_s=0.002) / STEPS)
        return {"rates": rates, "latency": latency}
    finally:
        await bench.close()


async def run(ctx: Context) -> Report:
    report = Report("celery_steps", TITLE)
    redis_url = ctx.services.redis_url
    if redis_url is None:
        report.notes.append(f"skipped: {ctx.services.redis_why}")
        return report
    runs, rounds = ctx.sized(100, 20), ctx.sized(5, 1)
    levels = (1, 2) if not ctx.quick else (1,)
    rates = Table(
        f"Steps per second, {runs} runs x {STEPS} steps started at once, 2 workers x prefork -c C "
        f"(median of {rounds} rounds, sides alternating; min..max)",
        ["C", "agentflow supersteps/s", "bare Celery tasks/s", "agentflow / bare"],
        note="Both sides: Redis broker and result backend, JSON, acks_late, prefetch 1, task events on.",
    )
    lat = Table("Latency per step, one run alone (median; min..max)", ["C", "agentflow superstep", "bare Celery task"])
    report.data = {"runs": runs, "steps": STEPS, "rounds": rounds, "levels": {}}
    for c in levels:
        found = await _measure(ctx, redis_url, c, runs, rounds)
        af, bare = Series.of(found["rates"]["agentflow"]), Series.of(found["rates"]["bare Celery"])
        ratio = af.ratio(bare)
        rates.add(c, _fmt_rate(af), _fmt_rate(bare), fmt_ratio(ratio))
        af_lat, bare_lat = Series.of(found["latency"]["agentflow"]), Series.of(found["latency"]["bare Celery"])
        lat.add(c, fmt_span(af_lat), fmt_span(bare_lat))
        report.data["levels"][c] = {
            "agentflow_steps_s": af,
            "bare_steps_s": bare,
            "ratio": ratio,
            "latency_agentflow_s": af_lat,
            "latency_bare_s": bare_lat,
        }
        if c == levels[0]:
            for issue, limit in TARGETS.items():
                report.targets.append(
                    Target(
                        f"P3 Celery ratio, -c {c} ({issue})",
                        ratio.median,
                        limit,
                        fmt_ratio(ratio),
                        f">= {limit}x",
                        at_least=True,
                    )
                )
    report.tables += [rates, lat]
    return report


def _series(value: Any) -> Series:
    return value if isinstance(value, Series) else Series.of(value["blocks"])


def plot(report: Report, out_dir: Path) -> list[Path]:
    """Steps per second, agentflow next to bare Celery, per pool size, with the ratio over each pair."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = report.data.get("levels") or {}
    if not levels:
        return []
    fig, ax = plt.subplots(figsize=(7, 4.4))
    width = 0.36
    for i, (_c, found) in enumerate(sorted(levels.items(), key=lambda kv: int(kv[0]))):
        pair = [("agentflow supersteps", found["agentflow_steps_s"]), ("bare Celery tasks", found["bare_steps_s"])]
        for j, (label, raw) in enumerate(pair):
            series = _series(raw)
            x = i + (j - 0.5) * width
            err = [[series.median - series.lo], [series.hi - series.median]]
            ax.bar(
                x,
                series.median,
                width,
                yerr=err,
                capsize=4,
                color=("tab:blue", "tab:gray")[j],
                label=label if i == 0 else None,
            )
            ax.annotate(
                f"{series.median:.0f}/s",
                (x, series.median),
                textcoords="offset points",
                xytext=(0, 4),
                ha="center",
                fontsize=8,
            )
        ratio = _series(found["ratio"]).median
        top = max(_series(found["bare_steps_s"]).hi, _series(found["agentflow_steps_s"]).hi)
        ax.annotate(
            f"{ratio:.2f}x of bare",
            (i, top),
            textcoords="offset points",
            xytext=(0, 16),
            ha="center",
            fontsize=10,
            weight="bold",
        )
    ax.set_xticks(range(len(levels)), [f"2 workers x -c {c}" for c in sorted(levels, key=int)])
    ax.set_ylabel("steps per second (median, min..max over rounds)")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.15)
    ax.set_title(
        f"P3: {report.data.get('runs')} runs of {report.data.get('steps')} supersteps vs bare chained Celery tasks",
        fontsize=10,
    )
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "bench-celery-steps.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return [path]


def _fmt_rate(series: Series) -> str:
    return f"{series.median:.0f} ({series.lo:.0f}..{series.hi:.0f})"


def main() -> int:
    import argparse
    import json
    import shutil
    import tempfile

    from bench._env import probe_services

    parser = argparse.ArgumentParser(prog="python -m bench.celery_steps", description=TITLE)
    parser.add_argument("--quick", action="store_true", help="a smoke run (20 runs, 1 round, -c 1 only)")
    args = parser.parse_args()
    services = asyncio.run(probe_services())
    tmp = Path(tempfile.mkdtemp(prefix="agentflow-bench-celery-"))
    try:
        report = asyncio.run(run(Context(quick=args.quick, tmp=tmp, services=services)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(report.text())
    summary = {
        str(c): {
            "agentflow": v["agentflow_steps_s"].median,
            "bare": v["bare_steps_s"].median,
            "ratio": v["ratio"].median,
        }
        for c, v in report.data.get("levels", {}).items()
    }
    print(json.dumps({"load_average": os.getloadavg(), "medians": summary}))
    return 0


if __name__ == "__main__":
    # Run the importable module's main, so that the workers' and this process's classes are the same ones.
    from bench import celery_steps

    sys.exit(celery_steps.main())
