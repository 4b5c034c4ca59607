"""Diagnostic: where a Celery worker's memory goes over its first few thousand supersteps (issues 17 and 19).

One worker (``-P prefork -c N``, or ``-P solo``) on the Redis store runs the flows of
`bench._memory_probe` (or, with ``--kit``, the test kit's app and settings:
``tests/celery/celery_flows.py``), and the probe there writes the memory of each worker
process every ``--every`` tasks. The driver brings runs through it in batches, waiting for
each batch to finish (``--mode finish``: ``chain10``, 10 supersteps a run) or to pause on
its hour-long timer (``--mode wait``: ``nap``, or the kit's ``cooled``), and reads each
worker process's RSS from /proc after each batch.

Run: ``python -m bench.worker_memory --mode wait --supersteps 3000 [--kit] [--pool solo]
[--concurrency 2] [--beat] [--trace] [--garbage] [--arena-max 2] [--soft-limit 30]``. It
prints one line per batch and writes everything, the probe's lines included, to
``<out>/result.json``. It is not part of ``python -m bench``: docs/benchmarks.md (P8) says
what it found.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: Where the test kit's app lives (``--kit``).
KIT_PATHS = [str(ROOT / "tests" / "celery"), str(ROOT / "tests")]


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _settings(args: argparse.Namespace, tag: str) -> dict[str, Any]:
    values: dict[str, Any] = {
        "app": "celery_flows:app" if args.kit else "bench._memory_probe:app",
        "redis_url": args.redis,
        "checkpoint_keys": "hex:" + secrets.token_hex(32),
        "key_prefix": tag,
        "queue": f"q-{tag}",
        "store_allow_volatile": True,  # the machine's Redis keeps nothing on disk: said so
        "recover_interval_s": 2.0,
        "stale_after_s": 5.0,
    }
    if args.kit:  # tests/celery/celery_kit.py's
        values.update(lease_s=2.0, stale_after_s=1.0, time_limit_s=60, soft_time_limit_s=50, visibility_timeout_s=120)
    if args.soft_limit:
        values.update(soft_time_limit_s=args.soft_limit, time_limit_s=args.soft_limit + 10)
    return values


def _environment(args: argparse.Namespace, values: dict[str, Any], out: Path) -> dict[str, str]:
    flags = {
        "AGENTFLOW_PROBE_TRACE": args.trace,
        "AGENTFLOW_PROBE_SOLO": args.pool == "solo",
        "AGENTFLOW_PROBE_GARBAGE": args.garbage,
        "AGENTFLOW_PROBE_CHEAP_EINFO": args.cheap_einfo,
    }
    env = {
        **os.environ,
        **{f"AGENTFLOW_{k.upper()}": str(v) for k, v in values.items()},
        **{k: "1" for k, on in flags.items() if on},
        "PYTHONPATH": os.pathsep.join([*KIT_PATHS, str(ROOT)]),
        "AGENTFLOW_TEST_LEDGER": str(out / "ledger.jsonl"),
        "AGENTFLOW_PROBE_DIR": str(out),
        "AGENTFLOW_PROBE_EVERY": str(args.every),
    }
    if args.arena_max:
        env["MALLOC_ARENA_MAX"] = str(args.arena_max)
    return env


def _spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "workers", *argv],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def _sample(main_pid: int, **fields: Any) -> dict[str, Any]:
    kids = _children(main_pid)
    return {**fields, "main_kib": _rss_kib(main_pid), "child_kib": [_rss_kib(k) for k in kids]}


async def _drive(args: argparse.Namespace, client: Any, redis: Any, tag: str, main_pid: int) -> list[dict[str, Any]]:
    """Bring the runs through the worker batch by batch; sample the worker's RSS after each batch."""
    flow = "chain10" if args.mode == "finish" else "cooled" if args.kit else "nap"
    inputs: dict[str, Any] = {"show": "x", "seconds": 3600.0} if args.kit else {"n": 0}
    runs = args.supersteps // (10 if args.mode == "finish" else 1)
    samples: list[dict[str, Any]] = []
    started, began = 0, time.monotonic()
    while started < runs:
        ids = [await client.start(flow, inputs) for _ in range(min(args.batch, runs - started))]
        started += len(ids)
        if args.mode == "finish":
            while await redis.zcard(f"{tag}:unfinished:chain10"):
                await asyncio.sleep(0.05)
        else:
            for run_id in ids:
                while (await client.status(run_id)).status != "paused":
                    await asyncio.sleep(0.05)
        samples.append(_sample(main_pid, runs=started, s=round(time.monotonic() - began, 1)))
        print(json.dumps(samples[-1]), flush=True)
    if args.settle:  # let the beat sweep the waiting runs a few times
        await asyncio.sleep(args.settle)
        samples.append(_sample(main_pid, runs=started, settled=args.settle))
        print(json.dumps(samples[-1]), flush=True)
    return samples


async def main(args: argparse.Namespace) -> dict[str, Any]:
    """Run the worker, drive it, and gather the probe's lines with the driver's samples."""
    import redis.asyncio

    from agentflow.celery import FlowClient
    from config import Settings
    from workers.build import build

    tag = f"wm{secrets.token_hex(4)}"
    out = Path(args.out or tempfile.mkdtemp(prefix="worker-memory-"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "ledger.jsonl").touch()
    if args.kit:  # the kit's app, imported here too, records its effects in a ledger
        sys.path[:0] = KIT_PATHS
        os.environ["AGENTFLOW_TEST_LEDGER"] = str(out / "ledger.jsonl")
    values = _settings(args, tag)
    env = _environment(args, values, out)
    pool = ["-P", "solo"] if args.pool == "solo" else ["-P", "prefork", "-c", str(args.concurrency)]
    name = f"{tag}@{socket.gethostname()}"
    argv = ["worker", *pool, "-n", name, "-Q", values["queue"], "--without-mingle", "--without-gossip"]
    procs = [_spawn([*argv, "-l", args.loglevel, "--include", "bench._memory_probe"], env, out / "worker.log")]
    if args.beat:
        beat = ["beat", "-s", str(out / "beat-schedule"), "-l", "WARNING"]
        procs.append(_spawn(beat, {**env, "AGENTFLOW_PROBE_DIR": ""}, out / "beat.log"))
    celery_app, tasks = build(Settings(**values))
    r = redis.asyncio.Redis.from_url(args.redis)
    try:
        deadline = time.monotonic() + 60
        while not celery_app.control.ping(destination=[name], timeout=0.5):
            if time.monotonic() > deadline or procs[0].poll() is not None:
                raise RuntimeError((out / "worker.log").read_text()[-3000:])
        samples = await _drive(args, FlowClient(tasks), r, tag, procs[0].pid)
    finally:
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
        keys = [k async for k in r.scan_iter(match=f"{tag}*", count=1000)]
        for i in range(0, len(keys), 500):
            await r.delete(*keys[i : i + 500])
        await r.aclose()
        await tasks.worker.store.aclose()
        celery_app.close()
    probes = {
        p.stem: [json.loads(x) for x in p.read_text().splitlines()] for p in out.glob("*.jsonl") if p.stem.isdigit()
    }
    result = {"args": vars(args), "samples": samples, "probes": probes}
    (out / "result.json").write_text(json.dumps(result, indent=1))
    print(f"written to {out / 'result.json'}")
    return result


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--mode", choices=["finish", "wait"], default="finish", help="runs that finish, or that wait")
    p.add_argument("--pool", choices=["prefork", "solo"], default="prefork")
    p.add_argument("--concurrency", type=int, default=1, help="pool processes under -P prefork")
    p.add_argument("--supersteps", type=int, default=5000)
    p.add_argument("--batch", type=int, default=20, help="runs started before waiting for them")
    p.add_argument("--every", type=int, default=100, help="tasks between two lines of the probe")
    p.add_argument("--beat", action="store_true", help="run the beat (recover_all every 2 s) meanwhile")
    p.add_argument("--trace", action="store_true", help="the probe names what grew (tracemalloc, 8 frames)")
    p.add_argument("--garbage", action="store_true", help="the probe names what a full collection would free")
    p.add_argument("--cheap-einfo", action="store_true", help="billiard copies no code positions (a diagnosis)")
    p.add_argument("--arena-max", type=int, default=0, help="MALLOC_ARENA_MAX for the worker (0: unset)")
    p.add_argument("--soft-limit", type=int, default=0, help="the tasks' soft time limit, s (hard: 10 s more)")
    p.add_argument("--kit", action="store_true", help="the test kit's app (celery_flows) and settings")
    p.add_argument("--loglevel", default="WARNING")
    p.add_argument("--settle", type=float, default=0.0, help="seconds to go on sampling after the last batch")
    p.add_argument("--redis", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
    p.add_argument("--out", default="", help="a folder for the logs and result.json (default: a new temporary one)")
    return p.parse_args()


if __name__ == "__main__":
    asyncio.run(main(_parse()))
