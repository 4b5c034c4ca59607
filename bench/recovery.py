"""Issue 14: how soon a run whose worker was SIGKILLed moves again, with the default settings.

The deployment is the runnable one (``celery -A workers worker`` and ``celery -A workers
beat``, configured from ``AGENTFLOW_*`` variables), with every timing setting at its
default: lease 30 s (renewed every 10 s), recheck margin 1 s, beat's ``recover_all``
every 60 s, runs left alone by ``recover_all`` until their last save is 10 s old. Workers
are ``--pool=prefork --concurrency=1 --without-mingle --without-gossip``, one queue.

One round:

- K workers are up, and K runs of a one-node flow start, staggered over one renewal
  period (lease / 3) so the kills land at every phase of the lease renewal. The flow's
  idempotent tool sleeps 300 s on its first call and returns at once on a rerun
  (`bench._recovery_app`). Each worker ends up inside one run's tool call, holding that
  run's lease (checked: K distinct holders).
- After a random wait of up to one renewal period, the K workers' process groups (main
  process and pool process) are SIGKILLed, each kill's time recorded, and K fresh workers
  are started at once, as a supervisor (systemd, Kubernetes) restarts a dead worker.
- The runs' latest checkpoints are read every 20 ms until each run's step moves past
  where it was: a worker claimed it (a claim checkpoint, in a new segment) and reran the
  tool. The time from its worker's kill to that read is the figure. Also recorded: when
  the dead worker's lease was due to lapse (read after the kill, so no renewal can move
  it), the claim's own ``saved_at``, and which message moved the run (``recheck``: sent
  by a starting worker's ``recover_all`` for when the lease lapses; ``recover``: a
  ``recover_all`` found the run unheld, on a worker's start or beat's tick).

- Kills also land at other moments: while the runs are being watched, half of the fresh
  workers are SIGKILLed again at a random moment within `SECOND_WAVE_S` of their start
  (inside their start-up, or inside the ``recover_all`` it runs, which may hold the sweep's
  lock and may have sent a recheck it then takes down with it), and are started afresh at
  once. The figure stays the time from the first kill: what a run waits for when its
  worker dies, and then the worker that was to recover it dies too.

The fresh workers are the next round's. Rounds x K = the kills (5 x 10 = 50; ``--quick``:
1 x 4), plus the second wave's (half as many). Beat runs throughout, as in production: it is
the safety net, not the measured path.

Run alone: ``python -m bench.recovery [--quick] [--keep-logs]`` (Redis at ``BENCH_REDIS_URL``).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._recovery_app import FLOW
from bench._recovery_plot import plot as plot  # the suite draws it after a run (`bench.__main__`)
from bench._report import Report, Table, Target
from bench._suite import Context

TITLE = "Issue 14: SIGKILL → the run moving again, default settings (lease 30 s, beat 60 s)"
ROOT = Path(__file__).resolve().parent.parent
#: Issue 14: p95 of SIGKILL → moving again at most lease_s + this.
SLACK_S = 5.0
POLL_S = 0.02
#: The second wave of kills lands within this many seconds of the fresh workers' start.
SECOND_WAVE_S = 3.0
#: The settings that pace recovery; the benchmark gives workers and beat their defaults.
DEFAULTS = ("lease_s", "recheck_margin_s", "recover_interval_s", "stale_after_s", "recover_lock_s")


@dataclass
class Kill:
    """One run whose worker was killed, and what followed."""

    round: int
    run_id: str
    worker: str
    killed_at: float
    """Wall clock (``time.time()``) just before the worker's process group got SIGKILL."""
    lease_left_s: float
    """How long the dead worker's lease still had to run at the kill."""
    moved_s: float = math.inf
    """Kill → the first read that showed the run past its step (inf: it never moved)."""
    claim_s: float = math.inf
    """Kill → the claim checkpoint's ``saved_at`` (the worker's clock, same machine)."""
    cause: str = "?"
    """The cause of the superstep that moved the run (``recheck``, ``recover``, ...)."""


class _Deployment:
    """The workers and beat of one benchmark, with the default timing settings."""

    def __init__(self, ctx: Context, redis_url: str) -> None:
        from agentflow.celery import FlowClient
        from config import Settings
        from workers.build import build

        self.tmp = ctx.tmp
        self.gates = ctx.tmp / "gates"
        self.gates.mkdir()
        self.values: dict[str, Any] = {
            "app": "bench._recovery_app:app",
            "redis_url": redis_url,
            "checkpoint_keys": "hex:" + ctx.key.hex(),
            "key_prefix": ctx.tag,
            "queue": f"{ctx.tag}-q",
            "store_allow_volatile": True,  # the machine's Redis keeps nothing on disk: said so
        }
        # The defaults of every timing setting, whatever the environment or a .env file says.
        for name in DEFAULTS:
            self.values[name] = Settings.model_fields[name].default
        self.settings = Settings(**self.values)
        self.celery_app, self.tasks = build(self.settings)
        self.client = FlowClient(self.tasks)
        self.store = self.tasks.worker.store
        self.env = {
            **os.environ,
            **{f"AGENTFLOW_{k.upper()}": str(v) for k, v in self.values.items()},
            "BENCH_RECOVERY_GATE": str(self.gates),
            "PYTHONPATH": str(ROOT),
        }
        self.host = socket.gethostname()
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        """Live workers by node name (``name@host``)."""
        self.beat: subprocess.Popen[bytes] | None = None
        self.dead: list[subprocess.Popen[bytes]] = []
        self.starts = 0

    def _spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        with open(self.tmp / f"{name}.log", "wb") as log:  # the child keeps its own copy
            return subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "workers", *args],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def start_workers(self, count: int) -> list[str]:
        names = []
        for _ in range(count):
            self.starts += 1
            name = f"rec{self.starts}-{secrets.token_hex(2)}"
            argv = ["worker", "-l", "INFO", "-E", "-n", f"{name}@%h", "--pool=prefork", "--concurrency=1"]
            argv += ["--without-mingle", "--without-gossip", "-Q", self.values["queue"]]
            node = f"{name}@{self.host}"
            self.workers[node] = self._spawn(name, *argv)
            names.append(node)
        return names

    def start_beat(self) -> None:
        self.beat = self._spawn("beat", "beat", "-l", "INFO", "-s", str(self.tmp / "beat-schedule"))

    def wait_ready(self, nodes: list[str], timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        waiting = set(nodes)
        while waiting:
            dead = [n for n in waiting if self.workers[n].poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"workers {sorted(dead or waiting)} did not come up:\n{self.log_tails(dead)}")
            for reply in self.celery_app.control.ping(destination=sorted(waiting), timeout=0.5) or []:
                waiting -= set(reply)

    def node_of(self, owner: str) -> str:
        """The worker whose pool process holds a lease as `owner` (``<name>:<pid>``).

        By the pid and its parent, not by the name: a worker process whose first task was
        its start-up ``recover_all`` holds leases as ``agentflow@<host>:<pid>``, not under
        its node name (the name is learnt from the first superstep, after the runner that
        names the leases was made).
        """
        pid = int(owner.rsplit(":", 1)[1])
        try:
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return f"? ({owner})"
        mains = {proc.pid: node for node, proc in self.workers.items()}
        return mains.get(parent, mains.get(pid, f"? ({owner})"))

    def kill(self, nodes: list[str]) -> dict[str, float]:
        """SIGKILL each worker's process group (main and pool process); the wall time of each kill."""
        killed = {}
        for node in nodes:
            proc = self.workers.pop(node)
            killed[node] = time.time()
            os.killpg(proc.pid, signal.SIGKILL)
            self.dead.append(proc)
        return killed

    def reap(self) -> None:
        for proc in self.dead:
            proc.wait(timeout=10)
        self.dead.clear()

    def log_tails(self, nodes: list[str] | None = None, chars: int = 2500) -> str:
        names = [n.split("@")[0] for n in nodes] if nodes else None
        paths = sorted(self.tmp.glob("*.log"))
        chosen = [p for p in paths if names is None or p.stem in names]
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}" for p in chosen)

    async def close(self, redis_url: str) -> None:
        from bench._services import redis_unlink_prefix

        for proc in [*self.workers.values(), *([self.beat] if self.beat else [])]:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.dead.append(proc)
        self.reap()
        await self.store.aclose()
        await redis_unlink_prefix(redis_url, self.values["key_prefix"])


async def _until(check: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(POLL_S)


async def _round(
    dep: _Deployment, number: int, workers: list[str], renew_s: float, move_timeout_s: float
) -> list[Kill]:
    """Start one run per worker, kill them all inside their tool calls, time each run's recovery."""
    store = dep.store
    k = len(workers)
    run_ids = [f"{dep.values['key_prefix']}-r{number}-{i}" for i in range(k)]
    began = time.monotonic()
    for i, run_id in enumerate(run_ids):  # staggered over one renewal period
        await asyncio.sleep(max(0.0, began + i * renew_s / k - time.monotonic()))
        await dep.client.start(FLOW, {"token": run_id}, run_id=run_id)

    async def all_inside() -> bool:
        return all((dep.gates / r).exists() for r in run_ids)

    await _until(all_inside, 60, f"round {number}: not every run got into its tool call")
    await asyncio.sleep(random.uniform(0.0, renew_s))
    leases = await store.leases(run_ids)
    holders = {r: dep.node_of(lease.owner) for r, lease in leases.items()}
    if sorted(holders.values()) != sorted(workers) or len(holders) != k:
        raise RuntimeError(f"round {number}: expected one run per worker, found holders {holders}")
    before = {r: (await store.latest(r)).step for r in run_ids}

    killed = dep.kill(workers)
    fresh = dep.start_workers(k)  # as a supervisor would, at once
    dep.reap()

    async def second_wave() -> list[str]:
        """Kill half the fresh workers in their start-up or its recover_all; start each afresh at once."""
        await asyncio.sleep(random.uniform(0.0, SECOND_WAVE_S))
        victims = random.sample(fresh, k // 2)
        dep.kill(victims)
        again = dep.start_workers(len(victims))
        dep.reap()
        return [n for n in fresh if n not in victims] + again

    wave = asyncio.ensure_future(second_wave())
    lapses = await store.leases(run_ids)  # read after the kill: no renewal can move them now
    kills = {}
    for run_id in run_ids:
        at = killed[holders[run_id]]
        left = lapses[run_id].expires_at - at if run_id in lapses else 0.0
        kills[run_id] = Kill(number, run_id, holders[run_id], at, left)

    waiting = await _watch(dep, kills, before, move_timeout_s)
    fresh = await wave
    if waiting:
        print(f"round {number}: runs {sorted(waiting)} did not move within {move_timeout_s:.0f} s", flush=True)
        print(dep.log_tails(), flush=True)
        raise RuntimeError(f"round {number}: {len(waiting)} runs did not move within {move_timeout_s:.0f} s")

    async def all_done() -> bool:
        rows = await asyncio.gather(*(store.latest(r) for r in run_ids))
        return all(row.status == "done" for row in rows)

    await _until(all_done, 60, f"round {number}: the recovered runs did not finish")
    for run_id in run_ids:
        history = await store.history(run_id)
        claim = next((row for row in history if row.step > before[run_id] and row.segment == row.step), None)
        if claim is not None:
            kills[run_id].claim_s = claim.saved_at - kills[run_id].killed_at
        kills[run_id].cause = await _cause(dep, run_id, before[run_id])
    await asyncio.to_thread(dep.wait_ready, fresh)
    return list(kills.values())


async def _watch(dep: _Deployment, kills: dict[str, Kill], before: dict[str, int], timeout_s: float) -> set[str]:
    """Read the runs until each moved past its step `before` (noting when, in `kills`); those that did not."""
    waiting = set(kills)
    deadline = time.monotonic() + timeout_s
    while waiting and time.monotonic() < deadline:
        ids = sorted(waiting)
        rows = await asyncio.gather(*(dep.store.latest(r) for r in ids))
        seen = time.time()
        for run_id, row in zip(ids, rows, strict=True):
            if row.step > before[run_id]:
                kills[run_id].moved_s = seen - kills[run_id].killed_at
                waiting.discard(run_id)
        await asyncio.sleep(POLL_S)
    return waiting


async def _cause(dep: _Deployment, run_id: str, step: int) -> str:
    """The cause of the superstep task that ran the run on from `step` (from Celery's result backend)."""
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(dep.settings.redis_url.get_secret_value())
    try:
        pattern = f"{dep.values['key_prefix']}:celery:celery-task-meta-af-{run_id}-{step}-*"
        async for key in client.scan_iter(match=pattern, count=1000):
            meta: dict[str, Any] = json.loads(await client.get(key) or b"{}")
            result = meta.get("result") or {}
            if isinstance(result, dict) and result.get("done") == "ran":
                task_id = key.decode().removeprefix(f"{dep.values['key_prefix']}:celery:celery-task-meta-")
                return str(task_id.removeprefix(f"af-{run_id}-{step}-").split("-")[0])
    finally:
        await client.aclose()
    return "?"


def _rank(values: list[float], q: float) -> float:
    """The nearest-rank percentile `q` (0..1) of `values`: a value that was measured, never interpolated."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _fmt(seconds: float) -> str:
    return f"{seconds:.2f} s" if math.isfinite(seconds) else "never"


async def run(ctx: Context) -> Report:
    report = Report("recovery", TITLE)
    redis_url = ctx.services.redis_url
    if redis_url is None:
        report.notes.append(f"skipped: {ctx.services.redis_why}")
        return report
    rounds, k = ctx.sized(5, 1), ctx.sized(10, 4)
    dep = _Deployment(ctx, redis_url)
    lease_s, margin_s = dep.settings.lease_s, dep.settings.recheck_margin_s
    interval_s, stale_s = dep.settings.recover_interval_s, dep.settings.stale_after_s
    renew_s = lease_s / 3
    move_timeout_s = lease_s + interval_s + stale_s + 60
    kills: list[Kill] = []
    started = time.monotonic()
    try:
        dep.start_beat()
        workers = dep.start_workers(k)
        await asyncio.to_thread(dep.wait_ready, workers)
        for number in range(rounds):
            found = await _round(dep, number, workers, renew_s, move_timeout_s)
            kills += found
            moved, left = [x.moved_s for x in found], [x.lease_left_s for x in found]
            print(
                f"round {number + 1}/{rounds}: {k} kills, kill → moving again {min(moved):.2f}..{max(moved):.2f} s "
                f"(lease left at the kill {min(left):.2f}..{max(left):.2f} s)",
                flush=True,
            )
            workers = list(dep.workers)
    finally:
        await dep.close(redis_url)
    wall_s = time.monotonic() - started

    moved = [x.moved_s for x in kills]
    floor = [x.lease_left_s for x in kills]
    after = [x.moved_s - x.lease_left_s for x in kills]
    claims = [x.claim_s for x in kills]
    n = len(kills)
    times = Table(
        f"{n} runs whose worker was SIGKILLed ({rounds} round{'s' if rounds > 1 else ''} of {k} workers killed at "
        f"once, each inside a run's tool call; then {k // 2} of the {k} fresh workers killed again within "
        f"{SECOND_WAVE_S:g} s of their start, in start-up or its recover_all)",
        ["interval", "min", "p50", "p95", "max"],
        note="p50 and p95 are nearest-rank (values that were measured). 'Moving again': the first read (every "
        "20 ms) of the run's latest checkpoint that shows it past its step; the claim's saved_at is the "
        "worker's own clock, a few ms before that.",
    )
    for label, values in (
        ("kill → moving again (read)", moved),
        ("kill → claim checkpoint saved_at", claims),
        ("kill → the dead worker's lease lapses", floor),
        ("lease lapsed → moving again", after),
    ):
        times.add(label, _fmt(min(values)), _fmt(_rank(values, 0.5)), _fmt(_rank(values, 0.95)), _fmt(max(values)))
    causes = Counter(x.cause for x in kills)
    by_cause = Table(
        "What moved each run (the cause of the superstep that claimed it)",
        ["cause", "runs", "kill → moving again, min..max"],
    )
    for cause, count in causes.most_common():
        these = [x.moved_s for x in kills if x.cause == cause]
        by_cause.add(cause, count, f"{min(these):.2f}..{max(these):.2f} s")
    settings = Table(
        "Settings (the defaults)",
        ["setting", "value"],
    )
    settings.add("AGENTFLOW_LEASE_S (renewed every lease / 3)", f"{lease_s:g} s")
    settings.add("AGENTFLOW_RECHECK_MARGIN_S", f"{margin_s:g} s")
    settings.add("AGENTFLOW_RECOVER_INTERVAL_S (beat's recover_all)", f"{interval_s:g} s")
    settings.add("AGENTFLOW_STALE_AFTER_S", f"{stale_s:g} s")
    settings.add("workers", "celery -A workers worker --pool=prefork --concurrency=1 --without-mingle --without-gossip")
    report.tables += [times, by_cause, settings]
    p95 = _rank(moved, 0.95)
    report.targets.append(
        Target(
            "Issue 14: SIGKILL → moving again, p95",
            p95,
            lease_s + SLACK_S,
            f"{_fmt(p95)} (p50 {_fmt(_rank(moved, 0.5))}, max {_fmt(max(moved))}, {n} kills)",
            f"<= lease_s + {SLACK_S:g} s = {lease_s + SLACK_S:g} s",
        )
    )
    report.targets.append(
        Target(
            "Issue 31: SIGKILL → moving again, max",
            max(moved),
            lease_s + interval_s,
            f"{_fmt(max(moved))} ({n} kills, {k // 2} of each round's fresh workers killed again in start-up)",
            f"<= lease_s + recover_interval_s = {lease_s + interval_s:g} s",
        )
    )
    report.notes.append(
        f"Without a worker starting after the kill (beat only), a run whose worker died moves again at beat's "
        f"first tick after the dead worker's lease lapsed: the lease has {lease_s - renew_s:g} to {lease_s:g} s "
        f"left at the kill (it is renewed every {renew_s:g} s), and a tick comes up to {interval_s:g} s later, so "
        f"up to {lease_s + interval_s:g} s after the kill (about {lease_s - renew_s / 2 + interval_s / 2:g} s on "
        f"average), plus the recovered superstep's own time; from the settings, not measured."
    )
    report.data = {
        "rounds": rounds,
        "workers_per_round": k,
        "second_wave": rounds * (k // 2),
        "lease_s": lease_s,
        "recheck_margin_s": margin_s,
        "recover_interval_s": interval_s,
        "stale_after_s": stale_s,
        "measure_wall_s": wall_s,
        "kills": [x.__dict__ for x in kills],
        "moved_s": {"min": min(moved), "p50": _rank(moved, 0.5), "p95": p95, "max": max(moved), "count": n},
        "causes": dict(causes),
    }
    return report


def main() -> int:
    import argparse
    import shutil
    import tempfile

    from bench._env import machine, probe_services, versions
    from bench._report import write_json

    parser = argparse.ArgumentParser(prog="python -m bench.recovery", description=TITLE)
    parser.add_argument("--quick", action="store_true", help="a smoke run (1 round of 4 kills)")
    parser.add_argument("--keep-logs", action="store_true", help="keep the workers' and beat's logs (path printed)")
    args = parser.parse_args()
    services = asyncio.run(probe_services())
    tmp = Path(tempfile.mkdtemp(prefix="agentflow-bench-recovery-"))
    started = time.perf_counter()
    try:
        report = asyncio.run(run(Context(quick=args.quick, tmp=tmp, services=services)))
    finally:
        if args.keep_logs:
            print(f"logs: {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    report.data["wall_s"] = time.perf_counter() - started
    print(report.text())
    print(f"(recovery took {report.data['wall_s']:.1f} s)")
    env = {"machine": machine(Path(tempfile.gettempdir())), "versions": versions(services), "quick": args.quick}
    out = ROOT / "bench" / "results" / ("quick" if args.quick else "") / "recovery.json"
    write_json(report, env, out)
    print(f"results: {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    # Run the importable module's main, so that the workers' and this process's classes are the same ones.
    from bench import recovery

    sys.exit(recovery.main())
