"""Issue 19: pruning 100,000 finished runs (`prune_finished`), on the SQLite file, PostgreSQL and Redis.

Each run is a clone of one real finished run of the ticket flow (4 checkpoints, 6 call
records: 10 rows), sealed again for its own run id, so its rows are genuine. Writing
100,000 of them through `save` would take minutes, so they are written in bulk, in the
layout each store's own writes leave (SQLite: ``executemany`` into the store's tables;
PostgreSQL: ``COPY`` then ``ANALYZE``; Redis: pipelines of the keys and index entries the
save script writes). Before timing, the fill is checked through the store: the runs'
count, and sampled runs read back through `read_run` with every check passing.

Then, timed: `prunable` listing every prunable run (what ``agentflow runs prune`` counts
before it asks), and `prune_finished` deleting all of them in batches of 500 (the CLI's
and the beat's batch), each run judged by its signed newest checkpoint (``check``: what a
store shared with other processes requires, since its listing is unsigned). Afterwards the
store must hold no run at all.
"""

from __future__ import annotations

import random
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import closing
from typing import Any

from agentflow import Executor, FlowRunner
from agentflow.exec.checkpoints import MemoryCheckpointStore, RetentionPolicy, SealedCall, SealedCheckpoint
from agentflow.exec.checkpoints.records import ENDED
from agentflow.exec.checkpoints.retention import prunable, prune_finished
from agentflow.exec.run.read import ALL_RUNS, read_run
from agentflow.exec.seal import Sealer
from bench import _flows, _services
from bench._report import Report, Table
from bench._suite import Context

TITLE = "Issue 19: pruning 100,000 finished runs (10 rows each) on the SQLite file, PostgreSQL and Redis"
#: Runs written per bulk write.
CHUNK = 2000
#: Runs per prune batch (the CLI's and the beat's default).
BATCH = 500

Template = tuple[list[SealedCheckpoint], list[SealedCall]]
Clone = tuple[list[SealedCheckpoint], list[SealedCall]]
Filler = Callable[[list[Clone]], Awaitable[None]]


async def _template(key: bytes) -> Template:
    """The rows of one finished run of the ticket flow."""
    store = MemoryCheckpointStore()
    runner = FlowRunner(Executor(_flows.registry), checkpoints=store, checkpoint_key=key)
    result = await runner.run(_flows.flow, _flows.ORDER)
    return list(await store.history(result.run_id)), list(await store.calls(result.run_id))


def _clones(sealer: Sealer, rows: Template, tag: str, count: int, at: float) -> Iterator[list[Clone]]:
    """Chunks of clones of the template, each sealed again for its run id, the last save at `at`."""
    checkpoints, calls = rows
    shift = at - checkpoints[-1].saved_at
    for start in range(0, count, CHUNK):
        chunk = []
        for i in range(start, min(start + CHUNK, count)):
            run_id = f"{tag}-{i:07d}"
            cps = [
                sealer.seal_encoded_checkpoint(
                    run_id, c.step, c.flow, c.status, c.segment, c.saved_at + shift + i * 1e-6, c.payload
                )
                for c in checkpoints
            ]
            records = [sealer.seal_encoded_call(run_id, r.segment, r.seq, r.kind, r.payload) for r in calls]
            chunk.append((cps, records))
        yield chunk


def _lasts(chunk: list[Clone]) -> list[SealedCheckpoint]:
    """The newest checkpoint of each clone (what the listing row holds)."""
    return [cps[-1] for cps, _ in chunk]


def _sqlite_filler(path: str) -> Filler:
    async def fill(chunk: list[Clone]) -> None:
        with closing(sqlite3.connect(path)) as conn, conn:
            conn.executemany(
                "INSERT INTO checkpoints VALUES (?,?,?,?,?,?,?,?,?)",
                [(c.run_id, c.step, c.flow, c.status, c.segment, c.saved_at, c.payload, c.kid, c.sig)
                 for cps, _ in chunk for c in cps],
            )  # fmt: skip
            conn.executemany(
                "INSERT INTO calls VALUES (?,?,?,?,?,?,?)",
                [(r.run_id, r.segment, r.seq, r.kind, r.payload, r.kid, r.sig) for _, rs in chunk for r in rs],
            )
            conn.executemany(
                "INSERT INTO runs (run_id, flow, status, step, saved_at) VALUES (?,?,?,?,?)",
                [(c.run_id, c.flow, c.status, c.step, c.saved_at) for c in _lasts(chunk)],
            )

    return fill


def _pg_filler(url: str, table_prefix: str) -> Filler:
    import asyncpg

    async def fill(chunk: list[Clone]) -> None:
        conn = await asyncpg.connect(url)
        try:
            await conn.copy_records_to_table(
                f"{table_prefix}checkpoints",
                records=[(c.run_id, c.step, c.flow, c.status, c.segment, c.saved_at, c.payload, c.kid, c.sig)
                         for cps, _ in chunk for c in cps],
                columns=["run_id", "step", "flow", "status", "segment", "saved_at", "payload", "kid", "sig"],
            )  # fmt: skip
            await conn.copy_records_to_table(
                f"{table_prefix}calls",
                records=[(r.run_id, r.segment, r.seq, r.kind, r.payload, r.kid, r.sig) for _, rs in chunk for r in rs],
                columns=["run_id", "segment", "seq", "kind", "payload", "kid", "sig"],
            )
            await conn.copy_records_to_table(
                f"{table_prefix}runs",
                records=[(c.run_id, c.flow, c.status, c.step, c.segment, c.saved_at) for c in _lasts(chunk)],
                columns=["run_id", "flow", "status", "step", "segment", "saved_at"],
            )
        finally:
            await conn.close()

    return fill


def _redis_filler(store: Any, client: Any, prefix: str) -> Filler:
    """Write the keys ``save.lua`` writes for each run, and its index entries (private layout, checked afterwards)."""
    from agentflow.exec.checkpoints.redis._rows import _encode

    async def fill(chunk: list[Clone]) -> None:
        pipe = client.pipeline(transaction=False)
        scores: dict[str, float] = {}
        for cps, records in chunk:
            last = cps[-1]
            cp_key, latest_key, calls_key, next_key = store._run_keys(last.run_id)
            pipe.rpush(cp_key, *(_encode([c.run_id, c.step, c.flow, c.status, c.segment, c.saved_at, c.kid, c.sig],
                                         c.payload) for c in cps))  # fmt: skip
            pipe.hset(latest_key, mapping={"step": last.step, "flow": last.flow, "status": last.status,
                                           "segment": last.segment, "saved_at": repr(last.saved_at)})  # fmt: skip
            pipe.hset(calls_key, mapping={f"{r.segment}:{r.seq}": _encode(
                [r.run_id, r.segment, r.seq, r.kind, r.kid, r.sig], r.payload) for r in records})  # fmt: skip
            pipe.hset(next_key, mapping={"0": len(records)})
            for key in (cp_key, latest_key, calls_key, next_key):
                pipe.expire(key, 3600)
            scores[last.run_id] = last.saved_at
        pipe.zadd(f"{prefix}:runs", scores)
        pipe.zadd(f"{prefix}:runs:{_flows.flow.name}", scores)
        await pipe.execute()

    return fill


def _pg_analyze(url: str, table_prefix: str) -> Callable[[], Awaitable[None]]:
    """What autovacuum does after so many new rows in a live database (without it the planner guesses)."""
    import asyncpg

    async def analyze() -> None:
        conn = await asyncpg.connect(url)
        try:
            for table in ("runs", "checkpoints", "calls"):
                await conn.execute(f"ANALYZE {table_prefix}{table}")
        finally:
            await conn.close()

    return analyze


async def _measure(
    store: Any,
    fill: Filler,
    ctx: Context,
    sealer: Sealer,
    rows: Template,
    settle: Callable[[], Awaitable[None]] | None = None,
) -> dict[str, Any]:
    """Fill the finished runs, check them, then time listing and pruning them all."""
    count = ctx.sized(100_000, 5_000)
    now = time.time()
    started = time.perf_counter()
    for chunk in _clones(sealer, rows, ctx.tag, count, now - 2 * 86_400):
        await fill(chunk)
    if settle is not None:
        await settle()
    fill_s = time.perf_counter() - started
    await store.stored_runs()  # connect (and, for SQL, set up) before timing
    policy = RetentionPolicy.days(1, batch=BATCH)
    started = time.perf_counter()
    listed = await prunable(store, policy.cut_off(now), ENDED, ALL_RUNS)
    list_s = time.perf_counter() - started
    if len(listed) != count:
        raise RuntimeError(f"{type(store).__name__}: prunable found {len(listed)} runs, {count} were written")
    for run_id in random.sample(listed, 20):  # the fill is what the store writes: every check passes
        report = await read_run(store, sealer, run_id)
        if report.problems or report.status != "done":
            raise RuntimeError(f"{run_id}: {report.problems}")
    started = time.perf_counter()
    pruned = await prune_finished(store, policy, now=now, check=sealer.checkpoint_problem)
    prune_s = time.perf_counter() - started
    left = await store.stored_runs()
    if len(pruned.run_ids) != count or left:
        raise RuntimeError(f"pruned {len(pruned.run_ids)} of {count} runs, {len(left)} left")
    return {"runs": count, "rows": pruned.rows, "fill_s": fill_s, "list_s": list_s, "prune_s": prune_s}


async def _sqlite(ctx: Context, sealer: Sealer, rows: Template) -> dict[str, Any]:
    from agentflow.exec.checkpoints import SQLiteCheckpointStore

    path = ctx.tmp / "prune.db"
    store = SQLiteCheckpointStore(path)
    try:
        await store.stored_runs()  # creates the schema
        return await _measure(store, _sqlite_filler(str(path)), ctx, sealer, rows)
    finally:
        await store.aclose()


async def run(ctx: Context) -> Report:
    report = Report("prune", TITLE)
    sealer = Sealer(ctx.key)
    rows = await _template(ctx.key)
    results: dict[str, dict[str, Any]] = {"SQLite file (synchronous=FULL)": await _sqlite(ctx, sealer, rows)}
    svc = ctx.services
    if svc.pg_url:
        async with _services.sqlalchemy_pg_store(svc.pg_url, f"{ctx.tag}_") as store:
            await store.setup()
            fill = _pg_filler(svc.pg_url, f"{ctx.tag}_")
            settle = _pg_analyze(svc.pg_url, f"{ctx.tag}_")
            results["PostgreSQL (SQLAlchemy + asyncpg)"] = await _measure(store, fill, ctx, sealer, rows, settle)
    else:
        report.notes.append(f"PostgreSQL skipped: {svc.pg_why}")
    if svc.redis_url:
        import redis.asyncio as aioredis

        async with _services.redis_store(svc.redis_url, ctx.tag) as store:
            client = aioredis.Redis.from_url(svc.redis_url)
            try:
                results["Redis (one server)"] = await _measure(
                    store, _redis_filler(store, client, ctx.tag), ctx, sealer, rows
                )
            finally:
                await client.aclose()
    else:
        report.notes.append(f"Redis skipped: {svc.redis_why}")
    table = Table(
        f"Pruning every finished run (batches of {BATCH}; each run 4 checkpoints + 6 call records)",
        ["store", "runs", "rows", "list (count)", "prune", "runs/s", "rows/s", "fill"],
    )
    for name, r in results.items():
        table.add(
            name,
            f"{r['runs']:,}",
            f"{r['rows']:,}",
            f"{r['list_s']:.2f} s",
            f"{r['prune_s']:.1f} s",
            f"{r['runs'] / r['prune_s']:,.0f}",
            f"{r['rows'] / r['prune_s']:,.0f}",
            f"{r['fill_s']:.1f} s",
        )
    report.tables.append(table)
    report.data = {"batch": BATCH, "results": results}
    return report


if __name__ == "__main__":
    import subprocess
    import sys

    sys.exit(subprocess.call([sys.executable, "-m", "bench", "--only", "prune", "--no-plots", *sys.argv[1:]]))
