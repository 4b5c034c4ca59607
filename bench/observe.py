"""Issue 18: what metrics and traces cost per superstep on the memory store, off (installed, unused) and on.

The 3-superstep ticket flow (`bench._flows`) on a memory store, four cases interleaved,
each with a runner and a store of its own (emptied between blocks):

- ``no events``: the runner's hub builds no event at all (its ``emit`` does nothing): the floor;
- ``metrics off``: a plain runner, prometheus-client installed, nobody subscribed (each
  ``emit`` returns at its first check): what every user pays;
- ``metrics on``: `Metrics.watch` on the runner's hub;
- ``metrics on, store timed``: and the store timed (`Metrics.store_hook` on a `ForwardingStore`), as the workers run.

- ``tracing on``: the executor's tracer is `agentflow.observe.Tracing` on an SDK
  `TracerProvider` with a `BatchSpanProcessor` (its thread hands the spans to an exporter
  that drops them: encoding and sending them is the exporter's own cost);
- ``tracing on, store traced``: and the store traced (`Tracing.store_hook`: operations as events).

``metrics off`` is also tracing off: the plain runner's executor has the no-op tracer, and
opentelemetry-api is imported. What tracing off costs is timed on its own as well: the calls a
superstep makes to the no-op tracer (its span, its call's span, the saved status), in a loop.

Overheads are computed block by block, per superstep (a run has 3), as a fraction of the
superstep of ``metrics off``: off = off - no events (an upper bound: it holds every emit,
the ones the demo and the viewer use too); on = on - off. The metrics cases then run again in
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
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentflow import Events, Executor, FlowRunner
from agentflow.exec.checkpoints import ForwardingStore, MemoryCheckpointStore
from agentflow.exec.tracing import Tracer
from agentflow.flow._driver import Cursor
from bench import _flows, _services
from bench._report import Report, Table, Target
from bench._suite import Context
from bench._timing import Plan, Series, fmt_span, interleave

if TYPE_CHECKING:
    from agentflow.observe import Tracing

TITLE = "Issue 18: metrics and tracing off and on, per superstep on the memory store"
#: Issue 18's targets: metrics off at most this fraction of a superstep, on at most that one.
OFF_LIMIT, ON_LIMIT = 0.02, 0.10
METRICS = ("no events", "metrics off", "metrics on", "metrics on, store timed")
TRACING = ("tracing on", "tracing on, store traced", "tracing on, 1 in 10 sampled")
#: Tracing measured on Redis too (in this process: the workers' store, without their broker).
REDIS_TRACING = ("metrics off", "tracing on, store traced")
#: The share of runs the sampled case records (OpenTelemetry's ParentBased(TraceIdRatioBased)).
SAMPLED = 0.1
CASES = METRICS + TRACING
#: The cases measured on Redis (the workers' store): off, and on as the workers run.
REDIS_CASES = ("metrics off", "metrics on, store timed")


class _Silent(Events):
    """A hub that builds no event: the floor under "metrics off"."""

    def emit(self, name: str, run_id: str | None, **data: Any) -> None:
        return None


def _tracing(ratio: float = 1.0) -> Tracing:
    """A `Tracing` on an SDK provider recording `ratio` of the traces, its batch processor's exporter
    dropping them (what a real exporter does with a span, encoding and sending it, is its own cost)."""
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    from agentflow.observe import Tracing

    class Dropped:  # a `SpanExporter` (the processor calls these three)
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            return None

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return True

    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
    provider.add_span_processor(BatchSpanProcessor(Dropped(), max_queue_size=1 << 16))
    return Tracing(provider)


def _runner(case: str, store: Any) -> FlowRunner:
    events = _Silent() if case == "no events" else Events()
    checkpoints = store
    tracer: Tracer | None = None
    if case.startswith("tracing on"):
        tracing = _tracing(SAMPLED if case.endswith("sampled") else 1.0)
        tracer = tracing
        if case.endswith("traced"):
            checkpoints = ForwardingStore(store, [tracing.store_hook])
    if case.startswith("metrics on"):
        from agentflow.observe import Metrics

        metrics = Metrics()
        metrics.watch(events)
        if case.endswith("timed"):
            checkpoints = ForwardingStore(store, [metrics.store_hook])
    key = None if isinstance(store, MemoryCheckpointStore) else b"observe-bench-key-0123456789abcdef"
    executor = Executor(_flows.registry, events=events, tracer=tracer)
    return FlowRunner(executor, checkpoints=checkpoints, checkpoint_key=key)


async def measure(
    plan: Plan, redis_url: str | None = None, tag: str = "", cases: Sequence[str] | None = None
) -> dict[str, Series]:
    """Time one run of each case round-robin (`interleave`); per-run medians by block.

    On the memory store by default (emptied between blocks); with `redis_url`, on Redis
    stores under ``<tag>-<n>`` (removed afterwards). `cases`: `CASES` on memory, `REDIS_CASES`
    on Redis, by default.
    """
    async with contextlib.AsyncExitStack() as stack:
        names: Sequence[str] = cases or (CASES if redis_url is None else REDIS_CASES)
        stores: list[Any] = []
        for n, _ in enumerate(names):
            if redis_url is None:
                stores.append(MemoryCheckpointStore())
            else:
                stores.append(await stack.enter_async_context(_services.redis_store(redis_url, f"{tag}-{n}")))
        runners = [_runner(case, store) for case, store in zip(names, stores, strict=True)]
        timed = {
            case: (lambda r=runner: r.run(_flows.flow, _flows.ORDER))
            for case, runner in zip(names, runners, strict=True)
        }

        async def empty() -> None:
            for store in stores:
                if isinstance(store, MemoryCheckpointStore):
                    for row in await store.list_runs(limit=sys.maxsize):
                        await store.delete(row.run_id)

        return await interleave(timed, plan, between=empty)


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


def _table(title: str, times: dict[str, Series], cases: Sequence[str] = METRICS, over_off: bool = False) -> Table:
    """`cases` per superstep, each over the case above it (or over ``metrics off``, with `over_off`)."""
    base = times["metrics off"] / _flows.SUPERSTEPS
    over = "over metrics off" if over_off else "over the case above"
    table = Table(title, ["case", "per superstep", over, "of a superstep (metrics off)"])
    previous: Series | None = None
    for case in cases:
        per = times[case] / _flows.SUPERSTEPS
        extra = "" if previous is None else fmt_span(per - previous)
        share = "" if previous is None else _pct((per - previous) / base)
        table.add(case, fmt_span(per), extra, share)
        if previous is None or not over_off:
            previous = per
    return table


def tracing_off(plan: Plan) -> Series:
    """Seconds per superstep that the no-op tracer's calls take (what tracing off adds), block by block.

    The calls a superstep of the ticket flow makes when tracing is off, in a loop: the entry
    point's ``taking_up``, the superstep's span (`RunSteps.step_span`), its span id for the
    started record, its call's span with the attempt and the outcome, the saved status, and
    the checkpoint body's look at the run's trace context.
    """
    runner = _flows.runner(MemoryCheckpointStore())
    proto, tracer = runner.protocol(_flows.flow), runner.executor.tracer
    cur = Cursor("r", {}, None, _flows.flow, _flows.Order(**_flows.ORDER), ["hold"], {}, 0)
    tool, args = _flows.registry.get("hold_seats"), {"show": "Hamlet", "seats": 2}
    rounds = plan.per_block * 50
    values = []
    for _ in range(plan.blocks):
        began = time.perf_counter()
        for _ in range(rounds):
            tracer.taking_up()
            with proto.steps.step_span(cur):
                if cur.span.ref is not None:
                    raise AssertionError("tracing is off")
                with tracer.tool_call(cur.run_id, tool, "0/hold/0/digest", args) as span:
                    span.attempt(1)
                    span.outcome("ran", "held")
                cur.span.saved(1, "running")
            if cur.trace is not None:
                raise AssertionError("tracing is off")
        values.append((time.perf_counter() - began) / rounds)
    return Series.of(values)


def _share(times: dict[str, Series], case: str, over: str) -> Series:
    """(`case` - `over`) per superstep, as a fraction of the superstep of ``metrics off``, block by block."""
    return (times[case] - times[over]) / times["metrics off"]


def sdk_floor(plan: Plan) -> Series:
    """Seconds per superstep the OpenTelemetry SDK itself takes for the spans a traced ticket run makes.

    The same spans, made directly on the SDK (as `tracing` sets it up): a run's start span,
    and per superstep its span and its call's span, each current while open, with as many
    attributes as agentflow gives them. What tracing on costs beyond it is agentflow's part.
    """
    from opentelemetry import context, trace

    sdk = _tracing().tracer
    step: dict[str, Any] = {
        "agentflow.run_id": "run-0123456789abcdef",
        "agentflow.flow": "tickets",
        "agentflow.superstep": 1,
    }
    step.update({"agentflow.cause": "next", "agentflow.step": 1, "agentflow.segment": 0})
    call: dict[str, Any] = {"agentflow.run_id": "run-0123456789abcdef", "agentflow.tool": "hold_seats"}
    call.update({"agentflow.call_id": "0/hold/0/0123456789abcdef", "agentflow.idempotent": True})
    values = []
    for _ in range(plan.blocks):
        began = time.perf_counter()
        for _ in range(plan.per_block):
            sdk.start_span("agentflow.start tickets", attributes=step).end()
            for _ in range(_flows.SUPERSTEPS):
                outer = sdk.start_span("agentflow.superstep tickets", attributes=step)
                token = context.attach(trace.set_span_in_context(outer))
                inner = sdk.start_span("agentflow.tool hold_seats", attributes=call)
                inner_token = context.attach(trace.set_span_in_context(inner))
                context.detach(inner_token)
                inner.set_attributes({"agentflow.attempts": 1, "agentflow.outcome": "ran"})
                inner.end()
                outer.set_attributes({"agentflow.saved_step": 2, "agentflow.status": "running"})
                context.detach(token)
                outer.end()
        values.append((time.perf_counter() - began) / (plan.per_block * _flows.SUPERSTEPS))
    return Series.of(values)


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
        _table(f"Tracing (in-process runners, the same blocks; {runs})", single, ("metrics off", *TRACING), True),
    ]
    untraced = tracing_off(plan)
    superstep = single["metrics off"] / _flows.SUPERSTEPS
    untraced_share = untraced / superstep
    floor = sdk_floor(plan)
    traced, traced_store, sampled = (_share(single, case, "metrics off") for case in TRACING)
    report.targets += [
        Target("issue 18 tracing off", untraced_share.median, OFF_LIMIT, _pct(untraced_share), f"<= {OFF_LIMIT:.0%}"),
        Target("issue 18 tracing on", traced.median, ON_LIMIT, _pct(traced), f"<= {ON_LIMIT:.0%}"),
        Target(
            "issue 18 tracing on, store traced", traced_store.median, ON_LIMIT, _pct(traced_store), f"<= {ON_LIMIT:.0%}"
        ),
        Target("issue 18 tracing on, 1 in 10 sampled", sampled.median, ON_LIMIT, _pct(sampled), f"<= {ON_LIMIT:.0%}"),
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
    if ctx.services.redis_url:
        traced_redis = await measure(redis_plan, ctx.services.redis_url, f"{ctx.tag}-t", REDIS_TRACING)
        redis_runs = f"{redis_plan.blocks} blocks of {redis_plan.per_block} runs per case"
        report.tables.append(
            _table(f"Tracing on the Redis store, in-process ({redis_runs})", traced_redis, REDIS_TRACING, True)
        )
        on_redis = _share(traced_redis, "tracing on, store traced", "metrics off")
        report.targets.append(
            Target("issue 18 tracing on, Redis", on_redis.median, ON_LIMIT, _pct(on_redis), f"<= {ON_LIMIT:.0%}")
        )
        report.data["redis_tracing_per_run_s"] = traced_redis
    if "redis" in child:
        redis_runs = f"{redis_plan.blocks} blocks of {redis_plan.per_block} runs per case"
        report.tables.append(
            _table(f"The workers' set-up: Redis store, multiprocess mode ({redis_runs})", child["redis"], REDIS_CASES)
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
    report.notes.append(
        f"tracing off = the no-op tracer's calls of one superstep, timed alone in a loop: {fmt_span(untraced)} "
        "per superstep (metrics off is tracing off too: the plain runner's tracer is the no-op one)."
    )
    report.notes.append(
        f"Of tracing on, the OpenTelemetry SDK's own spans (the same spans made directly on it, in a loop): "
        f"{fmt_span(floor)} per superstep, {_pct(floor / superstep)} of a superstep."
    )
    report.data.update(
        plan=plan.__dict__,
        per_run_s=single,
        child_per_run_s=child,
        tracing_off_per_superstep_s=untraced,
        sdk_spans_per_superstep_s=floor,
    )
    return report


def _pct(series: Series) -> str:
    return f"{series.median:.1%} ({series.lo:.1%}..{series.hi:.1%})"


def _child(out: str, plans: str, redis_url: str, tag: str) -> None:
    memory, redis = (Plan(**p) for p in json.loads(plans))
    parts = {"memory": asyncio.run(measure(memory, cases=METRICS))}
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
