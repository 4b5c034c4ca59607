"""P1 for tool loops (issue 17 item 5): the cost of durability per tool-loop stage, agentflow vs LangGraph.

The loop: one user message, then `stages` tool-calling stages, then an answer. A stage is
a model reply asking for one call of a cheap tool (``lookup``, returning a fixed 400-character
text), the call and its result: in agentflow the loop's ``model`` and ``tools`` checkpoints
with their call records; in LangGraph a pass through the agent node and the tool node. The
model is scripted on both sides (no network): agentflow's `ScriptedModel`, LangGraph's
`bench._react.ScriptedChat` under its prebuilt ReAct agent, with the same texts (P5's).

Overhead per stage = (time per run with the store - time per run without) / stages, for
both sides (the start, the answer and a run's fixed costs are spread over its stages, as
P1 spreads step 0 over the supersteps). LangGraph's checkpoints per stage are counted
(its saver's list), and its overhead is shown per checkpoint too. Three groups, each
interleaved on its own with its own baselines, as P1 does: memory, SQLite (NORMAL and
FULL; LangGraph on both its paths, `ainvoke` with `AsyncSqliteSaver` and `invoke` with
`SqliteSaver`, the ratio taken against the cheaper), and the servers (Redis, SQLAlchemy +
PostgreSQL; LangGraph's `AsyncPostgresSaver`). LangGraph's Redis saver is a separate
package needing the RedisJSON and RediSearch modules; where it is missing Redis has no
reference, and the report says so.

What a stage writes is counted from probe runs of `stages` and `stages + 1` stages (their
difference is one stage exactly): agentflow's checkpoints, call records and store calls by
method; bytes are the rows as stored (payload, signature, key id, ids) for agentflow, and
the serialized checkpoints, blobs and writes of the thread for LangGraph, averaged per stage
over the run (LangGraph's grow with the history: P5).
"""

from __future__ import annotations

import inspect
import sys
from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from agentflow.exec.checkpoints import MemoryCheckpointStore, SQLiteCheckpointStore
from bench import _langgraph, _services
from bench._loop_agentflow import RESULT, Loop, probe
from bench._report import Report, Table
from bench._suite import Context
from bench._timing import Plan, Series, fmt_ratio, fmt_span, interleave

TITLE = (
    "P1 for tool loops: durability per stage (memory, SQLite, Redis, PostgreSQL), agentflow vs LangGraph's ReAct agent"
)
LEVELS = ("NORMAL", "FULL")
BASE = "agentflow, no store"
LG_BASE = "LangGraph ainvoke, no checkpointer"
LG_SYNC_BASE = "LangGraph invoke, no checkpointer"
#: store set-up -> (agentflow case, LangGraph cases for the same back-end: the ratio takes the cheaper).
PAIRS: dict[str, tuple[str, list[str]]] = {
    "memory": ("agentflow memory", ["LangGraph InMemorySaver"]),
    **{
        f"SQLite {lv}": (f"agentflow SQLite {lv}", [f"LangGraph AsyncSqliteSaver {lv}", f"LangGraph SqliteSaver {lv}"])
        for lv in LEVELS
    },
    "Redis": ("agentflow Redis", []),
    "SQLAlchemy + PostgreSQL": ("agentflow SQLAlchemy + PostgreSQL", ["LangGraph AsyncPostgresSaver"]),
}


async def _agentflow_cases(
    ctx: Context, stack: AsyncExitStack, report: Report
) -> tuple[dict[str, dict[str, Any]], Any]:
    """agentflow's cases by group, with each store's probe (kept in `report.data`), and the memory store."""
    svc, k = ctx.services, ctx.sized(10, 3)
    loop, longer = Loop(k), Loop(k + 1)
    stores: dict[str, tuple[str, Any, bytes | None]] = {}
    memory = MemoryCheckpointStore()
    stores["agentflow memory"] = ("memory", memory, None)
    for lv in LEVELS:
        store = SQLiteCheckpointStore(ctx.tmp / f"agentflow-{lv}.db", synchronous=lv)  # type: ignore[arg-type]
        stack.push_async_callback(store.aclose)
        stores[f"agentflow SQLite {lv}"] = ("SQLite", store, ctx.key)
    if svc.redis_url:
        redis = await stack.enter_async_context(_services.redis_store(svc.redis_url, ctx.tag))
        stores["agentflow Redis"] = ("servers", redis, ctx.key)
    else:
        report.notes.append(f"Redis skipped: {svc.redis_why}")
    if svc.pg_url:
        pg = await stack.enter_async_context(_services.sqlalchemy_pg_store(svc.pg_url, f"{ctx.tag}_"))
        stores["agentflow SQLAlchemy + PostgreSQL"] = ("servers", pg, ctx.key)
    else:
        report.notes.append(f"PostgreSQL skipped: {svc.pg_why}")
    groups: dict[str, dict[str, Any]] = {"memory": {}, "SQLite": {}, "servers": {}}
    for cases in groups.values():
        cases[BASE] = loop.run
    probes = report.data.setdefault("agentflow_probes", {})
    for name, (group, store, key) in stores.items():
        probes[name] = {"run": await probe(loop, store, key), "longer": await probe(longer, store, key)}
        groups[group][name] = lambda s=store, key=key: loop.run(s, key)
    return groups, memory


async def _lg_probe(graph: Any, saver: Any, count_bytes: Any, stages: int, sync: bool) -> tuple[int, int]:
    """One LangGraph run: (checkpoints, bytes) its saver holds for the thread."""
    from bench import _react

    loop = Loop(stages)
    config = _react.config(stages)
    if sync:
        graph.invoke(_react.inputs(loop.initial[0]), config)
        cps = len(list(saver.list(config)))
    else:
        await graph.ainvoke(_react.inputs(loop.initial[0]), config)
        cps = len([c async for c in saver.alist(config)])
    held = count_bytes(config["configurable"]["thread_id"])
    return cps, (await held) if inspect.isawaitable(held) else held


async def _langgraph_cases(
    ctx: Context, stack: AsyncExitStack, report: Report
) -> tuple[dict[str, dict[str, Any]], Any]:
    """LangGraph's cases by group (probes in `report.data`), and its InMemorySaver."""
    from bench import _react

    k = ctx.sized(10, 3)
    loop = Loop(k)
    user, replies = loop.initial[0], loop.replies
    groups: dict[str, dict[str, Any]] = {"memory": {}, "SQLite": {}, "servers": {}}
    plain = _react.agent(replies, RESULT)
    for cases in groups.values():
        cases[LG_BASE] = lambda: plain.ainvoke(_react.inputs(user), _react.config(k))
    groups["SQLite"][LG_SYNC_BASE] = lambda: plain.invoke(_react.inputs(user), _react.config(k))
    savers: dict[str, tuple[str, Any, Any, bool]] = {}
    memory = _langgraph.memory_saver()
    savers["LangGraph InMemorySaver"] = ("memory", memory, lambda t: _react.memory_bytes(memory, t), False)
    for lv in LEVELS:
        path = ctx.tmp / f"langgraph-async-{lv}.db"
        saver = await stack.enter_async_context(_langgraph.async_sqlite_saver(path, lv))
        savers[f"LangGraph AsyncSqliteSaver {lv}"] = (
            "SQLite",
            saver,
            lambda t, p=path: _react.sqlite_bytes(p, t),
            False,
        )
        sync_path = ctx.tmp / f"langgraph-sync-{lv}.db"
        sync_saver, conn = _langgraph.sqlite_saver(sync_path, lv)
        stack.callback(conn.close)
        savers[f"LangGraph SqliteSaver {lv}"] = (
            "SQLite",
            sync_saver,
            lambda t, p=sync_path: _react.sqlite_bytes(p, t),
            True,
        )
    if ctx.services.pg_url:
        pg = await stack.enter_async_context(
            _langgraph.async_postgres_saver(ctx.services.pg_url, f"{ctx.tag}_langgraph")
        )
        savers["LangGraph AsyncPostgresSaver"] = ("servers", pg, lambda t: _react.postgres_bytes(pg, t), False)
    try:
        import langgraph.checkpoint.redis  # type: ignore[import-not-found]  # noqa: F401

        report.notes.append("langgraph-checkpoint-redis is installed but not measured here")
    except ImportError:
        report.notes.append(
            "Redis has no LangGraph reference: no LangGraph Redis saver is installed (langgraph-checkpoint-redis, "
            "a separate package, which needs the RedisJSON and RediSearch modules this Redis lacks)"
        )
    probes = report.data.setdefault("langgraph_probes", {})
    for name, (group, saver, count_bytes, sync) in savers.items():
        graph = _react.agent(replies, RESULT, saver)
        longer = _react.agent(Loop(k + 1).replies, RESULT, saver)
        cps, held = await _lg_probe(graph, saver, count_bytes, k, sync)
        more, _ = await _lg_probe(longer, saver, count_bytes, k + 1, sync)
        probes[name] = {"checkpoints": cps, "bytes": held, "checkpoints_per_stage": more - cps}
        if sync:
            groups[group][name] = lambda g=graph: g.invoke(_react.inputs(user), _react.config(k))
        else:
            groups[group][name] = lambda g=graph: g.ainvoke(_react.inputs(user), _react.config(k))
    return groups, memory


def _overheads(times: dict[str, Series], stages: int) -> dict[str, Series]:
    """Per-block overhead per stage of every durable case of one group, over its own baseline."""
    out: dict[str, Series] = {}
    for name, series in times.items():
        if name in (BASE, LG_BASE, LG_SYNC_BASE):
            continue
        if name.startswith("agentflow"):
            base = BASE
        else:
            base = LG_SYNC_BASE if name.startswith("LangGraph SqliteSaver") else LG_BASE
        out[name] = (series - times[base]) / stages
    return out


def _stage_table(over: dict[str, Series], lg: dict[str, Any], stages: int) -> Table:
    table = Table(
        f"Durability overhead per tool-loop stage ({stages} stages per run; median, min..max over blocks)",
        ["store", "agentflow / stage", "LangGraph case", "LangGraph / stage", "its checkpoints / stage",
         "LangGraph / checkpoint", "agentflow / LangGraph, per stage"],
    )  # fmt: skip
    for label, (ours, refs) in PAIRS.items():
        if ours not in over:
            continue
        refs = [r for r in refs if r in over]
        if not refs:
            table.add(label, fmt_span(over[ours]), "no LangGraph saver", "", "", "", "")
            continue
        cheaper = min(refs, key=lambda r: over[r].median)
        for ref in refs:
            cps = lg[ref]["checkpoints"]
            ratio = over[ours].ratio(over[ref])
            shown = fmt_ratio(ratio) if over[ours].median > 0 and over[ref].median > 0 else "below the noise"
            table.add(
                label if ref == refs[0] else "",
                fmt_span(over[ours]) if ref == refs[0] else "",
                ref.removeprefix("LangGraph ") + (" (the cheaper)" if len(refs) > 1 and ref == cheaper else ""),
                fmt_span(over[ref]),
                f"{lg[ref]['checkpoints_per_stage']} ({cps} per run)",
                fmt_span(over[ref] * stages / cps),
                f"**{shown}**" if ref == cheaper else shown,
            )
    return table


def _writes_table(af: dict[str, Any], lg: dict[str, Any], stages: int) -> Table:
    table = Table(
        "What one stage writes (agentflow: a run of "
        f"{stages + 1} stages minus a run of {stages}; bytes: the run's total / {stages})",
        ["store", "agentflow rows per stage", "agentflow store calls per stage", "agentflow bytes / stage",
         "LangGraph bytes / stage", "LangGraph / agentflow bytes"],
    )  # fmt: skip
    for label, (ours, refs) in PAIRS.items():
        if ours not in af:
            continue
        run, longer = af[ours]["run"], af[ours]["longer"]
        rows = (
            f"{longer['checkpoints'] - run['checkpoints']} checkpoints + {longer['records'] - run['records']} records"
        )
        calls = Counter(longer["calls"])
        calls.subtract(run["calls"])
        shown = ", ".join(f"{n} {c}" for n, c in sorted(calls.items()) if c)
        ours_bytes = run["bytes"] / stages
        refs = [r for r in refs if r in lg]
        theirs = " / ".join(f"{lg[r]['bytes'] / stages:,.0f} B" for r in refs) or "no LangGraph saver"
        ratio = " / ".join(f"{lg[r]['bytes'] / run['bytes']:.1f}x" for r in refs)
        table.add(label, rows, shown, f"{ours_bytes:,.0f} B", theirs, ratio)
    return table


async def run(ctx: Context) -> Report:
    report = Report("loop_durability", TITLE)
    stages = ctx.sized(10, 3)
    plans = {
        "memory": Plan(warmup=ctx.sized(20, 3), blocks=ctx.sized(7, 3), per_block=ctx.sized(40, 5)),
        "SQLite": Plan(warmup=ctx.sized(10, 3), blocks=ctx.sized(7, 3), per_block=ctx.sized(20, 5)),
        "servers": Plan(warmup=ctx.sized(10, 3), blocks=ctx.sized(7, 3), per_block=ctx.sized(20, 5)),
    }
    async with AsyncExitStack() as stack:
        ours, memory = await _agentflow_cases(ctx, stack, report)
        theirs, saver = await _langgraph_cases(ctx, stack, report)

        async def empty_memory() -> None:
            for row in await memory.list_runs(limit=sys.maxsize):
                await memory.delete(row.run_id)
            _langgraph.empty_memory_saver(saver)

        times: dict[str, dict[str, Series]] = {}
        for group, plan in plans.items():
            cases = ours[group] | theirs[group]
            if len(cases) > 2:  # more than the two baselines
                times[group] = await interleave(cases, plan, between=empty_memory if group == "memory" else None)
    over = {name: s for group in times.values() for name, s in _overheads(group, stages).items()}
    lg, af = report.data["langgraph_probes"], report.data["agentflow_probes"]
    per_run = Table(
        f"Time per run ({stages} stages; median of the blocks, min..max; each group interleaved on its own: "
        + ", ".join(f"{g} {p.per_block} runs per case and block" for g, p in plans.items())
        + ")",
        ["group", "case", "per run", "rows per run"],
    )
    for group, series in times.items():
        for name, s in series.items():
            rows = ""
            if name in af:
                rows = f"{af[name]['run']['checkpoints']} checkpoints + {af[name]['run']['records']} call records"
            elif name in lg:
                rows = f"{lg[name]['checkpoints']} checkpoints"
            per_run.add(group, name, fmt_span(s), rows)
    report.tables += [per_run, _stage_table(over, lg, stages), _writes_table(af, lg, stages)]
    report.data |= {"stages": stages, "plans": {g: p.__dict__ for g, p in plans.items()}}
    report.data |= {"per_run_s": times, "overhead_per_stage_s": over, "pairs": PAIRS}
    return report


def plot(report: Report, out_dir: Path) -> list[Path]:
    """Bars per store: the cost of one stage (left, log scale) and the bytes it stores (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    data = report.data
    stages = data["stages"]
    over = {n: s if isinstance(s, Series) else Series.of(s["blocks"]) for n, s in data["overhead_per_stage_s"].items()}
    af, lg = data["agentflow_probes"], data["langgraph_probes"]
    bars: list[tuple[str, Series, float, str]] = []  # label, time per stage, bytes per stage, colour
    for label, (ours, refs) in data["pairs"].items():
        if ours in over:
            bars.append((f"agentflow · {label}", over[ours], af[ours]["run"]["bytes"] / stages, "#1f77b4"))
        for ref in refs:
            if ref in over:
                bars.append(
                    (ref.replace("LangGraph ", "LangGraph · "), over[ref], lg[ref]["bytes"] / stages, "#ff7f0e")
                )
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 0.42 * len(bars) + 2), sharey=True)
    ys = list(range(len(bars)))[::-1]
    ms = [max(b[1].median, 1e-9) * 1e3 for b in bars]
    errs = [[max(b[1].median - b[1].lo, 0) * 1e3 for b in bars], [max(b[1].hi - b[1].median, 0) * 1e3 for b in bars]]
    colors = [b[3] for b in bars]
    ax.barh(ys, ms, xerr=errs, color=colors, capsize=3, ecolor="#555")
    ax.set_yticks(ys, [b[0] for b in bars])
    ax.set_xscale("log")
    ax.set_xlabel("ms per stage, log scale (median; whiskers min..max over blocks)")
    ax.set_title(f"Durability cost per tool-loop stage ({stages} stages per run)", fontsize=10)
    for y, v, up in zip(ys, ms, errs[1], strict=True):
        ax.text(v + up, y, f"  {v:.2f}", va="center", fontsize=8)
    ax.set_xlim(right=max(v + up for v, up in zip(ms, errs[1], strict=True)) * 6)
    kb = [b[2] / 1e3 for b in bars]
    bx.barh(ys, kb, color=colors)
    bx.set_xlabel("kB stored per stage (run total / stages)")
    bx.set_title("Bytes stored per stage", fontsize=10)
    for y, v in zip(ys, kb, strict=True):
        bx.text(v, y, f"  {v:.1f}", va="center", fontsize=8)
    bx.set_xlim(right=max(kb) * 1.25)
    for axis in (ax, bx):
        axis.grid(axis="x", alpha=0.3, which="both")
    fig.legend(
        handles=[Patch(color="#1f77b4", label="agentflow run_tool_loop"),
                 Patch(color="#ff7f0e", label="LangGraph create_react_agent")],
        loc="lower center", ncol=2, fontsize=8,
    )  # fmt: skip
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "bench-loop-durability.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return [path]
