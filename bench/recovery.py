"""Issues 14 and 51: how soon a run whose worker process was SIGKILLed moves again, by what was killed.

The deployment is the runnable one (``celery -A workers worker`` and ``celery -A workers
beat``, configured from ``AGENTFLOW_*`` variables, `bench._recovery_deploy`), with every
timing setting at its default: lease 30 s (renewed every 10 s), recheck margin 1 s, beat's
``recover_all`` every 60 s, runs left alone by ``recover_all`` until their last save is 10 s
old, its lock 10 s. K workers of one pool process each, one queue. Beat runs throughout, as in
production: it is the safety net, not the measured path.

The runs are of a one-node flow whose idempotent tool sleeps 300 s on its first call and
returns at once on a rerun (`bench._recovery_app`). A round of each kind of kill:

- ``main``: every worker's pool process is frozen (SIGSTOP) once its start-up sweep is done,
  K runs start, and as soon as the broker's hash of unacknowledged messages shows a run's
  first message taken by a worker's main process, the main processes are SIGKILLed (their
  pools die with them) and K fresh workers start at once. Nobody holds the runs (no pool
  process started them); the broker keeps their messages from everyone for its visibility
  timeout (an hour). Their tool returns at once (the rerun path): what is timed is the claim.
- ``pool``: K runs start, staggered over one renewal period (lease / 3) so the kills land at
  every phase of the renewal, until each worker is inside one run's tool call, holding its
  lease (checked: K distinct holders); after a random wait of up to one renewal period,
  each worker's pool process is SIGKILLed. The main processes live: each sends its task again.
- ``both``: as ``pool``, but each worker's process group (main and pool process) is
  SIGKILLed at a moment of its own within one renewal period, and restarted at once, as a
  supervisor (systemd, Kubernetes) restarts a dead worker; the others keep running.
- ``connect``: as ``mass``, and each fresh worker is SIGKILLed again at a random moment within
  a second of connecting to the broker (inside its start-up, or the sweep it sends), and
  started afresh at once.
- ``mass``: as ``pool``, but every worker's process group is SIGKILLed at once, and K fresh
  workers start at once (a node lost, a deploy gone wrong).

The runs' latest checkpoints are read every 20 ms until each run's step moves past where it
was: a worker claimed it (a claim checkpoint, in a new segment). The time from its worker's
kill (the first, for ``connect``) to that read is the figure. Also recorded: when the dead
worker's lease was due to lapse (read after the kill, so no renewal can move it), the claim's
own ``saved_at``, and which message moved the run (``recheck``: sent for when a lease ends;
``recover``: sent by a sweep, or for when a run at rest counts as stranded). The fresh workers
are the next round's. Rounds of K per kind (2 rounds of 6: 60 kills, plus ``connect``'s
second kills; ``--quick``: 1 of 2).

Run alone: ``python -m bench.recovery [--quick] [--keep-logs] [--kind KIND ...]`` (Redis at ``BENCH_REDIS_URL``).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._recovery_app import FLOW
from bench._recovery_deploy import POLL_S, ROOT, Deployment, until
from bench._recovery_plot import plot as plot  # the suite draws it after a run (`bench.__main__`)
from bench._report import Report, Table, Target
from bench._suite import Context

TITLE = "Issues 14 and 51: SIGKILL → the run moving again, by the process killed, default settings (lease 30 s)"
#: Issue 14: p95 of SIGKILL → moving again (every kind together) at most lease_s + this.
SLACK_S = 5.0
#: Issue 51: p95 of each kind at most lease_s + this.
KIND_SLACK_S = 10.0
#: The kinds of kill, in the order measured, and what each kills.
KINDS: dict[str, str] = {
    "main": "main process, holding a run's message no pool process started",
    "pool": "pool process, inside a tool call (the main process lives)",
    "both": "one worker's main and pool process, inside a tool call",
    "connect": "every worker, then each replacement within 1 s of connecting",
    "mass": "every worker at once, inside tool calls",
}
#: A fresh worker of the ``connect`` kind is killed within this many seconds of connecting.
CONNECT_S = 1.0


@dataclass
class Kill:
    """One run whose worker was killed, and what followed."""

    kind: str
    round: int
    run_id: str
    worker: str
    killed_at: float
    """Wall clock (``time.time()``) just before the (first) SIGKILL that struck the run's worker."""
    lease_left_s: float
    """How long the dead worker's lease still had to run at the kill (0: nobody held the run)."""
    moved_s: float = math.inf
    """Kill → the first read that showed the run past its step (inf: it never moved)."""
    claim_s: float = math.inf
    """Kill → the claim checkpoint's ``saved_at`` (the worker's clock, same machine)."""
    cause: str = "?"
    """The cause of the superstep that moved the run (``recheck``, ``recover``, ...)."""


@dataclass
class Round:
    """One round of a kind: its runs, who held them, and the workers left for the next round."""

    kind: str
    number: int
    run_ids: list[str]
    before: dict[str, int]
    """Each run's step when its worker was killed."""
    kills: dict[str, Kill] = field(default_factory=dict)
    workers: list[str] = field(default_factory=list)
    """The live workers once the kills are over (the next round's)."""
    second: list[float] = field(default_factory=list)
    """When the second kills of ``connect`` struck (after connecting, seconds)."""


async def _inside(dep: Deployment, rnd: Round, workers: list[str], renew_s: float) -> dict[str, str]:
    """Start one run per worker, staggered over a renewal period, until each worker is inside one's tool call.

    Then wait a random time of up to one renewal period. Returns each run's holder.
    """
    began = time.monotonic()
    for i, run_id in enumerate(rnd.run_ids):
        await asyncio.sleep(max(0.0, began + i * renew_s / len(workers) - time.monotonic()))
        await dep.client.start(FLOW, {"token": run_id}, run_id=run_id)

    async def all_inside() -> bool:
        return all((dep.gates / r).exists() for r in rnd.run_ids)

    await until(all_inside, 60, f"{rnd.kind} {rnd.number}: not every run got into its tool call")
    await asyncio.sleep(random.uniform(0.0, renew_s))
    leases = await dep.store.leases(rnd.run_ids)
    holders = {r: dep.node_of(lease.owner) for r, lease in leases.items()}
    if sorted(holders.values()) != sorted(workers) or len(holders) != len(workers):
        raise RuntimeError(f"{rnd.kind} {rnd.number}: expected one run per worker, found holders {holders}")
    rnd.before = {r: (await dep.store.latest(r)).step for r in rnd.run_ids}
    return holders


async def _note_kills(dep: Deployment, rnd: Round, holders: dict[str, str], killed: dict[str, float]) -> None:
    """Note each run's kill, and the lease its dead holder had left (read now: no renewal can move it)."""
    lapses = await dep.store.leases(rnd.run_ids)
    for run_id in rnd.run_ids:
        at = killed[holders[run_id]]
        left = lapses[run_id].expires_at - at if run_id in lapses else 0.0
        rnd.kills[run_id] = Kill(rnd.kind, rnd.number, run_id, holders[run_id], at, max(0.0, left))


async def _main(dep: Deployment, rnd: Round, workers: list[str], renew_s: float) -> None:
    """Kill each main process as it holds a run's first message that its frozen pool never started."""
    await until(lambda: asyncio.to_thread(dep.idle, workers), 120, "the workers idle, their start-up sweeps done")
    for node in workers:
        for pid in dep.pool_of(node):
            os.kill(pid, signal.SIGSTOP)
    for run_id in rnd.run_ids:
        (dep.gates / run_id).touch()  # its tool returns at once: the run is timed to its claim, not held for 300 s
    await asyncio.gather(*(dep.client.start(FLOW, {"token": r}, run_id=r) for r in rnd.run_ids))
    rnd.before = dict.fromkeys(rnd.run_ids, 0)

    def taken() -> set[str]:
        held = dep.unacked()
        return {r for r in rnd.run_ids if any(t.startswith(f"af-{r}-0-start-") for t in held)}

    # A beat tick taken by a frozen worker instead leaves a run's message to the fresh workers: not this kind
    try:
        await until(lambda: taken() == set(rnd.run_ids), 10, "every first message taken")
    except TimeoutError:
        pass
    held = taken()
    killed = {node: dep.kill_main(node) for node in workers}
    rnd.workers = dep.start_workers(len(workers))
    dep.reap()
    at = min(killed.values())
    rnd.run_ids = [r for r in rnd.run_ids if r in held]
    rnd.kills = {r: Kill(rnd.kind, rnd.number, r, "?", at, 0.0) for r in rnd.run_ids}


async def _pool(dep: Deployment, rnd: Round, workers: list[str], renew_s: float) -> None:
    """Kill each worker's pool process inside its run's tool call; the main processes live."""
    holders = await _inside(dep, rnd, workers, renew_s)
    killed = {}
    for node in workers:
        (pid,) = dep.pool_of(node)
        killed[node] = time.time()
        os.kill(pid, signal.SIGKILL)
    rnd.workers = list(workers)
    await _note_kills(dep, rnd, holders, killed)


async def _both(dep: Deployment, rnd: Round, workers: list[str], renew_s: float) -> None:
    """Kill each worker's process group at a moment of its own within a renewal period; restart each at once."""
    holders = await _inside(dep, rnd, workers, renew_s)
    began, killed, fresh = time.monotonic(), {}, []
    for node, at in zip(workers, sorted(random.uniform(0.0, renew_s) for _ in workers), strict=True):
        await asyncio.sleep(max(0.0, began + at - time.monotonic()))
        killed.update(dep.kill([node]))
        fresh += dep.start_workers(1)
    dep.reap()
    rnd.workers = fresh
    await _note_kills(dep, rnd, holders, killed)


async def _mass(dep: Deployment, rnd: Round, workers: list[str], renew_s: float) -> None:
    """Kill every worker's process group at once; start as many at once."""
    holders = await _inside(dep, rnd, workers, renew_s)
    killed = dep.kill(workers)
    rnd.workers = dep.start_workers(len(workers))
    dep.reap()
    await _note_kills(dep, rnd, holders, killed)


async def _connect(dep: Deployment, rnd: Round, workers: list[str], renew_s: float) -> None:
    """As `_mass`, then kill each fresh worker within `CONNECT_S` of its connecting, and start it afresh."""
    await _mass(dep, rnd, workers, renew_s)

    async def again(node: str) -> str:
        await until(lambda: dep.connected(node), 120, f"{node} connecting")
        connected = time.monotonic()
        await asyncio.sleep(random.uniform(0.0, CONNECT_S))
        rnd.second.append(time.monotonic() - connected)
        dep.kill([node])
        (fresh,) = dep.start_workers(1)
        dep.reap()
        return fresh

    rnd.workers = list(await asyncio.gather(*(again(n) for n in rnd.workers)))


#: Each kind's round: starts the runs, kills, and leaves the live workers in `Round.workers`.
ROUNDS: dict[str, Callable[[Deployment, Round, list[str], float], Awaitable[None]]] = {
    "main": _main,
    "pool": _pool,
    "both": _both,
    "connect": _connect,
    "mass": _mass,
}


async def _round(dep: Deployment, kind: str, number: int, workers: list[str], timeouts: tuple[float, float]) -> Round:
    """One round of `kind`: kill, time each run moving again, wait for the runs to end and the workers to be up."""
    move_timeout_s, renew_s = timeouts
    run_ids = [f"{dep.values['key_prefix']}-{kind}{number}-{i}" for i in range(len(workers))]
    rnd = Round(kind, number, run_ids, {})
    await ROUNDS[kind](dep, rnd, workers, renew_s)
    waiting = await _watch(dep, rnd.kills, rnd.before, move_timeout_s)
    if waiting:
        print(f"{kind} {number}: runs {sorted(waiting)} did not move within {move_timeout_s:.0f} s", flush=True)
        print(dep.log_tails(), flush=True)
        raise RuntimeError(f"{kind} {number}: {len(waiting)} runs did not move within {move_timeout_s:.0f} s")
    store = dep.store
    all_ids = [f"{dep.values['key_prefix']}-{kind}{number}-{i}" for i in range(len(workers))]

    async def all_done() -> bool:
        rows = await asyncio.gather(*(store.latest(r) for r in all_ids))
        return all(row.status == "done" for row in rows)

    await until(all_done, 120, f"{kind} {number}: the recovered runs did not finish")
    for run_id, kill in rnd.kills.items():
        history = await store.history(run_id)
        claim = next((row for row in history if row.step > rnd.before[run_id] and row.segment == row.step), None)
        if claim is not None:
            kill.claim_s = claim.saved_at - kill.killed_at
        kill.cause = await _cause(dep, run_id, rnd.before[run_id])
    await asyncio.to_thread(dep.wait_ready, rnd.workers)
    return rnd


async def _watch(dep: Deployment, kills: dict[str, Kill], before: dict[str, int], timeout_s: float) -> set[str]:
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


async def _cause(dep: Deployment, run_id: str, step: int) -> str:
    """The cause of the superstep task that ran the run on from `step` (from Celery's result backend)."""
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(dep.settings.redis_url.get_secret_value())
    prefix = f"{dep.values['key_prefix']}:celery:celery-task-meta-"
    try:
        async for key in client.scan_iter(match=f"{prefix}af-{run_id}-{step}-*", count=1000):
            meta: dict[str, Any] = json.loads(await client.get(key) or b"{}")
            result = meta.get("result") or {}
            if isinstance(result, dict) and result.get("done") == "ran":
                task_id = key.decode().removeprefix(prefix)
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


def _span(values: list[float]) -> str:
    return f"{min(values):.1f}..{max(values):.1f} s" if values else ""


async def _measure(ctx: Context, dep: Deployment, kinds: list[str], size: tuple[int, int]) -> list[Round]:
    """Every round of every kind, on the deployment's workers (the fresh ones of a round are the next's)."""
    rounds, k = size
    settings = dep.settings
    move_timeout_s = settings.lease_s + settings.recover_interval_s + settings.stale_after_s + 60
    done: list[Round] = []
    dep.start_beat()
    workers = dep.start_workers(k)
    await asyncio.to_thread(dep.wait_ready, workers)
    for kind in kinds:
        for number in range(rounds):
            rnd = await _round(dep, kind, number, workers, (move_timeout_s, settings.lease_s / 3))
            done.append(rnd)
            moved = [x.moved_s for x in rnd.kills.values()]
            print(f"{kind} {number + 1}/{rounds}: {len(moved)} kills, kill → moving again {_span(moved)}", flush=True)
            workers = rnd.workers
    return done


async def run(ctx: Context) -> Report:
    report = Report("recovery", TITLE)
    redis_url = ctx.services.redis_url
    if redis_url is None:
        report.notes.append(f"skipped: {ctx.services.redis_why}")
        return report
    kinds = [kind for kind in KINDS if ctx.wants(kind)]
    rounds, k = ctx.sized(2, 1), ctx.sized(6, 2)
    dep = Deployment(ctx, redis_url)
    started = time.monotonic()
    try:
        done = await _measure(ctx, dep, kinds, (rounds, k))
    finally:
        await dep.close()
    _report(report, dep, done, {"rounds": rounds, "workers": k, "measure_wall_s": time.monotonic() - started})
    return report


def _report(report: Report, dep: Deployment, done: list[Round], size: dict[str, Any]) -> None:
    """Tables, targets and data of the rounds `done`."""
    lease_s, margin_s = dep.settings.lease_s, dep.settings.recheck_margin_s
    interval_s, stale_s = dep.settings.recover_interval_s, dep.settings.stale_after_s
    kills = [kill for rnd in done for kill in rnd.kills.values()]
    second = [s for rnd in done for s in rnd.second]
    by_kind = Table(
        f"{len(kills)} runs whose worker was SIGKILLed, by what was killed ({size['rounds']} round(s) of "
        f"{size['workers']} workers per kind{f'; {len(second)} second kills' if second else ''})",
        ["killed", "runs", "lease left at the kill", "min", "p50", "p95", "max", "moved by"],
        note="Kill → the run moving again: the first read (every 20 ms) of the run's latest checkpoint that shows "
        "it past its step; p50 and p95 nearest-rank (values that were measured). For connect, from the first kill.",
    )
    for kind in KINDS:
        mine = [x for x in kills if x.kind == kind]
        if not mine:
            continue
        moved = [x.moved_s for x in mine]
        causes = ", ".join(f"{c} {n}" for c, n in Counter(x.cause for x in mine).most_common())
        by_kind.add(
            f"{kind}: {KINDS[kind]}",
            len(mine),
            _span([x.lease_left_s for x in mine]),
            *(_fmt(v) for v in (min(moved), _rank(moved, 0.5), _rank(moved, 0.95), max(moved))),
            causes,
        )
        report.targets.append(
            Target(
                f"Issue 51: {kind}, p95",
                _rank(moved, 0.95),
                lease_s + KIND_SLACK_S,
                f"{_fmt(_rank(moved, 0.95))} ({len(mine)} kills)",
                f"<= lease_s + {KIND_SLACK_S:g} s = {lease_s + KIND_SLACK_S:g} s",
            )
        )
    moved = [x.moved_s for x in kills]
    after = [x.moved_s - x.lease_left_s for x in kills if x.lease_left_s > 0]
    overall = Table("Every kind together", ["interval", "min", "p50", "p95", "max"])
    for label, values in (
        ("kill → moving again (read)", moved),
        ("kill → claim checkpoint saved_at", [x.claim_s for x in kills]),
        ("a held run: its dead worker's lease lapsed → moving again", after),
    ):
        if values:
            overall.add(label, *(_fmt(v) for v in (min(values), _rank(values, 0.5), _rank(values, 0.95), max(values))))
    settings = Table("Settings (the defaults)", ["setting", "value"])
    settings.add("AGENTFLOW_LEASE_S (renewed every lease / 3)", f"{lease_s:g} s")
    settings.add("AGENTFLOW_RECHECK_MARGIN_S", f"{margin_s:g} s")
    settings.add("AGENTFLOW_RECOVER_INTERVAL_S (beat's recover_all)", f"{interval_s:g} s")
    settings.add("AGENTFLOW_STALE_AFTER_S", f"{stale_s:g} s")
    settings.add("workers", "celery -A workers worker --pool=prefork --concurrency=1 --without-mingle --without-gossip")
    report.tables += [by_kind, overall, settings]
    report.targets.append(
        Target(
            "Issue 14: SIGKILL → moving again, p95 (every kind)",
            _rank(moved, 0.95),
            lease_s + SLACK_S,
            f"{_fmt(_rank(moved, 0.95))} ({len(kills)} kills)",
            f"<= lease_s + {SLACK_S:g} s = {lease_s + SLACK_S:g} s",
        )
    )
    report.targets.append(
        Target(
            "Issue 31: SIGKILL → moving again, max",
            max(moved),
            lease_s + interval_s,
            f"{_fmt(max(moved))} ({len(kills)} kills)",
            f"<= lease_s + recover_interval_s = {lease_s + interval_s:g} s",
        )
    )
    report.data = {
        **size,
        "second_kills": len(second),
        "lease_s": lease_s,
        "recheck_margin_s": margin_s,
        "recover_interval_s": interval_s,
        "stale_after_s": stale_s,
        "kills": [x.__dict__ for x in kills],
        "moved_s": {"min": min(moved), "p50": _rank(moved, 0.5), "p95": _rank(moved, 0.95), "max": max(moved)},
        "by_kind": {
            kind: {"count": len(m), "p50": _rank(m, 0.5), "p95": _rank(m, 0.95), "max": max(m)}
            for kind in KINDS
            if (m := [x.moved_s for x in kills if x.kind == kind])
        },
        "causes": dict(Counter(x.cause for x in kills)),
    }


def main() -> int:
    import argparse
    import shutil
    import tempfile

    from bench._env import machine, probe_services, versions
    from bench._report import write_json

    parser = argparse.ArgumentParser(prog="python -m bench.recovery", description=TITLE)
    parser.add_argument("--quick", action="store_true", help="a smoke run (1 round of 2 kills per kind)")
    parser.add_argument("--kind", action="append", default=[], choices=list(KINDS), help="only this kind (repeatable)")
    parser.add_argument("--keep-logs", action="store_true", help="keep the workers' and beat's logs (path printed)")
    args = parser.parse_args()
    services = asyncio.run(probe_services())
    tmp = Path(tempfile.mkdtemp(prefix="agentflow-bench-recovery-"))
    started = time.perf_counter()
    try:
        ctx = Context(quick=args.quick, tmp=tmp, services=services, cases=tuple(args.kind))
        report = asyncio.run(run(ctx))
    finally:
        if args.keep_logs:
            print(f"logs: {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    report.data["wall_s"] = time.perf_counter() - started
    print(report.text())
    print(f"(recovery took {report.data['wall_s']:.1f} s)")
    env = {"machine": machine(Path(tempfile.gettempdir())), "versions": versions(services), "quick": args.quick}
    part = "quick" if args.quick else "partial" if args.kind else ""
    out = ROOT / "bench" / "results" / part / "recovery.json"
    write_json(report, env, out)
    print(f"results: {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    # Run the importable module's main, so that the workers' and this process's classes are the same ones.
    from bench import recovery

    sys.exit(recovery.main())
