"""A pydantic-ai agent step made durable: agentflow's `DurableAgent` against pydantic-ai's DBOS integration.

The agent is a plain pydantic-ai `Agent` whose model is a scripted `FunctionModel` (no
network): its reply asks for one call of a cheap tool (``lookup``, which returns a fixed
400-character text) until the history holds `stages` tool results, then it answers in text.
A *step* is one model request and the tool call it asks for; a run is `stages` steps and
the final request.

Cases, on the same agent:

- **pydantic-ai alone** (`Agent.run`, nothing stored): the baseline;
- **agentflow**: ``DurableAgent(agent, name=..., idempotent={"lookup"})`` run in this
  process with ``durable.runner(store, key).run(prompt)``, on the SQLite store (a file, FULL)
  and on SQLAlchemy + PostgreSQL (a table prefix of its own, dropped afterwards); and, in both
  groups, with no store, which separates the driver's own cost from the store's;
- **DBOS**: pydantic-ai's ``DBOSAgent`` wrapper (`pydantic_ai.durable_exec.dbos`) launched in
  this process on a DBOS system database in SQLite (a file) and in PostgreSQL (a schema of its
  own, dropped afterwards). As the integration ships, each model request is a DBOS step and a
  function tool runs inside the workflow, unrecorded; the case "tool as a DBOS step" wraps the
  tool in ``@DBOS.step``, as DBOS asks for a tool with side effects, so its result is journaled
  as agentflow journals it.

DBOS keeps one instance per process, pointed at one database, so the two databases are two
groups measured one after the other, each interleaved on its own (`bench._timing.interleave`)
with its own baseline. Overhead per step = (time per run with durability - time per run of
the baseline) / `stages`, block by block, so a run's fixed costs (the workflow row, the first
and last checkpoints) are spread over its steps. The ratio agentflow / DBOS is taken block by
block too. What a run writes is counted on a probe run of each case: agentflow's checkpoints
and call records as its store lists them; DBOS's rows of the workflow in every table of its
system database that has a ``workflow_uuid`` column.

When DBOS is not installed or does not launch, the agentflow cases are measured alone and
the report says why DBOS could not run.
"""

from __future__ import annotations

import sqlite3
import uuid
import warnings
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, AsyncExitStack, ExitStack, closing, contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agentflow.exec.checkpoints import SQLiteCheckpointStore
from agentflow.integrations.pydantic_ai import DurableAgent
from bench import _services
from bench._loop_agentflow import RESULT
from bench._report import Report, Table, Target
from bench._suite import Context
from bench._timing import Case, Plan, Series, fmt_ratio, fmt_span, interleave

TITLE = "A pydantic-ai agent step: agentflow's DurableAgent vs pydantic-ai's DBOS integration (SQLite, PostgreSQL)"
PROMPT = "Look up the orders of customer 42 and sum them."
ANSWER = "The orders come to 1,240 EUR."
TOOL = "lookup"
BASE = "pydantic-ai alone"
AF_BARE = "agentflow, no store"
#: database -> (agentflow's case, DBOS's case, DBOS's case with the tool as a step).
CASES: dict[str, tuple[str, str, str]] = {
    "SQLite": ("agentflow SQLite FULL", "DBOS SQLite", "DBOS SQLite, tool as a DBOS step"),
    "PostgreSQL": ("agentflow SQLAlchemy + PostgreSQL", "DBOS PostgreSQL", "DBOS PostgreSQL, tool as a DBOS step"),
}
#: The DBOS wrappers' names: the workflows and steps they register are named after them.
DBOS_NAME = "agent_step_bench"
DBOS_STEP_NAME = "agent_step_bench_tool_step"

Run = Callable[[], Awaitable[Any]]


def _reply(stages: int) -> Callable[[list[ModelMessage], AgentInfo], ModelResponse]:
    """The scripted model: a call of the tool until `stages` results are in, then the answer."""

    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        results = sum(
            isinstance(part, ToolReturnPart)
            for message in messages
            if isinstance(message, ModelRequest)
            for part in message.parts
        )
        if results < stages:
            call = ToolCallPart(TOOL, {"query": f"order {results + 1}"}, tool_call_id=f"call-{results + 1}")
            return ModelResponse(parts=[call])
        return ModelResponse(parts=[TextPart(ANSWER)])

    return reply


async def _lookup(query: str) -> str:
    """Look an order up (a fixed text; no I/O)."""
    return RESULT


def scripted_agent(name: str, stages: int, tool: Callable[[str], Awaitable[str]] = _lookup) -> Agent[None, str]:
    """The agent every case runs: the scripted model and one tool (`tool`, named ``lookup``)."""
    agent = Agent(FunctionModel(_reply(stages)), name=name)
    agent.tool_plain(name=TOOL)(tool)
    return agent


# -- agentflow -------------------------------------------------------------------------


async def _af_rows(durable: DurableAgent, store: Any, key: bytes) -> dict[str, int]:
    """One run on `store`: the checkpoints and call records it leaves."""
    result = await durable.runner(store, key).run(PROMPT)
    assert result.output == ANSWER, result
    return {
        "checkpoints": len(await store.history(result.run_id)),
        "call records": len(await store.calls(result.run_id)),
    }


def _af_run(durable: DurableAgent, store: Any, key: bytes | None) -> Run:
    runner = durable.runner(store, key)
    return lambda: runner.run(PROMPT)


# -- DBOS ------------------------------------------------------------------------------


@dataclass
class Dbos:
    """The two DBOS wrappers of the agent, built before any DBOS instance (their workflows register then)."""

    plain: Any
    """``DBOSAgent`` of the agent as written: model requests are steps, the tool is not."""
    stepped: Any
    """``DBOSAgent`` of the agent whose tool is a ``@DBOS.step``."""

    @classmethod
    def build(cls, stages: int) -> Dbos:
        from dbos import DBOS
        from pydantic_ai.durable_exec.dbos import DBOSAgent

        @DBOS.step(name=f"{DBOS_STEP_NAME}.{TOOL}")
        async def lookup(query: str) -> str:
            """Look an order up, journaled as a DBOS step."""
            return RESULT

        with warnings.catch_warnings():  # DBOSAgent is deprecated in favour of the DBOSDurability capability
            warnings.simplefilter("ignore")
            plain = DBOSAgent(scripted_agent("dbos_agent", stages), name=DBOS_NAME)
            stepped = DBOSAgent(scripted_agent("dbos_agent_tool_step", stages, lookup), name=DBOS_STEP_NAME)
        return cls(plain, stepped)

    @staticmethod
    @contextmanager
    def launched(url: str, schema: str | None = None) -> Iterator[None]:
        """DBOS launched in this process on the system database `url`; destroyed on exit."""
        from dbos import DBOS, DBOSConfig

        config: DBOSConfig = {"name": "agentflow_bench", "system_database_url": url, "log_level": "WARNING"}
        if schema is not None:
            config["dbos_system_schema"] = schema
        DBOS(config=config)
        try:
            DBOS.launch()
            yield
        finally:
            DBOS.destroy()

    @staticmethod
    async def run_as(agent: Any, workflow_id: str) -> None:
        from dbos import SetWorkflowID

        with SetWorkflowID(workflow_id):
            result = await agent.run(PROMPT)
        assert result.output == ANSWER, result


def _sqlite_rows(path: Path, workflow_id: str) -> dict[str, int]:
    """Rows of one workflow in every table of a DBOS SQLite system database that has a workflow_uuid."""
    out: dict[str, int] = {}
    with closing(sqlite3.connect(path)) as conn:
        tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in sorted(tables):
            columns = {row[1] for row in conn.execute(f'PRAGMA table_info("{table}")')}
            if "workflow_uuid" in columns:
                sql = f'SELECT count(*) FROM "{table}" WHERE workflow_uuid = ?'
                rows = int(conn.execute(sql, (workflow_id,)).fetchone()[0])
                if rows:
                    out[table] = rows
    return out


async def _pg_rows(url: str, schema: str, workflow_id: str) -> dict[str, int]:
    """The same on PostgreSQL, in DBOS's schema."""
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        tables = await conn.fetch(
            "SELECT table_name FROM information_schema.columns"
            " WHERE table_schema = $1 AND column_name = 'workflow_uuid'",
            schema,
        )
        out: dict[str, int] = {}
        for (table,) in sorted(tables):
            sql = f'SELECT count(*) FROM "{schema}"."{table}" WHERE workflow_uuid = $1'
            rows = await conn.fetchval(sql, workflow_id)
            if rows:
                out[table] = int(rows)
        return out
    finally:
        await conn.close()


async def _pg_drop_schema(url: str, schema: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


# -- measuring -------------------------------------------------------------------------


@dataclass
class Group:
    """One database's cases: agentflow's (always) and DBOS's (when it runs here)."""

    database: str
    cases: dict[str, Case]
    rows: dict[str, dict[str, int]]


def _dbos_run(agent: Any) -> Run:
    return lambda: agent.run(PROMPT)


async def _dbos_cases(group: Group, dbos: Dbos, count: Callable[[str], Awaitable[dict[str, int]]]) -> None:
    """Probe both DBOS wrappers once (rows per run), then add them to `group` (DBOS is launched)."""
    _, plain, stepped = CASES[group.database]
    for name, agent in ((plain, dbos.plain), (stepped, dbos.stepped)):
        workflow_id = f"bench-{uuid.uuid4().hex}"
        await Dbos.run_as(agent, workflow_id)
        group.rows[name] = await count(workflow_id)
        group.cases[name] = _dbos_run(agent)


async def _measure(
    group: Group,
    plan: Plan,
    dbos: Dbos | None,
    launch: Callable[[], AbstractContextManager[None]],
    count: Callable[[str], Awaitable[dict[str, int]]],
    report: Report,
) -> dict[str, Series]:
    """Launch DBOS for `group` and add its cases where it runs, then interleave every case of the group.

    A DBOS that does not launch, or fails its first runs, leaves the group to agentflow's
    cases, with the reason in the report's notes.
    """
    with ExitStack() as stack:
        if dbos is not None:
            try:
                stack.enter_context(launch())
                await _dbos_cases(group, dbos, count)
            except Exception as exc:
                stack.close()
                for name in CASES[group.database][1:]:
                    group.cases.pop(name, None)
                    group.rows.pop(name, None)
                report.notes.append(f"DBOS could not run on {group.database}: {type(exc).__name__}: {exc}")
        return await interleave(group.cases, plan)


def _overheads(times: dict[str, Series], stages: int) -> dict[str, Series]:
    return {name: (series - times[BASE]) / stages for name, series in times.items() if name != BASE}


def _shown_ratio(ours: Series, theirs: Series) -> str:
    if ours.median <= 0 or theirs.median <= 0:
        return "below the noise"
    return fmt_ratio(ours.ratio(theirs))


def _step_table(over: dict[str, dict[str, Series]], stages: int) -> Table:
    table = Table(
        f"Durability overhead per model-and-tool step ({stages} steps per run; median, min..max over blocks)",
        ["database", "agentflow / step", "agentflow with no store / step", "DBOS / step", "agentflow / DBOS",
         "DBOS, tool as a step / step", "agentflow / DBOS, tool as a step"],
    )  # fmt: skip
    for database, (ours, plain, stepped) in CASES.items():
        got = over.get(database, {})
        if ours not in got:
            continue
        cells = [database, fmt_span(got[ours]), fmt_span(got[AF_BARE])]
        if plain in got:
            cells += [fmt_span(got[plain]), f"**{_shown_ratio(got[ours], got[plain])}**"]
            cells += [fmt_span(got[stepped]), _shown_ratio(got[ours], got[stepped])]
        else:
            cells += ["did not run", "", "did not run", ""]
        table.add(*cells)
    return table


def _rows_table(rows: dict[str, dict[str, int]], stages: int) -> Table:
    table = Table(
        f"What one run writes ({stages} steps and the answer; a probe run of each case)",
        ["case", "rows per run", "rows per step", "by kind"],
    )
    for name, kinds in rows.items():
        total = sum(kinds.values())
        by_kind = ", ".join(f"{n} {kind}" for kind, n in kinds.items())
        table.add(name, total, f"{total / stages:.1f}", by_kind)
    return table


def _targets(over: dict[str, dict[str, Series]]) -> list[Target]:
    out = []
    for database, (ours, plain, _) in CASES.items():
        got = over.get(database, {})
        if ours in got and plain in got:
            ratio = got[ours].ratio(got[plain])
            out.append(
                Target(
                    f"agent step {database}",
                    ratio.median if got[plain].median > 0 else float("nan"),
                    1.0,
                    f"{fmt_ratio(ratio)}: {fmt_span(got[ours])} vs {fmt_span(got[plain])} per step",
                    "agentflow per step <= DBOS per step",
                )
            )
    return out


def _sqlite_settings(path: Path) -> str:
    """The journal mode of DBOS's SQLite file, and the ``synchronous`` of a connection that sets none (as DBOS's)."""
    with closing(sqlite3.connect(path)) as conn:
        journal = conn.execute("PRAGMA journal_mode").fetchone()[0]
        synchronous = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}[conn.execute("PRAGMA synchronous").fetchone()[0]]
    return f"journal_mode={journal}, synchronous={synchronous}"


def _versions() -> dict[str, str]:
    out = {}
    for name in ("pydantic-ai-slim", "dbos"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


async def run(ctx: Context) -> Report:
    report = Report("agent_step", TITLE)
    svc = ctx.services
    stages = ctx.sized(10, 3)
    plan = Plan(warmup=ctx.sized(3, 2), blocks=ctx.sized(7, 3), per_block=ctx.sized(8, 3))
    plain = scripted_agent("plain_agent", stages)
    durable = DurableAgent(scripted_agent("agentflow_agent", stages), name="agent_step", idempotent={TOOL})
    dbos: Dbos | None = None
    try:
        dbos = Dbos.build(stages)
    except ImportError as exc:
        report.notes.append(f"DBOS could not run: {exc} (the bench extra installs dbos)")
    times: dict[str, dict[str, Series]] = {}
    rows: dict[str, dict[str, int]] = {}
    async with AsyncExitStack() as stack:
        # SQLite: agentflow's store (FULL, WAL) and DBOS's system database, each a file of its own.
        store = SQLiteCheckpointStore(ctx.tmp / "agentflow.db", synchronous="FULL")
        stack.push_async_callback(store.aclose)
        ours, _, _ = CASES["SQLite"]
        rows[ours] = await _af_rows(durable, store, ctx.key)
        group = Group("SQLite", {BASE: lambda: plain.run(PROMPT)}, rows)
        group.cases[AF_BARE] = _af_run(durable, None, None)
        group.cases[ours] = _af_run(durable, store, ctx.key)
        dbos_file = ctx.tmp / "dbos.sqlite"

        async def sqlite_count(workflow_id: str) -> dict[str, int]:
            return _sqlite_rows(dbos_file, workflow_id)

        times["SQLite"] = await _measure(
            group, plan, dbos, lambda: Dbos.launched(f"sqlite:///{dbos_file}"), sqlite_count, report
        )
        if CASES["SQLite"][1] in times["SQLite"]:
            report.notes.append(
                f"DBOS's SQLite system database: {_sqlite_settings(dbos_file)} (DBOS sets neither; SQLite's "
                "defaults); agentflow's SQLite store: journal_mode=wal, synchronous=FULL"
            )
        if svc.pg_url:
            pg_url = svc.pg_url
            pg = await stack.enter_async_context(_services.sqlalchemy_pg_store(pg_url, f"{ctx.tag}_"))
            ours, _, _ = CASES["PostgreSQL"]
            rows[ours] = await _af_rows(durable, pg, ctx.key)
            group = Group("PostgreSQL", {BASE: lambda: plain.run(PROMPT)}, rows)
            group.cases[AF_BARE] = _af_run(durable, None, None)
            group.cases[ours] = _af_run(durable, pg, ctx.key)
            schema = f"{ctx.tag}_dbos"

            async def pg_count(workflow_id: str) -> dict[str, int]:
                return await _pg_rows(pg_url, schema, workflow_id)

            try:
                times["PostgreSQL"] = await _measure(
                    group, plan, dbos, lambda: Dbos.launched(pg_url, schema), pg_count, report
                )
            finally:
                await _pg_drop_schema(pg_url, schema)
        else:
            report.notes.append(f"PostgreSQL skipped: {svc.pg_why}")
    over = {database: _overheads(series, stages) for database, series in times.items()}
    per_run = Table(
        f"Time per run ({stages} steps and the answer; median of {plan.blocks} blocks of {plan.per_block} runs "
        "per case, min..max; each database interleaved on its own)",
        ["database", "case", "per run", "overhead per step"],
    )
    for database, series in times.items():
        for name, s in series.items():
            shown = fmt_span(over[database][name]) if name in over[database] else "(baseline)"
            per_run.add(database, name, fmt_span(s), shown)
    report.tables += [per_run, _step_table(over, stages), _rows_table(rows, stages)]
    report.targets += _targets(over)
    versions = _versions()
    if any(CASES[database][1] in series for database, series in times.items()):
        report.notes.append(
            f"DBOS {versions['dbos']}, pydantic-ai-slim {versions['pydantic-ai-slim']}: DBOSAgent is deprecated "
            "there in favour of the DBOSDurability capability, which makes the same model requests DBOS steps "
            "and leaves function tools unrecorded too"
        )
    report.data |= {"stages": stages, "plan": plan.__dict__, "versions": versions, "cases": CASES}
    report.data |= {"per_run_s": times, "overhead_per_step_s": over, "rows_per_run": rows}
    return report
