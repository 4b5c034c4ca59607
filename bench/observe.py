"""Issue 18: what metrics cost per superstep on the memory store, off (installed, nobody listening) and on.

The 3-superstep ticket flow (`bench._flows`) on a memory store, four cases interleaved,
each with a runner and a store of its own (emptied between blocks):

- ``no events``: the runner's hub builds no event at all (its ``emit`` does nothing): the floor;
- ``metrics off``: a plain runner, prometheus-client installed, nobody subscribed (each
  ``emit`` returns at its first check): what every user pays;
- ``metrics on``: `Metrics.watch` on the runner's hub;
- ``metrics on, store timed``: and the store wrapped in `TimedStore`, as the workers run.

Overheads are computed block by block, per superstep (a run has 3), as a fraction of the
superstep of ``metrics off``: off = off - no events (an upper bound: it holds every emit,
the ones the demo and the viewer use too); on = on - off. The same cases then run again in
a child process in prometheus-client's multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``
set, as in Celery workers: every value written to a memory-mapped file), and there, when
Redis answers, ``metrics off`` against ``metrics on, store timed`` on the Redis store: the
workers' own set-up.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentflow import Events, Executor, FlowRunner
from agentflow.exec.checkpoints import MemoryCheckpointStore
from bench import _flows, _services
from bench._report import Report, Table, Target
from bench._suite import Context
from bench._timing import Plan, Series, fmt_span, interleave

TITLE = "Issue 18: metrics off and on, per superstep on the memory store"
#: Issue 18's targets: metrics off at most this fraction of a superstep, on at most that one.
OFF_LIMIT, ON_LIMIT = 0.02, 0.10
CASES = ("no events", "metrics off", "metrics on", "metrics on, store timed")
#: The cases measured on Redis (the workers' store): off, and on as the workers run.
REDIS_CASES = ("metrics off", "metrics on, store timed")


class _Silent(Events):
    """A hub that builds no event: the floor under "metrics off"."""

    def emit(self, name: str, run_id: str | None, **data: Any) -> None:
        return None


def _runner(case: str, store: Any) -> FlowRunner:
    events = _Silent() if case == "no events" else Events()
    checkpoints = store
    if case.startswith("metrics on"):
        from agentflow.observe import Metrics, TimedStore

        metrics = Metrics()
        metrics.watch(events)
        if case.endswith("timed"):
            checkpoints = TimedStore(store, metrics.store_seconds)
    key = None if isinstance(store, MemoryCheckpointStore) else b"observe-bench-key-0123456789abcdef"
    return FlowRunner(Executor(_flows.registry, events=events), checkpoints=checkpoints, checkpoint_key=key)


async def measure(plan: Plan, redis_url: str | None = None, tag: str = "") -> dict[str, Series]:
    """Time one run of each case round-robin (`interleave`); per-run medians by block.

    On the memory store by default (emptied between blocks); with `redis_url`, `REDIS_CASES`
    on Redis stores under ``<tag>-<n>`` (removed afterwards).
    """
    async with contextlib.AsyncExitStack() as stack:
        names: Sequence[str] = CASES if redis_url is None else REDIS_CASES
        stores: list[Any] = []
        for n, _ in enumerate(names):
            if redis_url is None:
                stores.append(MemoryCheckpointStore())
            else:
                stores.append(await stack.enter_async_context(_services.redis_store(redis_url, f"{tag}-{n}")))
        runners = [_runner(case, store) for case, store in zip(names, stores, strict=True)]
        cases = {
            case: (lambda r=runner: r.run(_flows.flow, _flows.ORDER))
            for case, runner in zip(names, runners, strict=True)
        }

        async def empty() -> None:
            for store in stores:
                if isinstance(store, MemoryCheckpointStore):
                    for row in await store.list_runs(limit=sys.maxsize):
                        await store.delete(row.run_id)

        return await interleave(cases, plan, between=empty)


def _multiprocess(plan: Plan, redis_plan: Plan, redis_url: str | None, tag: str) -> dict[str, dict[str, Series]]:
    """`measure` (memory, then Redis) in a child process whose prometheus-client is in multiprocess mode."""
    with tempfile.TemporaryDirectory(prefix="agentflow-bench-mp-") as folder:
        out = Path(folder) / "out.json"
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": folder}
        plans = json.dumps([plan.__dict__, redis_plan.__dict__])
        argv = [sys.executable, "-m", "bench.observe", "--child", str(out), plans, redis_url or "", tag]
        subprocess.run(argv, env=env, check=True, cwd=Path(__file__).resolve().parent.parent)
        found = json.loads(out.read_text())
        return {part: {case: Series.of(v) for case, v in times.items()} for part, times in found.items()}


def _table(title: str, times: dict[str, Series]) -> Table:
    base = times["metrics off"] / _flows.SUPERSTEPS
    table = Table(title, ["case", "per superstep", "over the case above", "of a superstep (metrics off)"])
    previous: Series | None = None
    for case in times:
        per = times[case] / _flows.SUPERSTEPS
        extra = "" if previous is None else fmt_span(per - previous)
        share = "" if previous is None else _pct((per - previous) / base)
        table.add(case, fmt_span(per), extra, share)
        previous = per
    return table


def _share(times: dict[str, Series], case: str, over: str) -> Series:
    """(`case` - `over`) per superstep, as a fraction of the superstep of ``metrics off``, block by block."""
    return (times[case] - times[over]) / times["metrics off"]


async def run(ctx: Context) -> Report:
    report = Report("observe", TITLE)
    plan = Plan(warmup=ctx.sized(100, 5), blocks=ctx.sized(9, 3), per_block=ctx.sized(200, 20))
    redis_plan = Plan(warmup=ctx.sized(20, 3), blocks=ctx.sized(9, 3), per_block=ctx.sized(100, 5))
    single = await measure(plan)
    child = await asyncio.to_thread(_multiprocess, plan, redis_plan, ctx.services.redis_url, ctx.tag)
    runs = f"{plan.blocks} blocks of {plan.per_block} runs per case, interleaved; min..max over blocks"
    report.tables += [
        _table(f"One process (in-process runners; {runs})", single),
        _table(f"Multiprocess mode (Celery workers' values in mmap files; {runs})", child["memory"]),
    ]
    off, on, timed = (
        _share(single, "metrics off", "no events"),
        _share(single, "metrics on", "metrics off"),
        _share(single, "metrics on, store timed", "metrics off"),
    )
    on_mp = _share(child["memory"], "metrics on, store timed", "metrics off")
    report.targets += [
        Target("issue 18 metrics off", off.median, OFF_LIMIT, _pct(off), f"<= {OFF_LIMIT:.0%}"),
        Target("issue 18 metrics on", on.median, ON_LIMIT, _pct(on), f"<= {ON_LIMIT:.0%}"),
        Target("issue 18 metrics on, store timed", timed.median, ON_LIMIT, _pct(timed), f"<= {ON_LIMIT:.0%}"),
        Target("issue 18 on, store timed, multiprocess", on_mp.median, ON_LIMIT, _pct(on_mp), f"<= {ON_LIMIT:.0%}"),
    ]
    if "redis" in child:
        redis_runs = f"{redis_plan.blocks} blocks of {redis_plan.per_block} runs per case"
        report.tables.append(
            _table(f"The workers' set-up: Redis store, multiprocess mode ({redis_runs})", child["redis"])
        )
        workers = _share(child["redis"], "metrics on, store timed", "metrics off")
        report.targets.append(
            Target("issue 18 workers' set-up (Redis)", workers.median, ON_LIMIT, _pct(workers), f"<= {ON_LIMIT:.0%}")
        )
    else:
        report.notes.append(f"Redis part skipped: {ctx.services.redis_why}")
    report.notes.append(
        "off = metrics off - no events (every emit of a run, with nobody listening); on = the case - metrics off; "
        "each over the superstep of metrics off, block by block."
    )
    report.data = {"plan": plan.__dict__, "per_run_s": single, "child_per_run_s": child}
    return report


def _pct(series: Series) -> str:
    return f"{series.median:.1%} ({series.lo:.1%}..{series.hi:.1%})"


def _child(out: str, plans: str, redis_url: str, tag: str) -> None:
    memory, redis = (Plan(**p) for p in json.loads(plans))
    parts = {"memory": asyncio.run(measure(memory))}
    if redis_url:
        parts["redis"] = asyncio.run(measure(redis, redis_url, tag))
    found = {part: {case: list(series.values) for case, series in times.items()} for part, times in parts.items()}
    Path(out).write_text(json.dumps(found))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.observe", description=TITLE)
    parser.add_argument("--child", nargs=4, metavar=("OUT", "PLANS", "REDIS_URL", "TAG"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(*args.child)
    else:
        sys.exit(subprocess.call([sys.executable, "-m", "bench", "--only", "observe", "--no-plots"]))
