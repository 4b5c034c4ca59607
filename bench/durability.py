"""P1 (issue 3 item 7): the cost of durability per superstep, agentflow vs LangGraph, memory and SQLite.

Overhead = (time per run with the store - time per run without) / units, where the unit is
a superstep for agentflow (3 per run; each one tool call, its signed ``started`` and
``done`` records and a signed checkpoint, plus step 0 spread over the three) and a
checkpoint for LangGraph (counted in its tables: 5 per run of this graph). Every case
runs interleaved with every other one, so the baselines are measured alongside.

LangGraph is measured on both its paths, `ainvoke` with `AsyncSqliteSaver` and `invoke`
(sync nodes) with `SqliteSaver`, each against its own no-checkpointer baseline, with its
default durability mode (``async``: the checkpoint is written while the next step runs).
The target takes the cheaper LangGraph path. ``durability="sync"``, which waits for each
checkpoint as agentflow does, is shown for reference.
"""

from __future__ import annotations

import asyncio
import math
import os
import sqlite3
import sys
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from agentflow.exec.checkpoints import MemoryCheckpointStore, SQLiteCheckpointStore
from bench import _flows, _langgraph
from bench._report import Report, Table, Target
from bench._suite import Context
from bench._timing import Plan, Series, fmt_ratio, fmt_span, interleave

TITLE = "P1: durability overhead per superstep, memory and SQLite (NORMAL, FULL), agentflow vs LangGraph"
#: P1: agentflow's overhead per superstep at most this fraction of LangGraph's per checkpoint.
LIMIT = 0.5
LEVELS = ("NORMAL", "FULL")


#: Bytes of the row the commit floor inserts (about one checkpoint row of this flow).
FLOOR_ROW_BYTES = 1200


#: Where the floor's transaction runs: on the event loop's thread, or handed to a worker thread.
FLOOR_WAYS = ("inline", "worker thread")


def _commit_floor(path: Path, level: str, stack: AsyncExitStack) -> dict[str, Any]:
    """One bare SQLite write transaction (BEGIN IMMEDIATE, INSERT, COMMIT), inline and on a worker thread."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {level}")
    conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB NOT NULL)")
    pool = ThreadPoolExecutor(max_workers=1)
    stack.callback(conn.close)
    stack.callback(pool.shutdown)
    blob = os.urandom(FLOOR_ROW_BYTES)

    def job() -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t (v) VALUES (?)", (blob,))
        conn.execute("COMMIT")

    return {
        f"floor: one SQLite commit {level}, inline": job,
        f"floor: one SQLite commit {level}, worker thread": lambda: asyncio.get_running_loop().run_in_executor(
            pool, job
        ),
    }


#: The store methods that each make one write transaction.
WRITES = ("save", "record_call", "save_after_calls")


async def _agentflow_rows(store: Any, runner: Any) -> tuple[int, int, int]:
    """One probe run: (checkpoints, call records, write transactions), the last counted at the store."""
    made: list[str] = []

    def counting(name: str) -> Any:
        method = getattr(store, name)

        async def call(*args: Any) -> Any:
            made.append(name)
            return await method(*args)

        return call

    for name in WRITES:
        if hasattr(store, name):
            setattr(store, name, counting(name))
    try:
        result = await runner.run(_flows.flow, _flows.ORDER)
    finally:
        for name in WRITES:
            store.__dict__.pop(name, None)
    return len(await store.history(result.run_id)), len(await store.calls(result.run_id)), len(made)


#: The two groups of cases, each interleaved on its own with its own baselines. The memory
#: figures are tens of microseconds: timed among the SQLite cases, whose commits and
#: threads disturb whatever runs next, they drown (an earlier run measured a negative
#: overhead there).
GROUPS = ("memory", "SQLite")


async def _setup(
    ctx: Context, stack: AsyncExitStack
) -> tuple[dict[str, dict[str, Any]], dict[str, tuple[str, int]], dict[str, Any], Callable[[], Awaitable[None]]]:
    """Build every case: (group -> cases, LangGraph case -> (baseline, checkpoints per run), rows, emptier)."""
    order, flow = _flows.ORDER, _flows.flow
    lg_async, lg_sync = _flows.graph(), _flows.sync_graph()
    cases: dict[str, Any] = {}
    lg: dict[str, tuple[str, int]] = {}
    rows: dict[str, Any] = {}

    plain = _flows.runner()
    no_cp, no_cp_sync = lg_async.compile(), lg_sync.compile()
    baselines = {
        "agentflow, no store": lambda: plain.run(flow, order),
        "LangGraph ainvoke, no checkpointer": lambda: no_cp.ainvoke(order),
    }
    memory = MemoryCheckpointStore()
    mem_runner = _flows.runner(memory)
    rows["agentflow memory"] = await _agentflow_rows(memory, mem_runner)
    saver = _langgraph.memory_saver()
    with_mem = lg_async.compile(checkpointer=saver)
    probe = _langgraph.config()
    await with_mem.ainvoke(order, probe)
    mem_cps = _langgraph.memory_checkpoints(saver, probe["configurable"]["thread_id"])
    lg["LangGraph InMemorySaver"] = ("LangGraph ainvoke, no checkpointer", mem_cps)
    lg["LangGraph InMemorySaver, durability=sync"] = ("LangGraph ainvoke, no checkpointer", mem_cps)
    rows["LangGraph InMemorySaver"] = (mem_cps, None)
    in_memory = {
        **baselines,
        "agentflow memory": lambda: mem_runner.run(flow, order),
        "LangGraph InMemorySaver": lambda: with_mem.ainvoke(order, _langgraph.config()),
        "LangGraph InMemorySaver, durability=sync": lambda: with_mem.ainvoke(
            order, _langgraph.config(), durability="sync"
        ),
    }

    cases |= baselines
    cases["LangGraph invoke, no checkpointer"] = lambda: no_cp_sync.invoke(order)
    for level in LEVELS:
        store = SQLiteCheckpointStore(ctx.tmp / f"agentflow-{level}.db", synchronous=level)  # type: ignore[arg-type]
        stack.push_async_callback(store.aclose)
        runner = _flows.runner(store, ctx.key)
        cases[f"agentflow SQLite {level}"] = lambda r=runner: r.run(flow, order)
        rows[f"agentflow SQLite {level}"] = await _agentflow_rows(store, runner)
        cases |= _commit_floor(ctx.tmp / f"floor-{level}.db", level, stack)

    for level in LEVELS:
        path = ctx.tmp / f"langgraph-async-{level}.db"
        graph = lg_async.compile(
            checkpointer=await stack.enter_async_context(_langgraph.async_sqlite_saver(path, level))
        )
        probe = _langgraph.config()
        await graph.ainvoke(order, probe)
        cps, writes = _langgraph.sqlite_rows(path, probe["configurable"]["thread_id"])
        rows[f"LangGraph AsyncSqliteSaver {level}"] = (cps, writes)
        cases[f"LangGraph AsyncSqliteSaver {level}"] = lambda g=graph: g.ainvoke(order, _langgraph.config())
        lg[f"LangGraph AsyncSqliteSaver {level}"] = ("LangGraph ainvoke, no checkpointer", cps)
        cases[f"LangGraph AsyncSqliteSaver {level}, durability=sync"] = lambda g=graph: g.ainvoke(
            order, _langgraph.config(), durability="sync"
        )
        lg[f"LangGraph AsyncSqliteSaver {level}, durability=sync"] = ("LangGraph ainvoke, no checkpointer", cps)
        sync_path = ctx.tmp / f"langgraph-sync-{level}.db"
        sync_saver, conn = _langgraph.sqlite_saver(sync_path, level)
        stack.callback(conn.close)
        sync_graph = lg_sync.compile(checkpointer=sync_saver)
        probe = _langgraph.config()
        sync_graph.invoke(order, probe)
        cps, writes = _langgraph.sqlite_rows(sync_path, probe["configurable"]["thread_id"])
        rows[f"LangGraph SqliteSaver {level}"] = (cps, writes)
        cases[f"LangGraph SqliteSaver {level} (invoke)"] = lambda g=sync_graph: g.invoke(order, _langgraph.config())
        lg[f"LangGraph SqliteSaver {level} (invoke)"] = ("LangGraph invoke, no checkpointer", cps)

    async def empty_memory() -> None:
        # Both in-memory stores start every block empty, so neither block's garbage collector
        # walks thousands of kept runs (which would grow with the block number).
        for row in await memory.list_runs(limit=sys.maxsize):
            await memory.delete(row.run_id)
        _langgraph.empty_memory_saver(saver)

    return {"memory": in_memory, "SQLite": cases}, lg, rows, empty_memory


def _overheads(times: dict[str, Series], lg: dict[str, tuple[str, int]]) -> dict[str, Series]:
    """Per-block overhead per unit (one group's times): per superstep for agentflow, per checkpoint for LangGraph."""
    out: dict[str, Series] = {}
    for name, series in times.items():
        if name.startswith("agentflow") and name != "agentflow, no store":
            out[name] = (series - times["agentflow, no store"]) / _flows.SUPERSTEPS
        elif name in lg:
            base, cps = lg[name]
            out[name] = (series - times[base]) / cps
    return out


def _pairs() -> list[tuple[str, str, list[str], list[str]]]:
    """(label, agentflow case, LangGraph cases the target takes the cheaper of, LangGraph cases shown besides)."""
    pairs = [("memory", "agentflow memory", ["LangGraph InMemorySaver"], ["LangGraph InMemorySaver, durability=sync"])]
    for level in LEVELS:
        target = [f"LangGraph AsyncSqliteSaver {level}", f"LangGraph SqliteSaver {level} (invoke)"]
        pairs.append((f"SQLite {level}", f"agentflow SQLite {level}", target, [f"{target[0]}, durability=sync"]))
    return pairs


async def run(ctx: Context) -> Report:
    report = Report("durability", TITLE)
    async with AsyncExitStack() as stack:
        groups, lg, rows, empty_memory = await _setup(ctx, stack)
        plans = {
            "memory": Plan(warmup=ctx.sized(100, 5), blocks=ctx.sized(7, 3), per_block=ctx.sized(200, 10)),
            "SQLite": Plan(warmup=ctx.sized(30, 5), blocks=ctx.sized(7, 3), per_block=ctx.sized(40, 10)),
        }
        by_group = {
            "memory": await interleave(groups["memory"], plans["memory"], between=empty_memory),
            "SQLite": await interleave(groups["SQLite"], plans["SQLite"]),
        }
    over = {**_overheads(by_group["memory"], lg), **_overheads(by_group["SQLite"], lg)}
    per_run = Table(
        "Time per run (median of 7 blocks per case, min..max; each group interleaved on its own: "
        f"memory {plans['memory'].per_block} runs per case and block, SQLite {plans['SQLite'].per_block})",
        ["group", "case", "per run", "rows written per run"],
    )
    for group in GROUPS:
        for name, series in by_group[group].items():
            found = rows.get(name.removesuffix(" (invoke)").removesuffix(", durability=sync"))
            shown = ""
            if found and name.startswith("agentflow"):
                shown = f"{found[0]} checkpoints + {found[1]} call records in {found[2]} writes"
            elif found:
                shown = f"{found[0]} checkpoints" + (f" + {found[1]} writes" if found[1] is not None else "")
            per_run.add(group, name, fmt_span(series), shown)
    times = by_group["SQLite"]
    table = Table(
        "Durability overhead: agentflow per superstep vs LangGraph per checkpoint (median, min..max over blocks)",
        ["store", "agentflow / superstep", "LangGraph case", "LangGraph / checkpoint", "ratio"],
    )
    for label, ours, candidates, extra in _pairs():
        strict = min(candidates, key=lambda n: over[n].median)
        ratio = over[ours].ratio(over[strict])
        for name in candidates + extra:
            table.add(label, fmt_span(over[ours]), name, fmt_span(over[name]), fmt_ratio(over[ours].ratio(over[name])))
        if over[ours].median > 0 and over[strict].median > 0:
            report.targets.append(
                Target(f"P1 {label} vs {strict}", ratio.median, LIMIT, fmt_ratio(ratio), f"<= {LIMIT}x")
            )
        else:  # a cost at or below zero is noise, not a measurement: never counted as met
            shown = "not measurable: an overhead at or below zero"
            report.targets.append(Target(f"P1 {label} vs {strict}", math.nan, LIMIT, shown, f"<= {LIMIT}x"))
    floor = Table(
        "What bounds agentflow's SQLite figure: one bare write transaction (BEGIN IMMEDIATE, INSERT of "
        f"{FLOOR_ROW_BYTES} B, COMMIT), run inline and on a worker thread, measured alongside",
        ["level", "floor", "one commit", "commits per superstep", "floor per superstep", "agentflow overhead / floor"],
    )
    for level in LEVELS:
        commits = rows[f"agentflow SQLite {level}"][2] / _flows.SUPERSTEPS
        overhead = over[f"agentflow SQLite {level}"]
        for way in FLOOR_WAYS:
            one = times[f"floor: one SQLite commit {level}, {way}"]
            per_step = one * commits
            floor.add(
                level, way, fmt_span(one), f"{commits:.2f}", fmt_span(per_step), fmt_ratio(overhead.ratio(per_step))
            )
    report.tables += [per_run, table, floor]
    report.data = {
        "plans": {g: p.__dict__ for g, p in plans.items()},
        "per_run_s": by_group,
        "overhead_s": over,
        "rows_per_run": rows,
    }
    return report
