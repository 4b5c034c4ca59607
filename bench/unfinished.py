"""P4: `list_unfinished(flow)` with 1,000, 10,000 and 100,000 unfinished runs, on Redis and PostgreSQL.

Filling 100,000 runs through `save` would take minutes, so the runs are written in bulk:
each one a genuine step-0 checkpoint (the body a real `FlowRunner.start` produces, sealed
for that run id with `Sealer`), written with the same layout the store's own ``save``
writes (Redis: pipelines of the script's writes and the index updates; PostgreSQL: COPY
into the ``runs`` and ``checkpoints`` tables the store created). Before timing, the fill
is checked through the store itself: `list_unfinished` returns exactly the runs written,
and `latest` of sampled runs opens under the key. The sizes grow in place (1k, then 9k
more, then 90k more), and each is timed after one untimed call.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from agentflow.exec.checkpoints import MemoryCheckpointStore, SealedCheckpoint
from agentflow.exec.seal import Sealer
from bench import _flows, _services
from bench._report import Report, Table, Target
from bench._suite import Context
from bench._timing import Case, Series, fmt_span, repeat

TITLE = "P4: list_unfinished(flow) at 1,000 / 10,000 / 100,000 unfinished runs, Redis and PostgreSQL"
#: P4: at most this many seconds at the largest size.
LIMIT_S = 1.0
#: Runs written per Redis pipeline / per PostgreSQL COPY.
BATCH = 2000

Filler = Callable[[list[SealedCheckpoint]], Awaitable[None]]


async def _template() -> dict[str, Any]:
    """The body of a real step-0 checkpoint of the ticket flow."""
    store = MemoryCheckpointStore()
    started = await _flows.runner(store).start(_flows.flow, _flows.ORDER)
    body: dict[str, Any] = json.loads((await store.latest(started.run_id)).payload)
    return body


def _rows(sealer: Sealer, body: dict[str, Any], first: int, count: int, tag: str) -> list[SealedCheckpoint]:
    now = time.time()
    return [
        sealer.seal_checkpoint(f"{tag}-{i:07d}", 0, _flows.flow.name, "running", 0, now + i * 1e-6, body)
        for i in range(first, first + count)
    ]


def _redis_filler(store: Any, client: Any, prefix: str) -> Filler:
    """Write rows as ``save.lua`` and the store's index updates do (private layout, checked afterwards)."""
    from agentflow.exec.checkpoints.redis._rows import _encode

    async def fill(rows: list[SealedCheckpoint]) -> None:
        pipe = client.pipeline(transaction=False)
        for cp in rows:
            cp_key, latest_key = store._run_keys(cp.run_id)[:2]
            head = [cp.run_id, cp.step, cp.flow, cp.status, cp.segment, cp.saved_at, cp.kid, cp.sig]
            pipe.rpush(cp_key, _encode(head, cp.payload))
            pipe.hset(
                latest_key,
                mapping={"step": 0, "flow": cp.flow, "status": cp.status, "segment": 0, "saved_at": repr(cp.saved_at)},
            )
            pipe.expire(cp_key, 3600)
            pipe.expire(latest_key, 3600)
        scores = {cp.run_id: cp.saved_at for cp in rows}
        for index in ("runs", f"runs:{_flows.flow.name}"):
            pipe.zadd(f"{prefix}:{index}", scores)
        # On one server the unfinished index is scored by when each run's keys expire.
        pipe.zadd(f"{prefix}:unfinished:{_flows.flow.name}", {cp.run_id: time.time() + 3600 for cp in rows})
        await pipe.execute()

    return fill


def _pg_filler(url: str, table_prefix: str) -> Filler:
    import asyncpg

    async def fill(rows: list[SealedCheckpoint]) -> None:
        conn = await asyncpg.connect(url)
        try:
            await conn.copy_records_to_table(
                f"{table_prefix}checkpoints",
                records=[
                    (r.run_id, r.step, r.flow, r.status, r.segment, r.saved_at, r.payload, r.kid, r.sig) for r in rows
                ],
                columns=["run_id", "step", "flow", "status", "segment", "saved_at", "payload", "kid", "sig"],
            )
            await conn.copy_records_to_table(
                f"{table_prefix}runs",
                records=[(r.run_id, r.flow, r.status, r.step, r.segment, r.saved_at) for r in rows],
                columns=["run_id", "flow", "status", "step", "segment", "saved_at"],
            )
            # What autovacuum does after this many new rows in a live database: without fresh
            # statistics the planner guesses, and a run's timing depends on its guess.
            await conn.execute(f"ANALYZE {table_prefix}runs")
        finally:
            await conn.close()

    return fill


async def _check(store: Any, sealer: Sealer, ids: list[str], expected: int) -> None:
    listed = await store.list_unfinished(_flows.flow.name)
    if len(listed) != expected or set(listed) != set(ids):
        raise RuntimeError(f"{type(store).__name__}: list_unfinished found {len(listed)} runs, {expected} were written")
    for rid in random.sample(ids, min(20, len(ids))):
        sealer.open_checkpoint(await store.latest(rid), rid)  # raises if the fill is not what save writes


def _lister(store: Any) -> Case:
    """One `list_unfinished(flow)` call on `store`, as a case to time."""
    return lambda: store.list_unfinished(_flows.flow.name)


async def _measure(
    stores: dict[str, Any], fill: Filler, sizes: list[int], ctx: Context, sealer: Sealer, body: dict[str, Any]
) -> dict[str, dict[int, dict[str, Any]]]:
    """Fill up to each size and time `list_unfinished` on every store object over the same data."""
    out: dict[str, dict[int, dict[str, Any]]] = {name: {} for name in stores}
    ids: list[str] = []
    for size in sizes:
        started = time.perf_counter()
        while len(ids) < size:
            rows = _rows(sealer, body, len(ids), min(BATCH, size - len(ids)), ctx.tag)
            await fill(rows)
            ids += [r.run_id for r in rows]
        fill_s = time.perf_counter() - started
        for name, store in stores.items():
            await _check(store, sealer, ids, size)
            times = await repeat(_lister(store), warmup=1, times=5 if size < 100_000 else 3)
            out[name][size] = {"seconds": times, "fill_s": fill_s}
    return out


async def run(ctx: Context) -> Report:
    report = Report("unfinished", TITLE)
    sizes = [1_000, 10_000] if ctx.quick else [1_000, 10_000, 100_000]
    sealer, body = Sealer(ctx.key), await _template()
    results: dict[str, dict[int, dict[str, Any]]] = {}
    svc = ctx.services
    if svc.redis_url:
        import redis.asyncio as aioredis

        from agentflow.exec.checkpoints import RedisCheckpointStore

        async with AsyncExitStack() as stack:
            store = await stack.enter_async_context(_services.redis_store(svc.redis_url, ctx.tag))
            stores = {f"Redis ({_services.redis_parser()} parser)": store}
            if _services.redis_parser() == "hiredis":
                pure = RedisCheckpointStore(_services.redis_factory(svc.redis_url, pure_python=True), prefix=ctx.tag)
                stack.push_async_callback(pure.aclose)
                stores["Redis (pure-Python parser)"] = pure
            client = aioredis.Redis.from_url(svc.redis_url)
            stack.push_async_callback(client.aclose)
            fill = _redis_filler(store, client, ctx.tag)
            results |= await _measure(stores, fill, sizes, ctx, sealer, body)
    else:
        report.notes.append(f"Redis skipped: {svc.redis_why}")
    if svc.pg_url:
        async with _services.sqlalchemy_pg_store(svc.pg_url, f"{ctx.tag}_") as store:
            await store.setup()
            pg = {"PostgreSQL (SQLAlchemy + asyncpg)": store}
            results |= await _measure(pg, _pg_filler(svc.pg_url, f"{ctx.tag}_"), sizes, ctx, sealer, body)
    else:
        report.notes.append(f"PostgreSQL skipped: {svc.pg_why}")
    _tables(report, results, sizes)
    report.data = {"sizes": sizes, "results": results}
    return report


def _tables(report: Report, results: dict[str, dict[int, dict[str, Any]]], sizes: list[int]) -> None:
    table = Table(
        "list_unfinished(flow) time (median of 5 calls, 3 at 100k, after one untimed call; min..max)",
        ["store", "unfinished runs", "time", "per run", "growth vs previous size", "fill time"],
    )
    for store, by_size in results.items():
        prev: tuple[int, float] | None = None
        for size in sizes:
            s: Series = by_size[size]["seconds"]
            growth = f"{s.median / prev[1]:.1f}x for {size / prev[0]:.0f}x runs" if prev else ""
            table.add(
                store,
                f"{size:,}",
                fmt_span(s),
                f"{s.median / size * 1e6:.2f} µs",
                growth,
                f"{by_size[size]['fill_s']:.1f} s",
            )
            prev = (size, s.median)
        largest = by_size[sizes[-1]]["seconds"]
        report.targets.append(
            Target(f"P4 {store} at {sizes[-1]:,}", largest.median, LIMIT_S, fmt_span(largest), f"<= {LIMIT_S:.0f} s")
        )
        first = by_size[sizes[0]]["seconds"].median
        growth = largest.median / first
        report.targets.append(
            Target(
                f"P4 {store} growth {sizes[0]:,} -> {sizes[-1]:,}",
                growth,
                sizes[-1] / sizes[0],
                f"{growth:.0f}x",
                f"<= {sizes[-1] // sizes[0]}x (linear)",
            )
        )
    report.tables.append(table)


def _series(value: Any) -> Series:
    return value if isinstance(value, Series) else Series.of(value["blocks"])


def plot(report: Report, out_dir: Path) -> list[Path]:
    """list_unfinished time vs runs, log-log, with the linear trend through the first point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes: list[int] = report.data["sizes"]
    fig, ax = plt.subplots(figsize=(7, 4.6))
    for k, ((store, by_size), marker) in enumerate(zip(report.data["results"].items(), "os^v", strict=False)):
        series = [_series((by_size.get(n) or by_size[str(n)])["seconds"]) for n in sizes]
        med = [s.median for s in series]
        low = [m - s.lo for m, s in zip(med, series, strict=True)]
        high = [s.hi - m for m, s in zip(med, series, strict=True)]
        bars = ax.errorbar(sizes, med, yerr=[low, high], marker=marker, capsize=3, label=store)
        color = bars[0].get_color()
        ax.plot(sizes, [med[0] * n / sizes[0] for n in sizes], ls=":", color=color, alpha=0.7)
        for n, m in zip(sizes, med, strict=True):
            shown = f"{m * 1e3:.0f} ms" if m < 1 else f"{m:.2f} s"
            offset = (7, 5) if k % 2 else (7, -12)  # alternate above and below so neighbours do not overlap
            ax.annotate(shown, (n, m), textcoords="offset points", xytext=offset, fontsize=7, color=color)
    ax.axhline(LIMIT_S, color="red", lw=1, ls="--", label=f"P4 target: {LIMIT_S:.0f} s at 100,000 runs")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("unfinished runs in the store")
    ax.set_ylabel("list_unfinished(flow), seconds")
    ax.set_title("list_unfinished(flow) vs unfinished runs (dotted: linear growth from the first size)", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "bench-list-unfinished.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return [path]
