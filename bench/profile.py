"""``python -m bench.profile CASE [--runs N]``: profile one benchmark case with pyinstrument.

Cases: ``engine`` (no store), ``memory``, ``sqlite-normal``, ``sqlite-full``, ``redis``,
``sqlalchemy-pg``, ``sqlalchemy-sqlite`` (the 3-node flow, N runs after a warm-up) and
``unfinished-redis`` / ``unfinished-pg`` (`list_unfinished` over N runs). The profile is
wall-clock on the event loop's thread (``async_mode``: time awaiting a store's worker
thread or a server shows as ``[await]`` under the call that waits); it is printed and
written to ``bench/results/profile-<case>.txt`` (and ``.html``).
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from agentflow.exec.checkpoints import MemoryCheckpointStore, SQLiteCheckpointStore
from bench import _flows, _services
from bench._env import probe_services
from bench._suite import Context

RESULTS = Path(__file__).resolve().parent / "results"
FLOW_CASES = ("engine", "memory", "sqlite-normal", "sqlite-full", "redis", "sqlalchemy-pg", "sqlalchemy-sqlite")
CASES = (*FLOW_CASES, "unfinished-redis", "unfinished-pg")


@asynccontextmanager
async def _store(case: str, ctx: Context) -> AsyncIterator[Any]:
    from agentflow.exec.checkpoints import SQLAlchemyCheckpointStore

    svc = ctx.services
    if case == "engine":
        yield None
    elif case == "memory":
        yield MemoryCheckpointStore()
    elif case.startswith("sqlite-"):
        async with SQLiteCheckpointStore(ctx.tmp / "p.db", synchronous=case.split("-")[1].upper()) as store:  # type: ignore[arg-type]
            yield store
    elif case == "redis" and svc.redis_url:
        async with _services.redis_store(svc.redis_url, ctx.tag) as store:
            yield store
    elif case == "sqlalchemy-pg" and svc.pg_url:
        async with _services.sqlalchemy_pg_store(svc.pg_url, f"{ctx.tag}_") as store:
            yield store
    elif case == "sqlalchemy-sqlite":
        async with SQLAlchemyCheckpointStore(f"sqlite+aiosqlite:///{ctx.tmp / 's.db'}", table_prefix="p_") as store:
            yield store
    else:
        raise SystemExit(f"case {case!r} needs a server that does not answer")


async def _flow_job(
    case: str, ctx: Context, runs: int, profiled: Callable[[Callable[[], Awaitable[None]]], Any]
) -> Any:
    async with _store(case, ctx) as store:
        runner = _flows.runner(store, None if case in ("engine", "memory") else ctx.key)

        async def job() -> None:
            for _ in range(runs):
                await runner.run(_flows.flow, _flows.ORDER)

        for _ in range(20):
            await runner.run(_flows.flow, _flows.ORDER)
        return await profiled(job)


async def _unfinished_job(
    case: str, ctx: Context, runs: int, profiled: Callable[[Callable[[], Awaitable[None]]], Any]
) -> Any:
    from agentflow.exec.seal import Sealer
    from bench import unfinished

    svc = ctx.services
    sealer, body = Sealer(ctx.key), await unfinished._template()
    if case == "unfinished-redis" and svc.redis_url:
        import redis.asyncio as aioredis

        async with _services.redis_store(svc.redis_url, ctx.tag) as store:
            client = aioredis.Redis.from_url(svc.redis_url)
            try:
                fill = unfinished._redis_filler(store, client, ctx.tag)
                for first in range(0, runs, unfinished.BATCH):
                    await fill(unfinished._rows(sealer, body, first, min(unfinished.BATCH, runs - first), ctx.tag))
            finally:
                await client.aclose()
            await store.list_unfinished(_flows.flow.name)
            return await profiled(lambda: store.list_unfinished(_flows.flow.name))
    if case == "unfinished-pg" and svc.pg_url:
        async with _services.sqlalchemy_pg_store(svc.pg_url, f"{ctx.tag}_") as store:
            await store.setup()
            fill = unfinished._pg_filler(svc.pg_url, f"{ctx.tag}_")
            for first in range(0, runs, unfinished.BATCH):
                await fill(unfinished._rows(sealer, body, first, min(unfinished.BATCH, runs - first), ctx.tag))
            await store.list_unfinished(_flows.flow.name)
            return await profiled(lambda: store.list_unfinished(_flows.flow.name))
    raise SystemExit(f"case {case!r} needs a server that does not answer")


async def main(case: str, runs: int) -> str:
    from pyinstrument import Profiler

    tmp = Path(tempfile.mkdtemp(prefix="agentflow-profile-"))
    ctx = Context(quick=False, tmp=tmp, services=await probe_services(), key=secrets.token_bytes(32))
    profiler = Profiler(async_mode="enabled", interval=0.0005)

    async def profiled(job: Callable[[], Awaitable[None]]) -> None:
        profiler.start()
        await job()
        profiler.stop()

    try:
        if case in FLOW_CASES:
            await _flow_job(case, ctx, runs, profiled)
        else:
            await _unfinished_job(case, ctx, runs, profiled)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"profile-{case}.html").write_text(profiler.output_html())
    text = profiler.output_text(unicode=False, color=False, show_all=False)
    (RESULTS / f"profile-{case}.txt").write_text(text)
    return text


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.splitlines()[0])
    parser.add_argument("case", choices=CASES)
    parser.add_argument("--runs", type=int, default=None, help="flow runs (default 300) or unfinished runs (10,000)")
    args = parser.parse_args()
    default = 10_000 if args.case.startswith("unfinished") else 300
    print(asyncio.run(main(args.case, args.runs or default)))
