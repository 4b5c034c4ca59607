"""Issue 4 item 7: the durability cost per superstep of all six store set-ups, side by side.

The 3-node flow runs with no store and with each store, interleaved; the cost per
superstep is (with - without) / 3. LangGraph's checkpointers for the same back-ends run
alongside as a reference, per checkpoint (its graph writes 5 per run): InMemorySaver,
AsyncSqliteSaver (SQLite's default ``synchronous=FULL``, like agentflow's SQLite store)
and AsyncPostgresSaver. LangGraph's Redis saver needs the RedisJSON and RediSearch
modules, which plain Redis lacks, so Redis has no LangGraph reference. ``--case PART``
keeps the set-ups whose name contains PART, and their references:
``python -m bench --only stores --case PostgreSQL``.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from agentflow.exec.checkpoints import MemoryCheckpointStore, SQLiteCheckpointStore
from bench import _flows, _langgraph, _services
from bench._report import Report, Table
from bench._suite import Context
from bench._timing import Plan, Series, fmt_span, interleave

TITLE = "Durability cost per superstep of the six store set-ups side by side (LangGraph per checkpoint for reference)"

#: A diagnostic pair, run only when a ``--case`` names it (``--case synchronous_commit``): both
#: sides' PostgreSQL sessions with ``synchronous_commit=off``, so what remains is all but the flushes.
_NO_FLUSH_SUFFIX = " (synchronous_commit off)"
_NO_FLUSH = f"SQLAlchemy + PostgreSQL{_NO_FLUSH_SUFFIX}"
#: agentflow set-up -> the LangGraph case for the same back-end (None: no such saver).
REFERENCE = {
    "memory": "LangGraph InMemorySaver",
    "SQLite (FULL)": "LangGraph AsyncSqliteSaver (FULL)",
    "fakeredis": None,
    "Redis": None,
    "SQLAlchemy + aiosqlite": None,
    "SQLAlchemy + PostgreSQL": "LangGraph AsyncPostgresSaver",
    _NO_FLUSH: f"LangGraph AsyncPostgresSaver{_NO_FLUSH_SUFFIX}",
}


async def _stores(ctx: Context, stack: AsyncExitStack, report: Report) -> dict[str, Any]:
    from agentflow.exec.checkpoints import SQLAlchemyCheckpointStore

    svc = ctx.services
    stores: dict[str, Any] = {}
    if ctx.wants("memory"):
        stores["memory"] = MemoryCheckpointStore()
    if ctx.wants("SQLite (FULL)"):
        stores["SQLite (FULL)"] = SQLiteCheckpointStore(ctx.tmp / "agentflow.db")
        stack.push_async_callback(stores["SQLite (FULL)"].aclose)
    if ctx.wants("fakeredis"):
        stores["fakeredis"] = await stack.enter_async_context(_services.fakeredis_store(ctx.tag))
    if ctx.wants("Redis") and svc.redis_url:
        stores["Redis"] = await stack.enter_async_context(_services.redis_store(svc.redis_url, ctx.tag))
    elif ctx.wants("Redis"):
        report.notes.append(f"Redis skipped: {svc.redis_why}")
    if ctx.wants("SQLAlchemy + aiosqlite"):
        stores["SQLAlchemy + aiosqlite"] = SQLAlchemyCheckpointStore(
            f"sqlite+aiosqlite:///{ctx.tmp / 'sqlalchemy.db'}", table_prefix=f"{ctx.tag}_"
        )
        stack.push_async_callback(stores["SQLAlchemy + aiosqlite"].aclose)
    if ctx.wants("SQLAlchemy + PostgreSQL") and svc.pg_url:
        stores["SQLAlchemy + PostgreSQL"] = await stack.enter_async_context(
            _services.sqlalchemy_pg_store(svc.pg_url, f"{ctx.tag}_")
        )
    elif ctx.wants("SQLAlchemy + PostgreSQL"):
        report.notes.append(f"PostgreSQL skipped: {svc.pg_why}")
    if ctx.named(_NO_FLUSH) and svc.pg_url:
        stores[_NO_FLUSH] = await stack.enter_async_context(
            _services.sqlalchemy_pg_store(svc.pg_url, f"{ctx.tag}_nf_", synchronous_commit=False)
        )
    return stores


async def _langgraph_cases(
    ctx: Context, stack: AsyncExitStack, tmp: Path, stores: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, int]]:
    """LangGraph's run without a checkpointer and with the reference saver of each store measured."""
    order, graph = _flows.ORDER, _flows.graph()
    plain = graph.compile()
    cases: dict[str, Any] = {"LangGraph ainvoke, no checkpointer": lambda: plain.ainvoke(order)}
    savers: dict[str, Any] = {}
    if "memory" in stores:
        savers["LangGraph InMemorySaver"] = _langgraph.memory_saver()
    if "SQLite (FULL)" in stores:
        savers["LangGraph AsyncSqliteSaver (FULL)"] = await stack.enter_async_context(
            _langgraph.async_sqlite_saver(tmp / "langgraph.db", "FULL")
        )
    if ctx.services.pg_url and "SQLAlchemy + PostgreSQL" in stores:
        savers["LangGraph AsyncPostgresSaver"] = await stack.enter_async_context(
            _langgraph.async_postgres_saver(ctx.services.pg_url, f"{ctx.tag}_langgraph")
        )
    if ctx.services.pg_url and _NO_FLUSH in stores:
        savers[REFERENCE[_NO_FLUSH] or ""] = await stack.enter_async_context(
            _langgraph.async_postgres_saver(ctx.services.pg_url, f"{ctx.tag}_langgraph_nf", synchronous_commit=False)
        )
    counts: dict[str, int] = {}
    for name, saver in savers.items():
        compiled = graph.compile(checkpointer=saver)
        probe = _langgraph.config()
        await compiled.ainvoke(order, probe)
        counts[name] = len([c async for c in saver.alist(probe)])
        cases[name] = lambda g=compiled: g.ainvoke(order, _langgraph.config())
    return cases, counts


async def run(ctx: Context) -> Report:
    report = Report("stores", TITLE)
    flow, order = _flows.flow, _flows.ORDER
    async with AsyncExitStack() as stack:
        stores = await _stores(ctx, stack, report)
        plain = _flows.runner()
        cases: dict[str, Any] = {"agentflow, no store": lambda: plain.run(flow, order)}
        for name, store in stores.items():
            runner = _flows.runner(store, None if name == "memory" else ctx.key)
            await runner.run(flow, order)  # creates tables and connections before the timing
            cases[name] = lambda r=runner: r.run(flow, order)
        lg_cases, lg_counts = await _langgraph_cases(ctx, stack, ctx.tmp, stores)
        cases |= lg_cases
        plan = Plan(warmup=ctx.sized(20, 5), blocks=ctx.sized(7, 3), per_block=ctx.sized(40, 10))
        times = await interleave(cases, plan)
    ours = {n: (times[n] - times["agentflow, no store"]) / _flows.SUPERSTEPS for n in stores}
    theirs = {n: (times[n] - times["LangGraph ainvoke, no checkpointer"]) / lg_counts[n] for n in lg_counts}
    table = Table(
        f"Cost per superstep (3-node flow; median of {plan.blocks} blocks of {plan.per_block} runs, "
        "interleaved; min..max)",
        ["store set-up", "per run", "agentflow per superstep", "LangGraph per checkpoint", "ratio"],
    )
    for name in stores:
        ref = REFERENCE[name]
        if ref is not None and ref in theirs:
            ratio = ours[name].ratio(theirs[ref])
            measurable = ours[name].median > 0 and theirs[ref].median > 0
            table.add(
                name,
                fmt_span(times[name]),
                fmt_span(ours[name]),
                f"{fmt_span(theirs[ref])} ({ref})",
                f"{ratio.median:.2f}x ({ratio.lo:.2f}..{ratio.hi:.2f})" if measurable else "below the noise here (P1)",
            )
        else:
            table.add(
                name, fmt_span(times[name]), fmt_span(ours[name]), "no LangGraph saver" if ref is None else "", ""
            )
    counted = ", ".join(f"{name.removeprefix('LangGraph ')} {n}" for name, n in lg_counts.items())
    table.note = (
        f"Baselines: agentflow without a store {fmt_span(times['agentflow, no store'])} per run; LangGraph without "
        f"a checkpointer {fmt_span(times['LangGraph ainvoke, no checkpointer'])} per run. LangGraph checkpoints "
        f"per run: {counted}."
    )
    report.tables.append(table)
    report.data = {
        "plan": plan.__dict__,
        "per_run_s": times,
        "agentflow_per_superstep_s": ours,
        "langgraph_per_checkpoint_s": theirs,
        "langgraph_checkpoints_per_run": lg_counts,
        "reference": REFERENCE,
    }
    return report


def plot(report: Report, out_dir: Path) -> list[Path]:
    """Horizontal bars: agentflow's cost per superstep for each store, LangGraph's per checkpoint beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Series from this run, or their JSON form ({"blocks": [...], ...}) when read back from a file.
    ours: dict[str, Series | dict[str, Any]] = report.data["agentflow_per_superstep_s"]
    theirs: dict[str, Series | dict[str, Any]] = report.data["langgraph_per_checkpoint_s"]
    labels, values, errors, colors = [], [], [], []
    for name, series in ours.items():
        ref = REFERENCE.get(name)
        for label, raw, color in [(f"agentflow · {name}", series, "#1f77b4")] + (
            [(f"LangGraph · {ref.removeprefix('LangGraph ')}", theirs[ref], "#ff7f0e")]
            if ref is not None and ref in theirs
            else []
        ):
            s = raw if isinstance(raw, Series) else Series.of(raw["blocks"])
            labels.append(label)
            values.append(s.median * 1e3)
            errors.append((max(s.median - s.lo, 0) * 1e3, max(s.hi - s.median, 0) * 1e3))
            colors.append(color)
    fig, ax = plt.subplots(figsize=(9, 0.42 * len(labels) + 1.8))
    ys = list(range(len(labels)))[::-1]
    ax.barh(ys, values, xerr=list(zip(*errors, strict=True)), color=colors, capsize=3, ecolor="#555")
    ax.set_yticks(ys, labels)
    ax.set_xscale("log")
    ax.set_xlabel("ms, log scale (bar: median; whiskers: min..max over blocks)")
    ax.set_title("Durability cost by store (3-node flow)", fontsize=11)
    for y, v, (_, up) in zip(ys, values, errors, strict=True):
        ax.text(v + up, y, f"  {v:.2f} ms", va="center", fontsize=8)
    ax.set_xlim(right=max(v + e[1] for v, e in zip(values, errors, strict=True)) * 4)
    from matplotlib.patches import Patch

    ax.legend(
        handles=[
            Patch(color="#1f77b4", label="agentflow, per superstep (2 call records + 1 checkpoint, signed)"),
            Patch(color="#ff7f0e", label="LangGraph, per checkpoint"),
        ],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.13),
        ncol=2,
        fontsize=8,
    )
    ax.grid(axis="x", alpha=0.3, which="both")
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "bench-overhead-by-store.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return [path]
